# Issue 50: PPO on a Brax task, this project's (`--config brax-TASK`) against Brax's own trainer
# with its published configuration (brax_anchor.py), side by side on one GPU, one seed after the
# other; then, with SEEDS_IN_ONE set, this project's seeds in one program (--num-seeds).
# Needs the Brax wheels (../shared/gpu/fetch-wheels.sh --brax). Run from the repo root:
#   TASK=ant SEEDS="0" bash experiments/gpu/brax_ppo.sh
#   TASK=ant STEPS=5000000 bash experiments/gpu/brax_ppo.sh        # a shorter run: throughput
#   TASK=ant SEEDS_IN_ONE=3 ANCHOR=0 bash experiments/gpu/brax_ppo.sh
#   TASK=dmc:CheetahRun PRESET=dmc-cheetah-run T=590 bash experiments/gpu/brax_ppo.sh   # Playground's trainer
#   ANCHOR=0 RESUME=1 TASK=dmc:HumanoidWalk PRESET=dmc-humanoid-walk T=585 bash ...     # again in the next call:
#       a run longer than one call (the time limit's SIGTERM saves a checkpoint) goes on where it stopped
# Prints one JSON line per run (ours.jsonl, anchor.jsonl under $OUT) and a table.
source experiments/gpu/setup.sh
TASK=${TASK:-ant}; PRESET=${PRESET:-brax-$TASK}; SEEDS=${SEEDS:-0}; T=${T:-290}; ANCHOR=${ANCHOR:-1}
NAME=${TASK#*:}
steps_flag=${STEPS:+--total-timesteps $STEPS}
ours() {  # ours NAME FLAGS...: one run of this project, timed from the process's start
  local name=$1; shift
  local start=$(date +%s.%N)
  timeout $T python3 -m jaxrl_mgpu.train --config $PRESET --run-dir /tmp/runs/$name --eval-every ${EVAL_EVERY:-50} \
      --eval-episodes 128 --checkpoint-every 0 ${RESUME:+--resume auto} $steps_flag "$@" > $OUT/$name.log 2>&1
  local code=$?
  python3 - /tmp/runs/$name "$start" "$(date +%s.%N)" "$code" "$*${RESUME:+ (--resume auto: the part run in this call)}" >> $OUT/ours.jsonl <<'EOF'
import json, statistics, sys
run, start, end, code, flags = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
try:
    summary = json.load(open(run + "/summary.json"))
except FileNotFoundError:  # cut off by the time limit: the curve so far, no timing split
    summary = {"startup": {}, "time_s": end - start}
evals = [(r["env_steps"], r["eval/episode_return"], r.get("time")) for r in rows if r.get("eval/episode_return") is not None]
before_first = sum(summary["startup"].get(k, 0) for k in ("imports_and_devices_s", "setup_s", "compile_s"))
print(json.dumps({"impl": "jaxrl_mgpu", "flags": flags, "exit": code, "env_steps": rows[-1]["env_steps"],
                  "final_eval_return": evals[-1][1] if evals else None,
                  "final_train_return": rows[-1].get("episode_return"), "wall_s": round(end - start, 1),
                  "before_first_step_s": round(before_first, 1), "train_s": round(end - start - before_first, 1),
                  "env_steps_per_s": round(rows[-1]["env_steps"] / summary["time_s"]),
                  # the median of the log rows that hold no evaluation (right after a resume too)
                  "steady_env_steps_per_s": round(statistics.median(
                      [r["sps"] for r in rows if r.get("eval/episode_return") is None] or [0])), "curve": evals}))
EOF
}
for seed in $SEEDS; do
  if [ "$ANCHOR" = 1 ]; then
    timeout $T python3 experiments/gpu/brax_anchor.py $TASK --seeds $seed ${STEPS:+--timesteps $STEPS} \
        >> $OUT/anchor.jsonl 2>> $OUT/anchor.err || echo "anchor seed $seed: exit $?" >> $OUT/anchor.err
  fi
  ours ours-$NAME-$seed --seed $seed
done
if [ -n "${SEEDS_IN_ONE:-}" ]; then  # many runs take no --eval-every: evaluated after, every run
  ours ours-$NAME-seeds$SEEDS_IN_ONE --num-seeds $SEEDS_IN_ONE --eval-every 0
  timeout 120 python3 -m jaxrl_mgpu.evaluate --run-dir /tmp/runs/ours-$NAME-seeds$SEEDS_IN_ONE --episodes 128 \
      > $OUT/seeds_eval.jsonl 2>> $OUT/anchor.err
fi
python3 - $OUT <<'EOF'
import json, sys, os
out = sys.argv[1]
for name in ("anchor.jsonl", "ours.jsonl"):
    path = os.path.join(out, name)
    for line in open(path) if os.path.exists(path) else []:
        if not line.startswith("{"):  # mujoco prints what it failed to import to stdout
            continue
        r = json.loads(line)
        print(f"{r['impl']:>10} {r.get('seed', r.get('flags', '')):>12}  steps {r['env_steps']:>11,}  "
              f"eval {r['final_eval_return']}  wall {r['wall_s']} s  before first step {r['before_first_step_s']} s  "
              f"train {r['train_s']} s  {r['env_steps_per_s']:,} steps/s")
EOF
