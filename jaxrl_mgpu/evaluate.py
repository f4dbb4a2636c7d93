"""Evaluation: episodes spread over all devices, during training and from the command line.

    python -m jaxrl_mgpu.evaluate --run-dir DIR [--step S | --best] --episodes K [--greedy]

loads a checkpoint (the latest by default) of a run written on any number of devices, runs K
episodes spread over the local devices, and prints one JSON line with `mean_return`,
`std_return`, `episodes` and `step`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.algos import ALGOS
from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic
from jaxrl_mgpu.parallel import AXIS, global_indices


def make_episodes(policy, env, env_params, total: int, num_devices: int, greedy: bool):
    """A per-device function `(params, key) -> (sum, sum of squares, count)` of the returns of
    the first episode of `ceil(total / num_devices)` environments per device, summed over all
    devices and hosts (environments past `total` are padding and do not count). `policy` is an
    actor-critic Policy (nets/actor_critic.py), with whatever memory it keeps; `greedy` takes the
    action distribution's mode (argmax of the logits, a Gaussian's mean) instead of a sample."""
    dist = actor_critic.distribution(env, env_params)
    per_device = -(-total // num_devices)
    max_steps = int(env_params.max_steps_in_episode)

    def episodes(params, key):
        ids = global_indices(per_device)
        batch = vec.reset(env, env_params, key, ids)

        def step(carry, t):
            batch, memory, first_return, finished = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t + 1), ids))
            pi, _, _, memory = policy.act(params, memory, batch.obs, batch.obs)
            action = dist.mode(pi) if greedy else dist.sample(pi, dist.noise(keys[:, 0]))
            batch, out = vec.step(env, env_params, batch, dist.to_env(action), keys[:, 1])
            ended = out.done_length > 0
            memory = policy.remember(memory, action, out.reward, ended)
            first_return = jnp.where(ended & ~finished, out.done_return, first_return)
            return (batch, memory, first_return, finished | ended), None

        start = (batch, policy.init_memory(per_device), jnp.zeros(per_device), jnp.zeros(per_device, bool))
        (_, _, returns, finished), _ = jax.lax.scan(step, start, jnp.arange(max_steps))
        counted = (ids < total) & finished
        totals = (jnp.where(counted, returns, 0.0).sum(), jnp.where(counted, returns ** 2, 0.0).sum(),
                  counted.sum().astype(jnp.float32))
        return jax.lax.psum(totals, AXIS)

    return episodes


def summarize(totals) -> dict:
    total, total_sq, count = (float(x) for x in totals)
    mean = total / count if count else float("nan")
    var = max(total_sq / count - mean ** 2, 0.0) if count else float("nan")
    return {"mean_return": mean, "std_return": var ** 0.5, "episodes": int(count)}


# -- command line ------------------------------------------------------------------------
def _args(argv):
    p = config_lib.Parser(prog="python -m jaxrl_mgpu.evaluate", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="a training run's directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="checkpoint step (update); default: the latest")
    which.add_argument("--best", action="store_true", help="the checkpoint with the best evaluation return")
    p.add_argument("--episodes", type=int, default=64, help="episodes, spread over all devices")
    p.add_argument("--greedy", action="store_true", help="act greedily (argmax) instead of sampling")
    p.add_argument("--devices", type=int, default=None, help="use the first k local devices (default: all)")
    p.add_argument("--parallel", default="pmap", choices=parallel.BACKENDS)
    p.add_argument("--seed", type=int, default=1, help="seed of the evaluation episodes")
    p.add_argument("--in-context", action="store_true",
                   help="--algo ad runs: E consecutive episodes on held-out goals with a rolling context and "
                        "frozen weights; also takes --goals test|train and --envs-per-goal N (jaxrl_mgpu.incontext)")
    return p.parse_args(argv)


def load_run(run_dir: str):
    """The run's config and its checkpoints, or a ConfigError saying what is missing."""
    from jaxrl_mgpu.checkpoint import Checkpoints
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"--run-dir {run_dir}: no such directory")
    cfg = config_lib.from_dict(config_lib.read_saved(path))
    if not (path / "checkpoints").is_dir():
        raise ConfigError(f"--run-dir {run_dir}: the run has no checkpoints")
    return cfg, Checkpoints(path, read_only=True)


def pick_step(ckpts, run_dir: str, step: int | None) -> int:
    """`step` (default: the latest) if it is a complete checkpoint, else a ConfigError."""
    steps = ckpts.steps()
    if not steps:
        raise ConfigError(f"--run-dir {run_dir}: the run has no complete checkpoint")
    step = max(steps) if step is None else step
    if step not in steps:
        raise ConfigError(f"--step {step}: no such checkpoint; available: {', '.join(map(str, sorted(steps)))}")
    return step


def params_template(cfg):
    """Shapes and dtypes of the run's params (no device axis), from its config."""
    env, env_params = envs_lib.make(cfg.env)
    algo = ALGOS[cfg.algo].make(cfg, env, env_params, 1)
    return jax.eval_shape(algo.init_params, jax.random.PRNGKey(0))


def load_params(run_dir: str, step: int | None = None, best: bool = False):
    """`(step, params)` of a checkpoint (default: the latest) as host numpy arrays."""
    cfg, ckpts = load_run(run_dir)
    if step is None:
        step = ckpts.best_step() if best else ckpts.latest_step()
    try:
        return step, ckpts.restore_params(step, params_template(cfg), best=best)
    finally:
        ckpts.close()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--in-context" in argv:  # Algorithm Distillation: its own options and outputs
        from jaxrl_mgpu import incontext
        return incontext.evaluate(argv)
    from jaxrl_mgpu.cli import USER_ERRORS, fail
    try:
        args = _args(argv)
        if args.episodes < 1:
            raise ConfigError(f"--episodes must be at least 1, got {args.episodes}")
        cfg, ckpts = load_run(args.run_dir)
        if cfg.algo == "ad":
            raise ConfigError(f"--run-dir {args.run_dir} is an --algo ad run: it acts from its context of past "
                              f"episodes, so evaluate it with --in-context")
        if args.best:
            step = ckpts.best_step()
            if step is None:
                raise ConfigError(f"--best: the run in {args.run_dir} has no best checkpoint (train with --eval-every)")
        else:
            step = pick_step(ckpts, args.run_dir, args.step)
        par = parallel.setup(args.parallel, args.devices)
    except USER_ERRORS as e:
        fail(e)

    env, env_params = envs_lib.make(cfg.env)
    algo = ALGOS[cfg.algo].make(cfg, env, env_params, par.num_devices)
    params = ckpts.restore_params(step, params_template(cfg), best=args.best)
    run = par.map(make_episodes(algo.policy, env, env_params, args.episodes, par.num_devices, args.greedy))
    totals = run(par.replicate(params), par.replicate(np.asarray(jax.random.PRNGKey(args.seed))))
    ckpts.close()
    print(json.dumps({**summarize(par.first(totals)), "step": step, "greedy": args.greedy}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
