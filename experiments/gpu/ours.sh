# Sourced by the GPU scripts that run this project's trainer against another one (brax_ppo.sh,
# craftax.sh): `ours NAME FLAGS...` runs `python -m jaxrl_mgpu.train --config $PRESET` under
# `timeout $T` with run directory /tmp/runs/NAME and appends one JSON line to $OUT/ours.jsonl:
# its evaluation curve, wall time, the time before its first training step, and its env steps
# per second (overall and "steady": the median of the log rows that hold no evaluation).
# RESUME=1 adds --resume auto: a run longer than one device call goes on in the next call (the
# time limit's SIGTERM saves a checkpoint; the machine must still be warm, /tmp/runs is on it).
# CARRY_RUNS=DIR (a folder of the checkout that .git/info/exclude ignores, named in the call's
# carry) lets a run outlive the device machine, across calls and sessions: before the run, its
# parts DIR/NAME.tgz.00, .01, ... are unpacked into /tmp/runs (unless the run is there already);
# after it, the run directory is packed into $OUT/NAME.tgz.00, ... (15 MiB parts: what a call
# brings back), to be copied into DIR here for the next call. (A craftax-classic run: about 35 MB.)
# Reads PRESET, T, OUT, and optionally STEPS, EVAL_EVERY, RESUME, CARRY_RUNS.
steps_flag=${STEPS:+--total-timesteps $STEPS}
ours() {  # ours NAME FLAGS...: one run of this project, timed from the process's start
  local name=$1; shift
  if [ -n "${CARRY_RUNS:-}" ] && [ ! -d /tmp/runs/$name ] && ls $CARRY_RUNS/$name.tgz.* > /dev/null 2>&1; then
    mkdir -p /tmp/runs && cat $CARRY_RUNS/$name.tgz.* | tar -xz -C /tmp/runs || { echo "cannot unpack $name" >&2; return 1; }
  fi
  local start=$(date +%s.%N)
  timeout $T python3 -m jaxrl_mgpu.train --config $PRESET --run-dir /tmp/runs/$name --eval-every ${EVAL_EVERY:-50} \
      --eval-episodes 128 --checkpoint-every 0 ${RESUME:+--resume auto} $steps_flag "$@" > $OUT/$name.log 2>&1
  local code=$?
  python3 - /tmp/runs/$name "$start" "$(date +%s.%N)" "$code" "$*${RESUME:+ (--resume auto: the part run in this call)}" "$PRESET" >> $OUT/ours.jsonl <<'EOF'
import json, statistics, sys
run, start, end, code, flags, preset = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
try:
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
except FileNotFoundError:  # it stopped before its first log row (a bad option: its log says why)
    print(json.dumps({"impl": "jaxrl_mgpu", "flags": flags, "exit": code, "env_steps": 0, "wall_s": round(end - start, 1),
                      "no_log_rows": True}))
    sys.exit()
try:
    summary = json.load(open(run + "/summary.json"))
except FileNotFoundError:  # cut off by the time limit: the curve so far, no timing split
    summary = {"startup": {}, "time_s": end - start}
evals = [(r["env_steps"], r["eval/episode_return"], r.get("time")) for r in rows if r.get("eval/episode_return") is not None]
before_first = sum(summary["startup"].get(k, 0) for k in ("imports_and_devices_s", "setup_s", "compile_s"))
print(json.dumps({"impl": "jaxrl_mgpu", "preset": preset, "flags": flags, "exit": code, "env_steps": rows[-1]["env_steps"],
                  "final_eval_return": evals[-1][1] if evals else None,
                  "final_train_return": rows[-1].get("episode_return"), "wall_s": round(end - start, 1),
                  "before_first_step_s": round(before_first, 1), "train_s": round(end - start - before_first, 1),
                  "env_steps_per_s": round(rows[-1]["env_steps"] / summary["time_s"]),
                  # the median of the log rows that hold no evaluation (right after a resume too)
                  "steady_env_steps_per_s": round(statistics.median(
                      [r["sps"] for r in rows if r.get("eval/episode_return") is None] or [0])), "curve": evals,
                  # the environment's episode metrics (Craftax's achievements) of the last row that has them
                  "env_metrics": next(({k: v for k, v in r.items() if k.startswith("env/")} for r in reversed(rows)
                                       if r.get("episodes")), {})}))
EOF
  if [ -n "${CARRY_RUNS:-}" ] && [ -d /tmp/runs/$name ]; then
    tar -cz -C /tmp/runs $name | split -b 15M -d - $OUT/$name.tgz. && du -ch $OUT/$name.tgz.* | tail -1
  fi
}

table() {  # the runs of anchor.jsonl and ours.jsonl under $OUT, one line each
python3 - $OUT <<'EOF'
import json, sys, os
out = sys.argv[1]
for name in ("anchor.jsonl", "ours.jsonl"):
    path = os.path.join(out, name)
    for line in open(path) if os.path.exists(path) else []:
        if not line.startswith("{"):  # mujoco and ppo.py print other lines to stdout
            continue
        r = json.loads(line)
        print(f"{r['impl']:>17} {r.get('seed', r.get('flags', '')):>12}  steps {r['env_steps']:>13,}  "
              f"eval {r.get('final_eval_return')}  train return {r.get('final_train_return')}  wall {r['wall_s']} s  "
              f"before first step {r.get('before_first_step_s', r.get('before_first_update_s'))} s  "
              f"steady {r.get('steady_env_steps_per_s')} steps/s")
EOF
}
