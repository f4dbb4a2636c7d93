# Issue 31 on a 2-GPU (or 4-GPU) machine: does the asynchronous DQN learner keep learning under
# load? Breakout-MinAtar DQN preset, 256 environments per collector process.
#   1. the learner's ceiling: a learner on GPU 0 whose rate limiter never binds
#      (--samples-per-insert 1e9) on an always-full replay: it starts learning once one collector
#      has filled its whole replay (--learning-starts = the preset's --buffer-size), the collector
#      then held back. (Before 2026-11-29's last call, it started at the preset's 50k, with the
#      replay a fifth full: random samples from a smaller replay are cheaper, so that ceiling was
#      too high.);
#   2. the learner on GPU 0 with 1, 2 and 3 collectors (on GPU 1, or GPUs 1-3 on 4 GPUs) at the
#      default samples per insert: gradient steps/s (target >= 90% of 1.), received env steps/s,
#      achieved samples per insert, waits and the learner's ingest fraction, from metrics.jsonl
#      (rates over the last two thirds of the rows: differences of counts over their time).
# Run from the repo root:  bash experiments/gpu/run.sh async_rate
# COLLECTORS=cpu runs the collectors on the host's CPU (JAX_PLATFORMS=cpu) and only the learner on
# GPU 0: a one-GPU stand-in that loads the learner as collectors on other GPUs do. On a one-GPU
# machine GPU collectors share GPU 0 with the learner (memory: the learner 0.35, each collector
# 0.1); compare those cases with the LOADED=1 ceiling, whose GPU is as shared.
# LEARNER_CPUS=0-3 COLLECTOR_CPUS=4-15 pins them to host cores (taskset), so that collectors on
# the CPU do not take the learner's host thread's cores. PROFILE=U has each learner write a
# jax.profiler trace of two log intervals after iteration U (train --profile --profile-from U) to
# $OUT/trace_<case>, for experiments/gpu/trace_summary.py.
# LEARNER_ARGS and COLLECTOR_ARGS add options to one side (e.g. --store-workers 3).
# LEARNER_SWITCH_S=0.0005 sets the learner's GIL switch interval (Python's default is 0.005 s).
# PYSPY=S attaches py-spy (fetch-wheels.sh py-spy) to each learner S seconds after its start for
# 20 s, its decoder processes included: collapsed stacks per thread, idle ones included, in
# $OUT/pyspy_<case>.txt, for experiments/gpu/pyspy_summary.py.
# LOADED=1 adds the ceiling with the host loaded by as many collectors as the largest case
# (writing into a sink nobody reads): what the learner's host thread loses to the collectors'
# use of the host, apart from what taking in their data costs.
# CEILING=0 skips the ceiling (compare only with a ceiling from the same call, or the same code).
# DRY=1 runs the same commands at toy sizes on a CPU machine (GPU pinning off).
source experiments/gpu/setup.sh
set -o pipefail
T=${T_RATE:-75}; SIZE=""
if [ "${DRY:-0}" = 1 ]; then
  T=40; SIZE="--total-timesteps 4096000 --learning-starts 2048 --buffer-size 16384 --log-every 5 --checkpoint-every 5 --num-envs 16"
fi
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
gpu() { if [ "${DRY:-0}" = 1 ]; then env -u CUDA_VISIBLE_DEVICES "${@:2}"; else CUDA_VISIBLE_DEVICES=$1 "${@:2}"; fi; }
collector_gpu() { if [ "$GPUS" -ge 4 ]; then echo $1; elif [ "$GPUS" -ge 2 ]; then echo 1; else echo 0; fi; }  # GPU i, GPU 1, or GPU 0
# the collectors' share of their GPU's memory (several on one GPU share it; with the learner on one GPU)
collector_mem() { python3 -c "print(0.75 if $GPUS >= 4 else round(0.9 / $1, 2) if $GPUS >= 2 else 0.1)"; }
LEARNER_MEM=$([ "$GPUS" -ge 2 ] || echo 0.35)
collector() {  # $1: collector number, rest: the command
  if [ "${COLLECTORS:-gpu}" = cpu ]; then JAX_PLATFORMS=cpu "${@:2}"; else gpu $(collector_gpu $1) "${@:2}"; fi
}
R=$(mktemp -d /tmp/runs.XXXX)
Q="--config breakout-minatar-dqn --num-envs 256 --log-every 5 --checkpoint-every 20 $SIZE"

