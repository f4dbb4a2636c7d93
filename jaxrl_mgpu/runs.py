"""A run directory as the tools that read it see it (evaluation, in-context evaluation, the
asynchronous collectors): its config, its checkpoints and the shapes of its params."""

from __future__ import annotations

from pathlib import Path

import jax

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.algos import module_for
from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.config import ConfigError


def load_run(run_dir: str):
    """The run's config and its checkpoints, or a ConfigError saying what is missing."""
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
    env, env_params = envs_lib.make(cfg.env, cfg.env_args)
    module = module_for(cfg)
    algo = module.make(cfg, env, env_params, module.check(cfg, 1))
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
