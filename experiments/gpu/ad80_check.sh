# The fused kernels on the GPU train what XLA trains (the CPU tests run them only through the
# Pallas interpreter): Algorithm Distillation on DarkRoom with 80-token windows (so the attention
# kernel applies), XLA against both kernels, same seed; tokens/s, cross-entropy and accuracy.
#   bash experiments/gpu/run.sh ad80_check          (N=3000 updates by default)
source experiments/gpu/setup.sh
N=${N:-3000}; TASKS=${TASKS:-256}; STEPS=${STEPS:-4000}
timeout 100 python3 -m jaxrl_mgpu.histories --env DarkRoom --tasks $TASKS --steps $STEPS --out /tmp/dr-$$ | tail -1
for k in "--attention xla --mlp xla" "--attention pallas --mlp pallas"; do
  d=/tmp/ad-$$-$(echo $k | tr -d ' -')
  timeout 150 python3 -m jaxrl_mgpu.train --config darkroom-ad --dataset /tmp/dr-$$ --run-dir $d --n-transit 80 \
      --precision bf16 --num-updates $N --checkpoint-every 0 $k ${EXTRA:-} 2>&1 | grep "^done" | sed "s/^/$k: /"
  python3 - $d/metrics.jsonl <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ce, acc = [[r[k] for r in rows if r.get(k) is not None] for k in ("loss/cross_entropy", "loss/accuracy")]
sps = [r["sps"] for r in rows][len(rows) // 2:]
print(f"   tokens/s (median, 2nd half) {statistics.median(sps):,.0f}; cross-entropy first {ce[0]:.4f} -> "
      f"last 5 logs {statistics.mean(ce[-5:]):.4f}, accuracy {statistics.mean(acc[-5:]):.3f}")
PY
done 2>&1 | tee $OUT/ad80_train.txt
