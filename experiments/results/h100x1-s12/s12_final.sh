# Session 12, last call: new kernels (input-gradient loop, dh-fed MLP rows kernel) against
# HEAD before them (ab_old/), alternated; the table; the AD training check.
AD="--transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 --repeats 10"
row() { python3 -m jaxrl_mgpu.bench $AD "$@" 2>&1 | grep -E "^d128|ceiling"; }
for r in 0 1; do
  echo "new r$r: $(row --batch 4096 --precisions bf16 --attention pallas --mlp pallas | tr '\n' ' ')"
  echo "old r$r: $(PYTHONPATH=/tmp/site:$PWD/ab_old row --batch 4096 --precisions bf16 --attention pallas --mlp pallas | tr '\n' ' ')"
done | tee $OUT/ab_final.txt
row --batch 4096 --precisions fp32 bf16 --attention xla pallas --mlp xla pallas | tee $OUT/ad4096.txt
row --batch 8192 --precisions bf16 --attention xla pallas --mlp xla pallas | tee $OUT/ad8192.txt
N=1000 OUT=$OUT bash experiments/gpu/ad80_check.sh 2>&1 | grep -v "^\s*$" | tail -6
