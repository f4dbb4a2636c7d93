# Issue 31 on a 2-GPU (or 4-GPU) machine: does the asynchronous DQN learner keep learning under
# load? Breakout-MinAtar DQN preset, 256 environments per collector process.
#   1. the learner's ceiling: a learner on GPU 0 whose rate limiter never binds
#      (--samples-per-insert 1e9) on a store that one collector keeps filling;
#   2. the learner on GPU 0 with 1, 2 and 3 collectors (on GPU 1, or GPUs 1-3 on 4 GPUs) at the
#      default samples per insert: gradient steps/s (target >= 90% of 1.), received env steps/s,
#      achieved samples per insert, waits and the learner's ingest fraction, from metrics.jsonl.
# Run from the repo root:  bash experiments/gpu/run.sh async_rate
# DRY=1 runs the same commands at toy sizes on a CPU machine (GPU pinning off).
source experiments/gpu/setup.sh
set -o pipefail
T=${T_RATE:-75}; SIZE=""
if [ "${DRY:-0}" = 1 ]; then
  T=40; SIZE="--total-timesteps 4096000 --learning-starts 2048 --buffer-size 16384 --log-every 5 --checkpoint-every 5 --num-envs 16"
fi
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
gpu() { if [ "${DRY:-0}" = 1 ]; then env -u CUDA_VISIBLE_DEVICES "${@:2}"; else CUDA_VISIBLE_DEVICES=$1 "${@:2}"; fi; }
collector_gpu() { if [ "$GPUS" -ge 4 ]; then echo $1; else echo 1; fi; }  # collector i: GPU i, or all on GPU 1
R=$(mktemp -d /tmp/runs.XXXX)
Q="--config breakout-minatar-dqn --num-envs 256 --log-every 5 --checkpoint-every 20 $SIZE"

split() {  # $1 collectors, $2 name, rest: learner options
  local n=$1 name=$2 run=$R/$2; shift 2
  gpu 0 timeout $T python3 -m jaxrl_mgpu.train $Q --run-dir $run --mode learn "$@" > $OUT/rate_${name}_learner.log 2>&1 &
  local pids=($!)
  for c in $(seq 1 $n); do
    # several collectors on one GPU share its memory
    XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $n, 2) if $GPUS < 4 else 0.75)") \
    gpu $(collector_gpu $c) timeout $((T - 2)) python3 -m jaxrl_mgpu.train $Q --run-dir $run --mode collect \
        --collector-id c$c --collect-before-checkpoint random > $OUT/rate_${name}_c$c.log 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  cp $run/metrics.jsonl $OUT/rate_${name}_metrics.jsonl 2>/dev/null
  python3 - "$OUT/rate_${name}_metrics.jsonl" "$name" <<'PY' | tee -a $OUT/rate_summary.txt
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
rows = [r for r in rows if r.get("grad_steps_per_s")]
steady = rows[len(rows) // 3:]  # after the start-up third
if not steady:
    print(sys.argv[2], "no rows"); sys.exit()
mean = lambda k: sum(r.get(k) or 0 for r in steady) / len(steady)
last = steady[-1]
print(f"{sys.argv[2]}: grad_steps/s {mean('grad_steps_per_s'):.0f}, received env steps/s {mean('sps'):.0f}, "
      f"samples/insert {last['async/samples_per_insert']} (target {last['async/samples_per_insert_target']}), "
      f"learner wait {mean('async/learner_wait_s'):.2f}s/row, collector wait {mean('async/collector_wait_s'):.2f}s/row, "
      f"ingest fraction {mean('async/ingest_fraction'):.3f}, decode {mean('async/decode_s_per_shard'):.2f}s/shard, "
      f"queued {last['async/queued_transitions']}, return {last.get('episode_return')}")
PY
}

split 1 ceiling --samples-per-insert 1e9
for n in 1 2 3; do split $n collectors$n; done
cat $OUT/rate_summary.txt
