# Session 14, call 5: d bo = sum(dr) as a fourth partial sum of the MLP rows kernel, and each of
# the MLP rows and attention input-gradient kernels writing its partial sums as one array (one
# XLA reduction instead of three), interleaved against the same code with XLA's dbo
# (DBO_IN_KERNEL=False, a switch of the working tree for this call only: main keeps the kernel
# path); then each side in its own process against 821737d (from ab_old/).
python3 experiments/gpu/variants.py base "xla_dbo:fused_mlp.DBO_IN_KERNEL=False" --rounds 3 2>&1 \
  | grep -E "ceiling|round" | tee $OUT/sums_ab.txt
# (The alternating loop, inline when this ran, is experiments/gpu/ab_processes.sh since review.)
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
bash experiments/gpu/ab_processes.sh 2 $AD --batch 4096 --precisions bf16 --attention pallas --mlp pallas \
  | tee $OUT/sums_own.txt
