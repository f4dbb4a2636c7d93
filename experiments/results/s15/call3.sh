# Session 15, call 3 (asked for as nvidia-h200, in case one comes): issue 4's table at the
# current code (unchanged since session 14's 0ccf0c5).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card3.txt
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
row() { timeout 200 python3 -m jaxrl_mgpu.bench "$@" 2>&1 | grep -E "^d[0-9]|^bf16 matmul"; }
row $AD --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas | tee $OUT/ad4096.txt
row $AD --batch 8192 --precisions bf16 --attention pallas --mlp pallas | tee $OUT/ad8192.txt
row --transformer-step --d-model 512 --n-layers 6 --n-heads 8 --context-len 256 --batch 256 --repeats 10 \
  --precisions fp32 bf16 --attention xla cudnn | tee $OUT/d512.txt
