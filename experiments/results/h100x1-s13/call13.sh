# Session 13, last call: main with the MLP weight-gradient kernel's new defaults (128 rows a step,
# 8 warps, 16 row groups) against ea3ba79 (from inside ab_old/), each in its own process,
# alternated twice; then the AD-size rows of the table.
# (The alternating loop, inline when this ran, is experiments/gpu/ab_processes.sh since review.)
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
bash experiments/gpu/ab_processes.sh 2 $AD --batch 4096 --precisions bf16 --attention pallas --mlp pallas \
  | tee $OUT/ab_weights.txt
python3 -m jaxrl_mgpu.bench $AD --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas 2>&1 | grep -E "^d128|^bf16 matmul" | tee $OUT/ad4096_final.txt
python3 -m jaxrl_mgpu.bench $AD --batch 8192 --precisions bf16 --attention pallas --mlp pallas 2>&1 | grep -E "^d128|^bf16 matmul" | tee $OUT/ad8192_final.txt
