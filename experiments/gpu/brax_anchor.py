"""The anchors of issues 50 and 62: Brax's own PPO trainer (`brax.training.agents.ppo.train`,
release 0.14.2) on a Brax task with its published configuration, or on a MuJoCo Playground DM
Control task (`dmc:CheetahRun`, `dmc:HumanoidWalk`; MJX's JAX implementation) with Playground's
own PPO parameters and training wrapper, as its notebooks train them; with `--algo sac`, Brax's
own SAC trainer (`brax.training.agents.sac.train`) with Playground's `brax_sac_config` on a DM
Control task. Timed, one JSON line per seed.

Brax 0.14.2 calls `jax.device_put_replicated`, which jax 0.10 removed; the replacement below
puts the stacked tree onto a NamedSharding over the devices (what Brax's unreleased HEAD does).
It is part of this script only, not of jaxrl_mgpu.

    python experiments/gpu/brax_anchor.py ant --seeds 0 1 2
    python experiments/gpu/brax_anchor.py dmc:CheetahRun --seeds 0
    python experiments/gpu/brax_anchor.py dmc:HumanoidWalk --algo sac --seeds 0
"""

import argparse
import functools
import inspect
import json
import sys
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
from brax.training.agents.sac import train as sac  # noqa: E402

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


def playground(task: str, algo: str = "ppo") -> tuple:
    """A DM Control task of Playground 0.2.0 with its `dm_control_suite_params.brax_ppo_config`
    (or `brax_sac_config`), as `ppo.train`'s (`sac.train`'s) keyword arguments (its network
    options where the config names them)."""
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.sac import networks as sac_networks
    from mujoco_playground import dm_control_suite, wrapper
    from mujoco_playground.config import dm_control_suite_params

    env = dm_control_suite.load(task, config_overrides={"impl": "jax"})
    config = dm_control_suite_params.brax_sac_config if algo == "sac" else dm_control_suite_params.brax_ppo_config
    params = config(task).to_dict()
    sizes = params.pop("network_factory", None)
    if sizes:
        make = sac_networks.make_sac_networks if algo == "sac" else ppo_networks.make_ppo_networks
        params["network_factory"] = functools.partial(make, **sizes)
    return env, dict(params, wrap_env_fn=wrapper.wrap_for_brax_training,
                     eval_env=dm_control_suite.load(task, config_overrides={"impl": "jax"}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("task", help=f"{' or '.join(sorted(CONFIGS))} (Brax), or dmc:TASK (Playground's DM Control)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--algo", choices=("ppo", "sac"), default="ppo", help="Brax's trainer (sac: DM Control tasks only)")
    p.add_argument("--backend", default="mjx")
    p.add_argument("--timesteps", type=int, default=None, help="override num_timesteps (a shorter check)")
    p.add_argument("--num-envs", type=int, default=None, help="override num_envs and batch_size (a CPU check)")
    args = p.parse_args()
    if args.task not in CONFIGS and not args.task.startswith("dmc:"):
        p.error(f"task {args.task!r}: one of {', '.join(sorted(CONFIGS))}, or dmc:TASK")
    if args.algo == "sac" and not args.task.startswith("dmc:"):
        p.error("--algo sac: a DM Control task (dmc:TASK), with Playground's brax_sac_config")
    if args.task.startswith("dmc:"):
        # as Playground's own trainer (learning/train_jax_ppo.py) sets it: float32 matmuls, not
        # TF32 (with TF32, CheetahRun's return rose to 689 and fell to 0 on an H200)
        jax.config.update("jax_default_matmul_precision", "highest")
    for seed in args.seeds:
        if args.task.startswith("dmc:"):
            env, config = playground(args.task.split(":", 1)[1], args.algo)
        else:
            env, config = envs.get_environment(args.task, backend=args.backend), dict(CONFIGS[args.task])
        if args.timesteps:
            config["num_timesteps"] = args.timesteps
        if args.num_envs:  # (SAC's batch is of transitions: kept; its replay's first fill: a few steps' worth)
            config.update(num_envs=args.num_envs, num_eval_envs=args.num_envs,
                          **(dict(min_replay_size=args.num_envs * 64) if args.algo == "sac" else
                             dict(batch_size=args.num_envs // 2)))
        evals, started = [], time.perf_counter()

        def progress(steps, metrics):
            evals.append((int(steps), float(metrics["eval/episode_reward"]), time.perf_counter() - started))
            # to stderr as it comes, so a run cut off by the call's time limit still leaves its curve
            print(json.dumps({"task": args.task, "seed": seed, "eval": evals[-1]}), file=sys.stderr, flush=True)

        trainer = sac if args.algo == "sac" else ppo
        # Playground's configs name options its own training scripts read beside Brax's trainer
        # (SAC's num_resets_per_eval): what Brax 0.14.2's train does not take is left out, and said.
        taken = inspect.signature(trainer.train).parameters
        left_out = {k: config.pop(k) for k in list(config) if k not in taken}
        if left_out:
            print(json.dumps({"left_out_of_brax_train": left_out}), file=sys.stderr, flush=True)
        trainer.train(environment=env, seed=seed, progress_fn=progress, **config)
        total = time.perf_counter() - started
        # The first progress call follows the compile and the first evaluation; Brax's own
        # "jit time" is what comes before the first training step.
        first = evals[0][2]
        train_s = total - first
        print(json.dumps({"impl": "brax", "algo": args.algo, "task": args.task, "backend": args.backend, "seed": seed,
                          "env_steps": evals[-1][0], "final_eval_return": evals[-1][1],
                          "wall_s": round(total, 1), "before_first_step_s": round(first, 1),
                          "train_s": round(train_s, 1), "env_steps_per_s": round(evals[-1][0] / train_s),
                          "curve": evals}), flush=True)


if __name__ == "__main__":
    main()
