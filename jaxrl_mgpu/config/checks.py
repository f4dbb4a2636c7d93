"""The checks of a whole config that need more than one option, once, before anything is
built: `validate`, the many-runs options (`--sweep`), the log grid, the kernels, the platform."""

from __future__ import annotations

import dataclasses
import re

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config.declare import TRACKERS
from jaxrl_mgpu.config.catalogue import check_value, fields_of, flag, known_options, sweepable
from jaxrl_mgpu.config.options import Config, algo_options


def parse_sweep(cfg: Config) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """--sweep as ((name, values), ...) in the order given, or a ConfigError naming the bad part."""
    allowed = sweepable(cfg)
    out: dict[str, tuple[float, ...]] = {}
    for item in (cfg.sweep or "").split():
        name, eq, text = item.partition("=")
        name = name.lstrip("-").replace("-", "_")
        flag = "--" + name.replace("_", "-")
        if not eq or not text:
            raise ConfigError(f"--sweep {item!r}: write NAME=v1,v2,... (e.g. lr=1e-3,3e-4)")
        if name not in known_options() or known_options()[name].internal or name in ("sweep", "config"):
            raise ConfigError(f"--sweep {name}: no such option; --algo {cfg.algo} sweeps {', '.join(allowed)}")
        if name not in allowed:
            raise ConfigError(f"--sweep {name}: {flag} changes the compiled program (its shapes or code) or is not "
                              f"used by --algo {cfg.algo}; sweepable: {', '.join(allowed)}; run other values of "
                              f"{flag} as separate programs")
        if name in out:
            raise ConfigError(f"--sweep {name} is given twice")
        try:
            values = tuple(float(v) for v in text.split(","))
        except ValueError:
            raise ConfigError(f"--sweep {name}={text}: the values must be numbers separated by commas") from None
        for v in values:
            try:
                check_value(name, v)
            except ConfigError as e:
                raise ConfigError(f"--sweep {name}={text}: {e}") from None
        if len(set(values)) < len(values):
            raise ConfigError(f"--sweep {name}={text}: a value is repeated")
        out[name] = values
    return tuple(out.items())


def check_multirun(cfg: Config) -> None:
    """What --num-seeds / --sweep train (multirun.py): --mode both PPO (MLP) and DQN runs."""
    if cfg.num_seeds == 1 and not cfg.sweep:
        return
    what = "--num-seeds / --sweep"
    if algo_options(cfg).single_run:
        raise ConfigError(f"{what}: {algo_options(cfg).single_run}")
    if cfg.mode != "both":
        raise ConfigError(f"{what} train in --mode both; --mode {cfg.mode} processes share one run")
    if cfg.auto_scale:
        raise ConfigError(f"{what}: --auto-scale sizes one run; give --num-envs (per run)")
    if cfg.policy == "transformer":
        raise ConfigError(f"{what}: --policy transformer is not supported for many runs yet (untested); use "
                          f"--policy mlp")
    if cfg.eval_every:
        raise ConfigError(f"{what}: --eval-every is not supported for many runs yet; evaluate the runs after "
                          f"training with python -m jaxrl_mgpu.evaluate")
    parse_sweep(cfg)


def validate(cfg: Config) -> Config:
    """The checks of a whole config that need neither the environment nor the devices (those
    are the plan's, plan.py, and the algorithm's `check`)."""
    for name in fields_of(cfg):
        check_value(name, getattr(cfg, name))
    for name in GRID:
        if getattr(cfg, name) % cfg.log_every:
            raise ConfigError(f"{flag(name)} {getattr(cfg, name)} must be 0 or a multiple of --log-every "
                              f"{cfg.log_every} (checkpoints and evaluations happen between compiled chunks, at log "
                              f"points)")
    if cfg.auto_scale and cfg.mode != "both":
        raise ConfigError(f"--auto-scale sizes a --mode both run; --mode {cfg.mode} processes share one run's "
                          f"sizes: give --num-envs")
    if cfg.resume and not cfg.run_dir:
        raise ConfigError("--resume needs --run-dir: the directory of the run to continue")
    if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
        raise ConfigError(f"--d-model {cfg.d_model} / --n-heads {cfg.n_heads} must be an even whole number "
                          f"(the head size)")
    check_collector_id(cfg.collector_id)
    if cfg.track is not None:
        given = [name.strip() for name in cfg.track.split(",")]
        if not set(given) <= set(TRACKERS) or len(set(given)) != len(given):
            raise ConfigError(f"--track {cfg.track}: a comma list of {', '.join(TRACKERS)}, each at most once")
    check_multirun(cfg)
    if cfg.total_updates < 1:
        raise ConfigError(f"--total-timesteps {cfg.total_timesteps} is less than one update of "
                          f"{cfg.batch_size} steps (--num-envs x --num-steps)")
    return cfg


# A collector's id is part of the name of every shard it writes (`<time>-<id>-<random>`, one
# directory of the store): a '/' in it would nest its shards in folders the learner never lists.
COLLECTOR_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")


def check_collector_id(name: str | None) -> None:
    """--collector-id: one file-name component (letters, digits, '-', '_', '.'; not starting with
    '.'; at most 64 characters), or a ConfigError."""
    if name is not None and not COLLECTOR_ID.fullmatch(name):
        raise ConfigError(f"--collector-id {name!r}: use 1 to 64 letters, digits, '-', '_' or '.' (not first): it "
                          f"becomes part of the file name of every shard the collector writes")


GRID = ("checkpoint_every", "eval_every")  # options that act between chunks, on multiples of --log-every


def follow_log_grid(cfg: Config, flags: set[str] | frozenset[str]) -> tuple[Config, list[str]]:
    """Checkpoints and evaluations happen at log points, so their intervals are multiples of
    --log-every. One the user did not give on this command line (its default, a preset's or
    the resumed run's) follows the grid: the first multiple at or after it, with a line that
    says so; one the user gave that is off the grid is a ConfigError."""
    notes, changes = [], {}
    for name in GRID:
        value = getattr(cfg, name)
        if not value or value % cfg.log_every == 0:
            continue
        if name in flags:
            raise ConfigError(f"{flag(name)} {value} must be 0 or a multiple of --log-every {cfg.log_every} "
                              f"(checkpoints and evaluations happen between compiled chunks, at log points)")
        changes[name] = -(-value // cfg.log_every) * cfg.log_every
        notes.append(f"{flag(name)} {changes[name]}: its value {value} is not a multiple of --log-every "
                     f"{cfg.log_every}, so it follows the log points")
    return dataclasses.replace(cfg, **changes), notes


def check_platform(cfg: Config, platform: str) -> None:
    """What the devices must be for --attention (checked once they are known: asking jax for them
    any earlier would initialise it before jax.distributed). The Pallas kernels run anywhere
    (the Pallas interpreter off GPUs: correct, slow); cuDNN's flash attention needs NVIDIA GPUs."""
    if cfg.attention == "cudnn" and platform != "gpu":
        raise ConfigError(f"--attention cudnn is cuDNN's flash attention, for NVIDIA GPUs; this run's devices "
                          f"are {platform}: use --attention xla")
