# --auto-scale against a hand sweep of environments per device (issue 30), on the GPUs of the
# machine. Run through the device tool:  bash experiments/gpu/autoscale.sh [DEVICES]
# For each workload: every size 2^8 .. 2^18 in a process of its own (so the allocator's peak is
# that size's), as far as memory allows, then short runs with --auto-scale that print their table
# and search time: throughput with an empty compilation cache (cold), again with it (warm), and
# memory. JSON lines and logs go to $OUT.
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
  rm -rf /tmp/cc_$name
  for mode in throughput:cold throughput:warm memory:warm; do  # warm: the same compilation cache again
    timeout 240 python3 -m jaxrl_mgpu.train $work --auto-scale ${mode%:*} --stop-at-update 1 --devices $devs \
      --compile-cache /tmp/cc_$name --run-dir /tmp/as_${name}_${mode/:/_} 2>&1 \
      | grep -E "auto-scale|envs/device|^ +[0-9,]+ |chose|climb|startup" | tee $OUT/auto_${name}_${mode/:/_}.txt
  done
done
