# The fused Pallas kernels (nets/fused_attention.py, nets/fused_mlp.py) against XLA and cuDNN, for
# experiments/RESULTS.md: 1) the Algorithm Distillation-size training step, every combination;
# 2) AD training itself (the darkroom-ad preset's 160-token windows: cuDNN attention + fused MLP)
# on a small dataset, tokens/s with and without the kernels. Run: bash experiments/gpu/kernels.sh
source experiments/gpu/setup.sh
set -o pipefail
timeout 330 python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 \
    --batch 4096 --precisions fp32 bf16 --attention xla cudnn pallas --mlp xla pallas --repeats 10 \
    --out $OUT/bench_kernels.jsonl 2>&1 | grep -v "^{\|^W0000\|^E1126\|onstant folding\|scatter\|^$\|file a bug\|took" \
    | tee $OUT/bench_kernels.txt
timeout 120 python3 -m jaxrl_mgpu.histories --env DarkRoom --tasks 256 --steps 4000 --out /tmp/darkroom-256 | tail -1
for kernels in "--attention xla --mlp xla" "--attention cudnn --mlp xla" "--attention cudnn --mlp pallas"; do
  dir=/tmp/ad-$(echo $kernels | tr -d ' -')
  timeout 150 python3 -m jaxrl_mgpu.train --config darkroom-ad --dataset /tmp/darkroom-256 --run-dir $dir \
      --precision bf16 --num-updates 2000 --checkpoint-every 0 $kernels 2>&1 | grep "^done" | sed "s/^/$kernels: /"
  python3 -c "import json, statistics, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; sps = [r['sps'] for r in rows if 'sps' in r][len(rows) // 2:]; print(f'   median tokens/s over the second half: {statistics.median(sps):,.0f}')" $dir/metrics.jsonl
done 2>&1 | tee $OUT/ad_kernels.txt
