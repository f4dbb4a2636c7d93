# Session 12: the final kernels against HEAD before them, each side in its own process, alternated.
# The old side runs from inside ab_old/ (python -m puts the working directory first on sys.path,
# ahead of PYTHONPATH: run from the repository root, ab_old/ would be shadowed by ./jaxrl_mgpu).
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10 --batch 4096 --precisions bf16 --attention pallas --mlp pallas"
for r in 0 1 2; do
  for side in new old; do
    dir=.; [ $side = old ] && dir=ab_old
    (cd $dir && echo "$side r$r $(python3 -c 'import jaxrl_mgpu; print(jaxrl_mgpu.__file__)') $(python3 -m jaxrl_mgpu.bench $AD 2>&1 | grep -E '^d128' )")
  done
done | tee $OUT/ab_final.txt
