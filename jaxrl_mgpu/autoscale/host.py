"""The host's part in runs whose environments step on its CPU cores (`host_batched`: Atari): how
many of their games this process keeps in the host's memory, the refusal of a run whose games
would not fit, and the simulator threads each device's batch gets where `--env-args` leaves
them to the project (threads=0). `--auto-scale` sizes such a run within both (autoscale/__init__.py).
"""

from __future__ import annotations

import dataclasses
import math

from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.cli import ConfigError, count

MEMORY_SHARE = 0.9  # of the host's available memory, the most this process's games may take


def bytes_per_game(env) -> int:
    """Host bytes one of `env`'s environments holds; 0 for an environment on the devices."""
    traits = envs_lib.traits(env)
    return traits.host_bytes_per_env if traits.host_batched else 0


def games_on_host(cfg, par, per_device: int) -> int:
    """The games this process keeps on its host at `per_device` environments per device and
    run: its devices' training batches for every run on them, and their share of evaluation's
    games (which live beside them)."""
    runs = par.runs_per_device if par.runs is not None else 1
    evaluation = math.ceil(cfg.eval_episodes / par.num_devices) if cfg.eval_every else 0
    return (per_device + evaluation) * runs * par.num_local_devices


def run_games(plan) -> int:
    """The games the plan's run keeps on this host (games_on_host at its --num-envs)."""
    return games_on_host(plan.cfg, plan.par, plan.cfg.num_envs // plan.par.data_devices)


def memory_budget() -> tuple[float, str]:
    """The host bytes this process's games may take, and where the number comes from."""
    available, source = parallel.host_memory()
    return MEMORY_SHARE * available, f"{MEMORY_SHARE:g} x the {available / 2**30:.1f} GiB of {source}"


def most_per_device(cfg, par, env) -> int | None:
    """The most environments per device whose games fit the host's memory budget; None where
    the environment is on the devices."""
    per_game = bytes_per_game(env)
    if not per_game:
        return None
    budget, _ = memory_budget()
    one, evaluation = games_on_host(cfg, par, 1), games_on_host(cfg, par, 0)
    return int((budget / per_game - evaluation) // (one - evaluation))


def check_memory(plan) -> None:
    """A ConfigError where the run's games on this host would not fit its memory budget (each
    game's state is made in the host's memory as the run starts: past the budget, the host
    would swap or kill the run)."""
    per_game = bytes_per_game(plan.env)
    if not per_game:
        return
    cfg, par = plan.cfg, plan.par
    games = run_games(plan)
    budget, source = memory_budget()
    if games * per_game > budget:
        most = max(most_per_device(cfg, par, plan.env), 0) * par.data_devices
        raise ConfigError(f"--num-envs {cfg.num_envs:,}: {games:,} {cfg.env} games on this host would take about "
                          f"{games * per_game / 2**30:.1f} GiB of its memory, more than {source}; give at most "
                          f"--num-envs {most:,} (or fewer --eval-episodes, or more hosts)")


def with_threads(plan, par):
    """The plan with its environment made with `threads` where the games step on the host and
    --env-args leaves the threads to the project (threads=0): the cores this process may use,
    shared by its devices, whose batches step at the same time (a device's runs step one after
    another). The config keeps its --env-args: the threads are this host's, as --devices is
    this invocation's (a resume on another host shares that host's cores), and they change no
    number (each game steps alone)."""
    cfg = plan.cfg
    if not bytes_per_game(plan.env) or envs_lib.parse_args(cfg.env, cfg.env_args).get("threads", 0):
        return plan
    each = max(1, parallel.host_cores() // par.num_local_devices)
    env, env_params = envs_lib.make(cfg.env, ",".join(filter(None, (cfg.env_args, f"threads={each}"))))
    return dataclasses.replace(plan, env=env, env_params=env_params)


def describe(plan) -> str | None:
    """The banner's line of the host's share, or None where the environment is on the devices
    (one on the host has `threads`, those of each device's batch)."""
    per_game = bytes_per_game(plan.env)
    if not per_game:
        return None
    games = run_games(plan)
    _, source = memory_budget()
    return (f"{count(parallel.host_cores(), 'core')}; {count(plan.env.threads, 'simulator thread')} per device's "
            f"batch of games; {count(games, 'game')} on this host, {games * per_game / 2**20:,.0f} MiB of its memory "
            f"budget ({source})")
