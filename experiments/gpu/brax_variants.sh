# Issue 50: which of this project's PPO differences from Brax's trainer cost return on a Brax
# task. Runs variants of `--config brax-$TASK` side by side on one GPU (their wall times are
# not comparable to a run alone; their learning curves per env step are), each from its own
# copy of the checkout with the named patches of experiments/gpu/variants applied:
#   VARIANTS="preset::  whole-gae::--unroll-length,0  lecun:lecun:" TASK=ant bash experiments/gpu/brax_variants.sh
# A variant is NAME:PATCH+PATCH:FLAGS with the flags' spaces written as commas (lecun.patch:
# Brax's LeCun-uniform init instead of the orthogonal one).
source experiments/gpu/setup.sh
TASK=${TASK:-ant}; SEED=${SEED:-0}; T=${T:-540}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
for variant in $VARIANTS; do
  IFS=: read -r name patches flags <<< "$variant"
  copy=/tmp/variant-$name; rm -rf $copy; mkdir -p $copy
  cp -r jaxrl_mgpu experiments $copy/
  for patch in ${patches//+/ }; do (cd $copy && patch -s -p1 < experiments/gpu/variants/$patch.patch) || exit 1; done
  (cd $copy && PYTHONPATH=/tmp/site:$copy timeout $T python3 -m jaxrl_mgpu.train --config brax-$TASK --seed $SEED \
      --run-dir /tmp/runs/$name --eval-every 30 --eval-episodes 128 --checkpoint-every 0 ${flags//,/ } \
      > $OUT/$name.log 2>&1; echo "exit $?" >> $OUT/$name.log) &
done
wait
python3 - $OUT $VARIANTS <<'PY'
import json, sys
out, variants = sys.argv[1], sys.argv[2:]
for v in variants:
    name = v.split(":")[0]
    try:
        rows = [json.loads(l) for l in open(f"/tmp/runs/{name}/metrics.jsonl")]
    except OSError:
        print(f"{name:>24}  no metrics"); continue
    evals = [(r["env_steps"], round(r["eval/episode_return"])) for r in rows if r.get("eval/episode_return") is not None]
    json.dump({"variant": v, "evals": evals, "last_train_return": rows[-1].get("episode_return")},
              open(f"{out}/{name}.json", "w"))
    print(f"{name:>24}  steps {rows[-1]['env_steps']:>11,}  evals {evals}")
PY
