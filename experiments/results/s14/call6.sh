# Session 14, call 6: at the final code (0ccf0c5), AD training on the GPU with the kernels
# against XLA, the AD-size rows of the table, and kernel times over two profiled steps.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
N=1000 OUT=$OUT bash experiments/gpu/ad80_check.sh
mv $OUT/ad80_train.txt $OUT/final_ad80_train.txt
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
row() { python3 -m jaxrl_mgpu.bench "$@" 2>&1 | grep -E "^d[0-9]|^bf16 matmul"; }
row $AD --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas | tee $OUT/final_ad4096.txt
row $AD --batch 8192 --precisions bf16 --attention pallas --mlp pallas | tee $OUT/final_ad8192.txt
python3 -m jaxrl_mgpu.bench $AD --batch 4096 --precisions bf16 --attention pallas --mlp pallas \
    --profile /tmp/prof >/dev/null 2>&1
python3 experiments/gpu/trace_summary.py --all /tmp/prof > $OUT/final_trace.txt; head -30 $OUT/final_trace.txt
