# Issue 73: Atari on one GPU machine (16 CPU cores). Needs ale-py's cp312 wheel in .whl
# (bash ../shared/gpu/fetch-wheels.sh --brax ale-py==0.12.1; carry [".whl"]). From the repo root:
#   bash experiments/gpu/atari.sh                      # the ceiling, then PRESET's training throughput
#   GAME=breakout PRESET=atari-breakout-ppo T=540 ...  # a longer run (its return at T)
# 1. The ceiling: ale-py's vector environment alone, random actions, ENVS games on THREADS threads
#    (what any trainer on this host can reach): one JSON line, ceiling.jsonl.
# 2. Ours: `--config PRESET` for T seconds (ours.sh), one JSON line in ours.jsonl; the table prints
#    its steady env steps/s beside the ceiling.
# DRY=1 OUT=/tmp/x T=40 ENVS=8 THREADS=2 PRESET=atari-tiny GAME=breakout: a CPU check of the script.
source experiments/gpu/setup.sh
GAME=${GAME:-pong}; PRESET=${PRESET:-atari-pong-ppo}; T=${T:-240}; ENVS=${ENVS:-64}; THREADS=${THREADS:-16}
python3 - "$GAME" "$ENVS" "$THREADS" > $OUT/ceiling.jsonl <<'PY'
import json, sys, time
import numpy as np
from ale_py.vector_env import AtariVectorEnv
game, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
envs = AtariVectorEnv(game, n, num_threads=threads, episodic_life=False, reward_clipping=False)
envs.reset(seed=np.arange(n))
rng, steps = np.random.default_rng(0), 0
actions = rng.integers(0, envs.single_action_space.n, (64, n))
start = time.perf_counter()
while time.perf_counter() - start < 20:
    envs.step(actions[steps % 64]); steps += 1
print(json.dumps({"game": game, "envs": n, "threads": threads, "env_steps_per_s": round(steps * n / (time.perf_counter() - start))}))
PY
cat $OUT/ceiling.jsonl
source experiments/gpu/ours.sh
EVAL_EVERY=${EVAL_EVERY:-0} ours atari-$GAME --num-envs $ENVS ${FLAGS:-}
table
