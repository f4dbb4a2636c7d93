# Scaling table (issues 2 and 9): PPO with the MLP and with the transformer policy at fixed
# per-device work on 1, 2 and 4 GPUs of one machine (and the hand-fused reference on one), in
# one call. Raw JSON lines and jax.profiler traces (GPU 0) come back in results.tgz.
#   bash experiments/gpu/run.sh scaling          (DEVICES="1 2 4 8" on an 8-GPU machine)
source experiments/gpu/setup.sh
set -o pipefail
DEVICES=${DEVICES:-"1 2 4"}
bench() { python3 -m jaxrl_mgpu.bench "$@" 2>&1 | grep -v "^{\|^\[Gloo\]\|WARNING"; }
echo "--- PPO, MLP policy (CartPole-v1, 128 steps, 4 epochs x 4 minibatches), pmap"
bench --envs-per-device 2048 16384 --devices $DEVICES --baseline --updates 5 --repeats 7 \
      --out $OUT/bench_ppo.jsonl --profile $OUT/prof | tee $OUT/bench_ppo.txt
echo "--- PPO, MLP policy, shard_map backend"
bench --parallel shard_map --envs-per-device 2048 --devices $DEVICES --updates 5 --repeats 7 \
      --out $OUT/bench_ppo_shard_map.jsonl | tee $OUT/bench_ppo_shard_map.txt
echo "--- PPO, transformer policy (d64, 2 layers, 4 heads, context 32; 64 steps, 4 minibatches)"
bench --policy transformer --d-model 64 --n-layers 2 --n-heads 4 --context-len 32 --num-steps 64 \
      --num-minibatches 4 --envs-per-device 1024 --devices $DEVICES --updates 5 --repeats 7 \
      --out $OUT/bench_ppo_transformer.jsonl | tee $OUT/bench_ppo_transformer.txt
python3 experiments/gpu/trace_summary.py $OUT/prof > $OUT/traces.txt
rm -rf $OUT/prof
