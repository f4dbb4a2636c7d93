# Transformer measurements for experiments/RESULTS.md: training-step tokens/s and MFU at two
# sizes (fp32 vs bf16; XLA vs cuDNN attention), then PPO with the transformer policy on 1 and 2
# GPUs at fixed per-device work. Run from the repo root:  bash experiments/gpu/transformer.sh
source experiments/gpu/setup.sh
set -o pipefail
for size in "--d-model 512 --n-layers 6 --n-heads 8 --context-len 256 --batch 256" \
            "--d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --batch 512"; do
  timeout 200 python3 -m jaxrl_mgpu.bench --transformer-step $size --precisions fp32 bf16 \
      --attention xla cudnn --repeats 10 --out $OUT/bench_transformer.jsonl 2>&1 | grep -v "^{" | tee -a $OUT/bench_transformer.txt
done
timeout 200 python3 -m jaxrl_mgpu.bench --policy transformer --d-model 64 --n-layers 2 --n-heads 4 \
    --context-len 32 --num-steps 64 --num-minibatches 4 --envs-per-device 1024 --devices 1 2 \
    --updates 3 --repeats 5 --out $OUT/bench_ppo_transformer.jsonl 2>&1 | grep -v "^{" | tee $OUT/bench_ppo_transformer.txt
# Memory task: transformer vs MLP on CartPole-NoVel-v1, 3 seeds each, one GPU per policy.
for policy in mlp transformer; do
  gpu=$([ $policy = mlp ] && echo 0 || echo 1)
  (for seed in 0 1 2; do
     CUDA_VISIBLE_DEVICES=$gpu timeout 150 python3 -m jaxrl_mgpu.train --config cartpole-novel-$policy --seed $seed \
         --run-dir /tmp/runs/novel-$policy-$seed --eval-every 150 --eval-episodes 256 2>&1 | grep "^done" \
         | sed "s/^/$policy seed $seed: /" >> $OUT/novel.txt
   done) &
done
wait
cat $OUT/novel.txt
