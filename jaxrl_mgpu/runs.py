"""A run directory as the tools that read it see it (evaluation, in-context evaluation, the
asynchronous collectors): its config, its checkpoints and the shapes of its params."""

from __future__ import annotations

import sys
from pathlib import Path


from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu.checkpoint import Checkpoints, DamagedCheckpoint
from jaxrl_mgpu.cli import ConfigError


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


def readable_params(ckpts, run_dir: str, template, step: int | None = None, best: bool = False,
                    warn=None) -> tuple[int, object]:
    """`(step, params)` (host numpy; `template` gives their shapes): of `step`, of the best
    checkpoint, or by default of the newest checkpoint that reads back whole. A damaged
    checkpoint asked for by name is a ConfigError; one passed over on the way down is said
    through `warn` (default: a line on stderr). Nothing in the run directory is changed (a
    trainer may be writing it; a --resume sets damaged checkpoints aside)."""
    warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
    if best or step is not None:
        if best:
            step = ckpts.best_step()
            if step is None:
                raise ConfigError(f"--best: the run in {run_dir} has no best checkpoint (train with --eval-every)")
        else:
            step = pick_step(ckpts, run_dir, step)
        try:
            return step, ckpts.restore_params(step, template, best=best)
        except DamagedCheckpoint as e:
            raise ConfigError(f"--run-dir {run_dir}: {'the best checkpoint' if best else f'--step {step}'}: {e}") \
                from None
    pick_step(ckpts, run_dir, None)  # a ConfigError when there is none
    passed: list[DamagedCheckpoint] = []
    for step in sorted(ckpts.steps(), reverse=True):
        try:
            params = ckpts.restore_params(step, template)
        except DamagedCheckpoint as e:
            passed.append(e)
            continue
        for e in passed:
            warn(f"warning: {run_dir}: {e}; passed over (a --resume sets it aside)")
        return step, params
    raise ConfigError(f"--run-dir {run_dir}: no checkpoint reads back whole (updates "
                      f"{', '.join(str(e.step) for e in passed)}; the latest: {passed[0].why})")


def load_params(run_dir: str, step: int | None = None, best: bool = False):
    """`(step, params)` of a checkpoint (default: the latest) as host numpy arrays."""
    cfg, ckpts = load_run(run_dir)
    try:
        return readable_params(ckpts, run_dir, plan_lib.of_config(cfg).params_shapes(), step, best)
    finally:
        ckpts.close()
