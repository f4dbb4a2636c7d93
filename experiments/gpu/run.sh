# Runs the named measurement scripts of this folder on the GPU machine, then packs everything
# they wrote into one archive under the device tool's $OUT (which returns at most 8 files).
#   bash experiments/gpu/run.sh ppo transformer
FINAL_OUT=${OUT:-/tmp/final}
export OUT=/tmp/out
mkdir -p $OUT $FINAL_OUT
for script in "$@"; do
  echo "=== $script"
  bash experiments/gpu/$script.sh 2>&1 | grep -v "^update \|^\[Gloo\]\|WARNING" | tail -40
done
tar czf $FINAL_OUT/results.tgz -C $OUT .
