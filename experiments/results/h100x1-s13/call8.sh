# Session 13, final A/B: the kept changes (backward attention over two sequences a program, the
# embedding's bias in its matmul) against HEAD before them (9475676, run from inside ab_old/:
# python -m puts the working directory ahead of PYTHONPATH), each side in its own process,
# alternated three times; then the AD training check (XLA against both kernels, 80-token windows).
# (The alternating loop, inline when this ran, is experiments/gpu/ab_processes.sh since review.)
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10 --batch 4096 --precisions bf16 --attention pallas --mlp pallas"
bash experiments/gpu/ab_processes.sh 3 $AD | tee $OUT/ab_final.txt
N=1000 OUT=$OUT bash experiments/gpu/ad80_check.sh 2>&1 | grep -v "^\s*$" | tail -6
