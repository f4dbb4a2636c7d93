"""The anchor of issue 50: Brax's own PPO trainer (`brax.training.agents.ppo.train`, release
0.14.2) on a Brax task with its published configuration, timed, one JSON line per seed.

Brax 0.14.2 calls `jax.device_put_replicated`, which jax 0.10 removed; the replacement below
puts the stacked tree onto a NamedSharding over the devices (what Brax's unreleased HEAD does).
It is part of this script only, not of jaxrl_mgpu.

    python experiments/gpu/brax_anchor.py ant --seeds 0 1 2
"""

import argparse
import json
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def device_put_replicated(tree, devices):
    sharding = NamedSharding(Mesh(np.array(devices), ("d",)), PartitionSpec("d"))
    return jax.tree.map(lambda x: jax.device_put(np.stack([np.asarray(x)] * len(devices)), sharding), tree)


jax.device_put_replicated = device_put_replicated

from brax import envs  # noqa: E402
from brax.training.agents.ppo import train as ppo  # noqa: E402

# Brax's published PPO configurations (its README / training notebook).
CONFIGS = {
    "ant": dict(num_timesteps=50_000_000, num_evals=10, reward_scaling=10, episode_length=1000,
                normalize_observations=True, action_repeat=1, unroll_length=5, num_minibatches=32,
                num_updates_per_batch=4, discounting=0.97, learning_rate=3e-4, entropy_cost=1e-2,
                num_envs=4096, batch_size=2048),
    "humanoid": dict(num_timesteps=50_000_000, num_evals=10, reward_scaling=0.1, episode_length=1000,
                     normalize_observations=True, action_repeat=1, unroll_length=10, num_minibatches=32,
                     num_updates_per_batch=8, discounting=0.97, learning_rate=3e-4, entropy_cost=1e-3,
                     num_envs=2048, batch_size=1024),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("task", choices=sorted(CONFIGS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--backend", default="mjx")
    p.add_argument("--timesteps", type=int, default=None, help="override num_timesteps (a shorter check)")
    args = p.parse_args()
    config = dict(CONFIGS[args.task])
    if args.timesteps:
        config["num_timesteps"] = args.timesteps
    for seed in args.seeds:
        env = envs.get_environment(args.task, backend=args.backend)
        evals, started = [], time.perf_counter()

        def progress(steps, metrics):
            evals.append((int(steps), float(metrics["eval/episode_reward"]), time.perf_counter() - started))

        ppo.train(environment=env, seed=seed, progress_fn=progress, **config)
        total = time.perf_counter() - started
        # The first progress call follows the compile and the first evaluation; Brax's own
        # "jit time" is what comes before the first training step.
        first = evals[0][2]
        train_s = total - first
        print(json.dumps({"impl": "brax", "task": args.task, "backend": args.backend, "seed": seed,
                          "env_steps": evals[-1][0], "final_eval_return": evals[-1][1],
                          "wall_s": round(total, 1), "before_first_step_s": round(first, 1),
                          "train_s": round(train_s, 1), "env_steps_per_s": round(evals[-1][0] / train_s),
                          "curve": evals}), flush=True)


if __name__ == "__main__":
    main()
