# Session 13: the table at the kept code: AD size at batch 4096 and 8192, and d512.
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
row() { python3 -m jaxrl_mgpu.bench "$@" 2>&1 | grep -E "^d[0-9]|ceiling"; }
row $AD --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas | tee $OUT/ad4096.txt
row $AD --batch 8192 --precisions bf16 --attention xla pallas --mlp xla pallas | tee $OUT/ad8192.txt
row --transformer-step --d-model 512 --n-layers 6 --n-heads 8 --context-len 256 --batch 256 --repeats 10 \
  --precisions fp32 bf16 --attention xla cudnn | tee $OUT/d512.txt
