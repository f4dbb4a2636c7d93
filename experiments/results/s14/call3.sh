# Session 14, call 3, on a two-GPU machine (asked for as nvidia-h200-x2): issue 9's 1- and 2-GPU
# scaling at the current code (the flattened optimizer and the kernels are newer than session
# 9's run), and issue 4's table on GPU 0 of the same machine first.
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee $OUT/cards.txt
row() { CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m jaxrl_mgpu.bench "$@" 2>&1 | grep -E "^d[0-9]|ceiling"; }
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
row $AD --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas | tee $OUT/ad4096.txt
row $AD --batch 8192 --precisions bf16 --attention pallas --mlp pallas | tee $OUT/ad8192.txt
row --transformer-step --d-model 512 --n-layers 6 --n-heads 8 --context-len 256 --batch 256 --repeats 10 \
  --precisions fp32 bf16 --attention xla cudnn | tee $OUT/d512.txt
DEVICES="1 2" timeout 330 bash experiments/gpu/scaling.sh 2>&1 | grep -v "^update \|^\[Gloo\]\|WARNING" | tail -40
