# Session 14, call 5: d bo = sum(dr) as a fourth partial sum of the MLP rows kernel, and each of
# the MLP rows and attention input-gradient kernels writing its partial sums as one array (one
# XLA reduction instead of three), interleaved against the same code with XLA's dbo
# (DBO_IN_KERNEL=False); then each side in its own process against 821737d (from ab_old/).
python3 experiments/gpu/variants.py base "xla_dbo:fused_mlp.DBO_IN_KERNEL=False" --rounds 3 2>&1 \
  | grep -E "ceiling|round" | tee $OUT/sums_ab.txt
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
for r in 0 1; do
  for side in new old; do
    dir=.; [ $side = old ] && dir=ab_old
    (cd $dir && echo "$side r$r $(python3 -m jaxrl_mgpu.bench $AD --batch 4096 --precisions bf16 --attention pallas --mlp pallas 2>&1 | grep -E '^d128|^bf16 matmul' | tr '\n' ' ')")
  done
done | tee $OUT/sums_own.txt
