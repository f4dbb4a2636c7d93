# Session 13, final A/B: the kept changes (backward attention over two sequences a program, the
# embedding's bias in its matmul) against HEAD before them (9475676, run from inside ab_old/:
# python -m puts the working directory ahead of PYTHONPATH), each side in its own process,
# alternated three times; then the AD training check (XLA against both kernels, 80-token windows).
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10 --batch 4096 --precisions bf16 --attention pallas --mlp pallas"
for r in 0 1 2; do
  for side in new old; do
    dir=.; [ $side = old ] && dir=ab_old
    (cd $dir && echo "$side r$r $(python3 -c 'import jaxrl_mgpu; print(jaxrl_mgpu.__file__)') $(python3 -m jaxrl_mgpu.bench $AD 2>&1 | grep -E '^d128|ceiling' | tr '\n' ' ')")
  done
done | tee $OUT/ab_final.txt
N=1000 OUT=$OUT bash experiments/gpu/ad80_check.sh 2>&1 | grep -v "^\s*$" | tail -6
