# Issue 51's check: PPO's and DQN's steps per second before and after a change, in one call on
# one GPU. BEFORE is a directory holding the package as it was (git archive REV jaxrl_mgpu |
# tar -x -C $BEFORE); the working tree is "after". Each pair runs before then after, then
# after then before, each side the same commands:
#   train  the training loop itself (median steps/s of the log rows after the first two)
#   bench  the compiled chunk alone (python -m jaxrl_mgpu.bench)
# Run from the repo root:  BEFORE=.before bash experiments/gpu/before_after.sh
source experiments/gpu/setup.sh
BEFORE=${BEFORE:-.before}
PPO="--env CartPole-v1 --num-envs 2048 --num-steps 128 --log-every 10 --checkpoint-every 0"
DQN="--config breakout-minatar-dqn --learning-starts 4096 --log-every 10 --checkpoint-every 0"
side() {  # side NAME: the PYTHONPATH of that side
  if [ "$1" = before ]; then echo "/tmp/site:$PWD/$BEFORE"; else echo "/tmp/site:$PWD"; fi
}
for order in "before after" "after before"; do
  for s in $order; do
    PYTHONPATH=$(side $s) timeout 150 python3 -m jaxrl_mgpu.train $PPO --total-timesteps $((2048 * 128 * 80)) \
        --run-dir /tmp/runs/ppo-$s-$RANDOM > $OUT/train_ppo_$s.log 2>&1
    PYTHONPATH=$(side $s) timeout 150 python3 -m jaxrl_mgpu.train $DQN --total-timesteps 1500000 \
        --run-dir /tmp/runs/dqn-$s-$RANDOM > $OUT/train_dqn_$s.log 2>&1
    python3 - "$s" "$OUT" <<'EOF'
import json, statistics, sys, glob
side, out = sys.argv[1], sys.argv[2]
for algo in ("ppo", "dqn"):
    runs = sorted(glob.glob(f"/tmp/runs/{algo}-{side}-*"), key=lambda p: __import__("os").path.getmtime(p))
    rows = [json.loads(l) for l in open(runs[-1] + "/metrics.jsonl")]
    sps = [r["sps"] for r in rows[2:]]
    line = {"side": side, "algo": algo, "what": "train", "rows": len(rows), "median_sps": statistics.median(sps)}
    print(json.dumps(line)); open(f"{out}/pairs.jsonl", "a").write(json.dumps(line) + "\n")
EOF
    PYTHONPATH=$(side $s) timeout 120 python3 -m jaxrl_mgpu.bench --algo ppo $PPO --updates 10 --repeats 5 \
        --out $OUT/bench_$s.jsonl > /dev/null 2>&1
    PYTHONPATH=$(side $s) timeout 150 python3 -m jaxrl_mgpu.bench $DQN --updates 10 --repeats 5 \
        --out $OUT/bench_$s.jsonl > /dev/null 2>&1
  done
done
python3 - "$OUT" <<'EOF'
import json, sys, collections
out = sys.argv[1]
table = collections.defaultdict(list)
for line in open(f"{out}/pairs.jsonl"):
    r = json.loads(line); table[("train", r["algo"], r["side"])].append(r["median_sps"])
for side in ("before", "after"):
    for line in open(f"{out}/bench_{side}.jsonl"):
        r = json.loads(line); table[("bench", r["algo"], side)].append(r["env_steps_per_s"])
for what in ("train", "bench"):
    for algo in ("ppo", "dqn"):
        b, a = table[(what, algo, "before")], table[(what, algo, "after")]
        if b and a:
            print(f"{what} {algo}: before {[round(x) for x in b]}  after {[round(x) for x in a]}  "
                  f"after/before {sum(a) / len(a) / (sum(b) / len(b)):.3f}")
EOF