split() {  # $1 collectors, $2 name, rest: learner options
  local n=$1 name=$2 run=$R/$2; shift 2
  local switch=()  # LEARNER_SWITCH_S: the learner's GIL switch interval (experiments/gpu/switchinterval)
  [ -n "${LEARNER_SWITCH_S:-}" ] && switch=(env SWITCH_INTERVAL_S=$LEARNER_SWITCH_S PYTHONPATH=$PWD/experiments/gpu/switchinterval:$PYTHONPATH)
  gpu 0 ${LEARNER_MEM:+env XLA_PYTHON_CLIENT_MEM_FRACTION=$LEARNER_MEM} ${LEARNER_CPUS:+taskset -c $LEARNER_CPUS} "${switch[@]}" timeout $T python3 -m jaxrl_mgpu.train $Q --run-dir $run --mode learn \
      ${PROFILE:+--profile $OUT/trace_$name --profile-from $PROFILE} ${LEARNER_ARGS:-} "$@" > $OUT/rate_${name}_learner.log 2>&1 &
  local pids=($!)
  if [ -n "${PYSPY:-}" ]; then
    (sleep $PYSPY; pid=$(pgrep -f "^[^ ]*python3 -m jaxrl_mgpu.train .*--run-dir $run --mode learn" | head -1)
     $(command -v py-spy || echo /tmp/site/bin/py-spy) record --pid $pid --duration 20 --nonblocking --idle --threads --subprocesses \
        --rate 100 --format raw -o $OUT/pyspy_$name.txt > $OUT/pyspy_$name.log 2>&1) &
  fi
  for c in $(seq 1 $n); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$(collector_mem $n) \
    collector $c ${COLLECTOR_CPUS:+taskset -c $COLLECTOR_CPUS} timeout $((T - 2)) python3 -m jaxrl_mgpu.train $Q --run-dir $run --mode collect \
        --collector-id c$c --collect-before-checkpoint random ${COLLECTOR_ARGS:-} > $OUT/rate_${name}_c$c.log 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  cp $run/metrics.jsonl $OUT/rate_${name}_metrics.jsonl 2>/dev/null
  python3 - "$OUT/rate_${name}_metrics.jsonl" "$name" <<'PY' | tee -a $OUT/rate_summary.txt
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if os.path.exists(sys.argv[1]) else []
rows = [r for r in rows if "grad_steps" in r]
steady = rows[len(rows) // 3:]  # after the start-up third
if len(steady) < 2:
    print(sys.argv[2], "no rows"); sys.exit()
# Rates over the whole window (counts' differences over its time), not means of per-row rates:
# rows are of unequal length, and a row in which the learner only waited has no rate at all.
first, last = steady[0], steady[-1]
span = last["time"] - first["time"]
rate = lambda k: ((last.get(k) or 0) - (first.get(k) or 0)) / span
waited = sum(r.get("async/learner_wait_s") or 0 for r in steady[1:])
collector_wait = sum(r.get("async/collector_wait_s") or 0 for r in steady[1:])
why = {w: sum(r.get(f"async/collector_wait_s/{w}") or 0 for r in steady[1:]) for w in ("start", "reading", "samples")}
ingest = sum(r.get("async/ingest_fraction") or 0 for r in steady[1:]) / (len(steady) - 1)
decode = [r["async/decode_s_per_shard"] for r in steady[1:] if r.get("async/decode_s_per_shard")]
mean = lambda k: (lambda v: sum(v) / len(v) if v else float("nan"))([r[k] for r in steady if r.get(k) is not None])
print(f"{sys.argv[2]}: {rate('grad_steps'):.0f} grad steps/s, {rate('async/env_steps_received'):.0f} env steps/s received "
      f"over {span:.1f} s; samples/insert {last['async/samples_per_insert']:.2f} (target "
      f"{last['async/samples_per_insert_target']:g}); the learner waited {waited / span:.0%} of the time, "
      f"collectors {collector_wait:.1f} s ({', '.join(f'{w} {t:.1f}' for w, t in why.items())}); ingest fraction {ingest:.3f}; "
      f"decode {sum(decode) / max(len(decode), 1):.2f} s per shard; queued {last['async/queued_transitions']}, unread {last.get('async/unread_transitions')}, "
      f"return {last.get('episode_return')}; policy lag {mean('async/policy_lag'):.1f} on arrival, "
      f"{mean('async/policy_lag_inserted'):.1f} inserted (iterations); {mean('async/iterations_per_chunk'):.2f} "
      f"iterations per chunk, {mean('async/between_chunks_fraction'):.0%} of the time between chunks; latency (ms) "
      + ", ".join(f"{s} {1e3 * mean(f'async/latency_s/{s}'):.0f}" for s in ("params", "rollout", "write", "read", "insert")))
PY
}

FULL=524288; [ "${DRY:-0}" = 1 ] && FULL=16384  # the replay's capacity (the preset's --buffer-size; DRY's)
[ "${CEILING:-1}" = 1 ] && split 1 ceiling --samples-per-insert 1e9 --learning-starts $FULL
if [ "${LOADED:-0}" = 1 ]; then
  # The ceiling with the host as loaded as in the largest case: that many collectors write into a
  # sink run directory whose shards are deleted as they land (no learner reads them), so the
  # learner's host shares memory bandwidth and caches with the same work but takes in nothing.
  n=$(echo ${CASES:-1 2 3} | tr ' ' '\n' | sort -n | tail -1); sink=$R/sink; mkdir -p $sink/store; loads=()
  for c in $(seq 1 $n); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$(collector_mem $n) \
    collector $c ${COLLECTOR_CPUS:+taskset -c $COLLECTOR_CPUS} timeout $((T + 5)) python3 -m jaxrl_mgpu.train $Q --run-dir $sink --mode collect \
        --collector-id load$c --collect-before-checkpoint random ${COLLECTOR_ARGS:-} > $OUT/rate_load_c$c.log 2>&1 &
    loads+=($!)
  done
  (while sleep 0.5; do rm -rf $sink/store/[0-9]*; done) & sinker=$!
  sleep 10  # the collectors compile and start
  split 1 ceiling_loaded --samples-per-insert 1e9 --learning-starts $FULL
  kill $sinker; wait "${loads[@]}"
  grep -h "env steps in all" $OUT/rate_load_c*.log | tail -${n} | tee -a $OUT/rate_summary.txt
fi
# CASES picks the collector counts; SPI="16 32" (say) runs each at those targets instead of the default
for n in ${CASES:-1 2 3}; do
  for spi in ${SPI:-default}; do
    if [ $spi = default ]; then split $n collectors$n; else split $n collectors${n}_spi$spi --samples-per-insert $spi; fi
  done
done
cat $OUT/rate_summary.txt
