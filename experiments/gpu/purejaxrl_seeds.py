"""PureJaxRL's headline run, timed: its CartPole PPO (purejaxrl/ppo.py's default config: 4 envs x
128 steps, 5e5 steps) for N seeds, `jax.jit(jax.vmap(make_train(config)))` over N keys, on one
device. Needs .gpu_ref/ (PureJaxRL's ppo.py and wrappers.py; see startup.sh). Prints one JSON
line: compile seconds, run seconds, env steps/s over all seeds, mean final return.
    python3 experiments/gpu/purejaxrl_seeds.py --seeds 256 [--timesteps 5e5]"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".gpu_ref"))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from ppo import make_train  # noqa: E402  (PureJaxRL's, unchanged but for gymnax 1.0)

p = argparse.ArgumentParser()
p.add_argument("--seeds", type=int, default=256)
p.add_argument("--timesteps", type=float, default=5e5)
args = p.parse_args()
config = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": args.timesteps, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5,
          "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}
keys = jax.random.split(jax.random.PRNGKey(30), args.seeds)
t0 = time.perf_counter()
compiled = jax.jit(jax.vmap(make_train(config))).lower(keys).compile()
t1 = time.perf_counter()
out = jax.block_until_ready(compiled(keys))
t2 = time.perf_counter()
info = out["metrics"]
returns = np.asarray(info["returned_episode_returns"])  # [seeds, updates, steps, envs]
done = np.asarray(info["returned_episode"])
last = returns[:, -10:][done[:, -10:]].mean() if done[:, -10:].any() else float("nan")
steps = args.seeds * int(args.timesteps) // (4 * 128) * 4 * 128
print(json.dumps({"label": "purejaxrl", "seeds": args.seeds, "device": str(jax.devices()[0].device_kind),
                  "compile_s": round(t1 - t0, 2), "run_s": round(t2 - t1, 2), "env_steps": steps,
                  "env_steps_per_s": round(steps / (t2 - t1)), "final_return_mean": float(last)}))
