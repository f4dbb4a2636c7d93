# Issue 31 on a 2-GPU machine: does an asynchronous run reach the return of `--mode both` at the
# same number of env steps? Breakout-MinAtar DQN preset with 256 environments per process,
# STEPS env steps (default 3M), SEEDS (default "1 2 3", consecutive) of each:
#   both:  `--mode both --num-seeds K` on GPU 0 (K runs in one program);
#   async: per seed, a learner on GPU 0 and COLLECTORS (default 3) collectors on GPU 1 (on the
#          CPU with COLLECTORS_ON=cpu, pinned to COLLECTOR_CPUS if given), the
#          learner stopping at the same STEPS (its iterations at the default samples per insert);
# then each final checkpoint's greedy return over 256 episodes (evaluate --greedy), and each run's
# last training rows. Run from the repo root:  bash experiments/gpu/run.sh async_returns
# DRY=1 runs the same commands at toy sizes on a CPU machine (GPU pinning off).
source experiments/gpu/setup.sh
set -o pipefail
STEPS=${STEPS:-3000000}; N=${COLLECTORS:-3}; T=${T_RUN:-240}; SIZE=""; EPISODES=256
if [ "${DRY:-0}" = 1 ]; then
  STEPS=65536; T=120; EPISODES=8
  SIZE="--learning-starts 2048 --buffer-size 16384 --log-every 5 --checkpoint-every 5 --num-envs 16 --eps-decay-steps 20000"
fi
gpu() { if [ "${DRY:-0}" = 1 ]; then env -u CUDA_VISIBLE_DEVICES "${@:2}"; else CUDA_VISIBLE_DEVICES=$1 "${@:2}"; fi; }
collector() {  # COLLECTORS_ON=cpu: on the host's CPU (a one-GPU machine), else on GPU 1
  if [ "${COLLECTORS_ON:-gpu}" = cpu ]; then JAX_PLATFORMS=cpu ${COLLECTOR_CPUS:+taskset -c $COLLECTOR_CPUS} "$@"; else gpu 1 "$@"; fi
}
SEEDS=(${SEEDS:-1 2 3})
R=$(mktemp -d /tmp/runs.XXXX)
Q="--config breakout-minatar-dqn --num-envs 256 --total-timesteps $STEPS --log-every 10 $SIZE"
A="--checkpoint-every 20 ${ASYNC_ARGS:-}"  # ASYNC_ARGS: options of the asynchronous runs (e.g. --shard-steps 32)

if [ "${BOTH:-1}" = 1 ]; then  # BOTH=0: only the asynchronous runs (after a call that ran these)
  gpu 0 timeout $T python3 -m jaxrl_mgpu.train $Q --num-seeds ${#SEEDS[@]} --seed ${SEEDS[0]} --run-dir $R/both > $OUT/returns_both.log 2>&1
  echo "both exit $?" >> $OUT/returns_phases.txt
  for i in "${!SEEDS[@]}"; do
    gpu 0 timeout 120 python3 -m jaxrl_mgpu.evaluate --run-dir $R/both --run $i --greedy --episodes $EPISODES \
        2>>$OUT/returns_errors.log | sed "s/^/both /" >> $OUT/returns_greedy.jsonl
  done
fi

for seed in "${SEEDS[@]}"; do
  run=$R/async$seed
  gpu 0 ${LEARNER_CPUS:+taskset -c $LEARNER_CPUS} timeout $T python3 -m jaxrl_mgpu.train $Q --seed $seed --run-dir $run --mode learn $A \
      > $OUT/returns_async${seed}_learner.log 2>&1 &
  pids=($!)
  for c in $(seq 1 $N); do
    XLA_PYTHON_CLIENT_MEM_FRACTION=$(python3 -c "print(round(0.9 / $N, 2))") \
    collector timeout $T python3 -m jaxrl_mgpu.train $Q --seed $seed --run-dir $run --mode collect $A \
        --collector-id c$c --collect-before-checkpoint random > $OUT/returns_async${seed}_c$c.log 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "async seed $seed exit $?" >> $OUT/returns_phases.txt
  cp $run/metrics.jsonl $OUT/returns_async${seed}_metrics.jsonl
  gpu 0 timeout 120 python3 -m jaxrl_mgpu.evaluate --run-dir $run --greedy --episodes $EPISODES \
      2>>$OUT/returns_errors.log | sed "s/^/async$seed /" >> $OUT/returns_greedy.jsonl
done
cp $R/both/metrics.jsonl $OUT/returns_both_metrics.jsonl 2>/dev/null
python3 - $OUT "${SEEDS[@]}" <<'PY' | tee $OUT/returns_summary.txt
import json, os, sys
out = sys.argv[1]
for line in open(f"{out}/returns_greedy.jsonl") if os.path.exists(f"{out}/returns_greedy.jsonl") else []:
    name, row = line.split(" ", 1)
    row = json.loads(row)
    print(f"{name:7s} {row.get('run', '')!s:24s} greedy return {row['mean_return']:.1f} ± {row['std_return']:.1f} over {row.get('episodes')} episodes")
for seed in sys.argv[2:]:
    rows = [json.loads(l) for l in open(f"{out}/returns_async{seed}_metrics.jsonl")]
    rows = [r for r in rows if "grad_steps" in r]
    last, lags = rows[-1], [r["async/policy_lag"] for r in rows if r.get("async/policy_lag") is not None]
    inserted = [r["async/policy_lag_inserted"] for r in rows if r.get("async/policy_lag_inserted") is not None]
    stages = ("params", "rollout", "write", "read", "insert")  # algos/dqn_async.py: STAGES
    latency = {s: [r[f"async/latency_s/{s}"] for r in rows if r.get(f"async/latency_s/{s}") is not None] for s in stages}
    print(f"async{seed}: {last['env_steps']:,} env steps received, {last['grad_steps']:,} gradient steps, samples per "
          f"insert {last['async/samples_per_insert']:.2f}, {last['time']:.0f} s, mean policy lag "
          f"{sum(lags) / max(len(lags), 1):.1f} learner iterations on arrival, "
          f"{sum(inserted) / max(len(inserted), 1):.1f} inserted; latency (ms) "
          f"{', '.join(f'{s} {1e3 * sum(v) / max(len(v), 1):.0f}' for s, v in latency.items())}; training return "
          f"(collectors) "
          f"{[r['episode_return'] for r in rows[-3:]]}")
PY
