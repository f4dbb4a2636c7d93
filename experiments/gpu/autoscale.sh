# --auto-scale against a hand sweep of environments per device (issue 30), on the GPUs of the
# machine. Run through the device tool:  bash experiments/gpu/autoscale.sh [DEVICES]
# For each workload: every size 2^8 .. 2^18 in a process of its own (so the allocator's peak is
# that size's), as far as memory allows, then a short run with --auto-scale (throughput and
# memory) that prints its table and search time. JSON lines and logs go to $OUT.
# WORKS="0 2" picks workloads (0 CartPole PPO, 1 Breakout-MinAtar PPO, 2 Breakout-MinAtar DQN),
# e.g. to run each on its own GPU of one machine at the same time (CUDA_VISIBLE_DEVICES).
source experiments/gpu/setup.sh
devs=${1:-1}
WORKLOADS=("--env CartPole-v1" "--config breakout-minatar" "--config breakout-minatar-dqn")
for w in ${WORKS:-0 1 2}; do
  work=${WORKLOADS[$w]}
  name=$(echo $work | tr -c 'a-zA-Z0-9\n' '_')
  for k in ${SWEEP-8 9 10 11 12 13 14 15 16 17 18}; do  # SWEEP="" skips the hand sweep
    timeout 120 python3 -m jaxrl_mgpu.bench $work --devices $devs --envs-per-device $((2**k)) --updates 3 --repeats 3 \
      --out $OUT/sweep_$name.jsonl 2>&1 | grep -E "^jaxrl_mgpu |Error|error" | head -2 || true
  done
  for mode in throughput memory; do
    timeout 240 python3 -m jaxrl_mgpu.train $work --auto-scale $mode --stop-at-update 1 --devices $devs \
      --run-dir /tmp/as_${name}_$mode 2>&1 | grep -E "auto-scale|envs/device|^ +[0-9,]+ |chose|startup" | tee $OUT/auto_${name}_$mode.txt
  done
done
