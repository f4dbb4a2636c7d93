# Session 14, call 1: session 13's untimed change (the MLP weight-gradient kernel at 128 rows a
# step, 8 warps, 16 row groups) confirmed in own processes against 5aed44c (from inside ab_old/),
# the AD-size rows of the table, the GPU training check, and a fresh kernel-time profile.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card.txt
bash experiments/results/h100x1-s13/call13.sh
N=1000 OUT=$OUT bash experiments/gpu/ad80_check.sh
python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 \
    --batch 4096 --precisions bf16 --attention pallas --mlp pallas --repeats 10 --profile /tmp/prof >/dev/null 2>&1
python3 experiments/gpu/trace_summary.py --all /tmp/prof > $OUT/trace.txt; head -40 $OUT/trace.txt
