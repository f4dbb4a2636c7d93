# Session 15, call 5: issue 4's table with the bench measuring the ceiling before the first row
# and after every row (MFU against their median; every measurement in median.jsonl), kernels
# unchanged since 0ccf0c5.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card5.txt
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
row() { timeout 200 python3 -m jaxrl_mgpu.bench "$@" --out $OUT/median.jsonl 2>&1 | grep -E "^d[0-9]|^bf16 matmul|^timed"; }
row $AD --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas | tee $OUT/median_ad4096.txt
row $AD --batch 8192 --precisions bf16 --attention pallas --mlp pallas | tee $OUT/median_ad8192.txt
row --transformer-step --d-model 512 --n-layers 6 --n-heads 8 --context-len 256 --batch 256 --repeats 10 \
  --precisions fp32 bf16 --attention xla cudnn | tee $OUT/median_d512.txt
