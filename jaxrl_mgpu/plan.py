"""A run, resolved once: its config, environment, algorithm spec, runs, devices and batch split.

`resolve(given)` turns a command line's (or a Python caller's, api.py) options into a `Plan`:
the config checked (a resumed run's own, with the changes a resume may make), the environment
made, the algorithm's spec chosen for it (algos.for_run: PPO on a multi-agent game is MAPPO),
--auto-scale's size chosen, the devices set up (with a runs axis for --num-seeds / --sweep) and
the batch split over them by the spec (or, for --mode learn|collect, by its asynchronous
session). Everything after it (the run directory, the trainer, the loop, evaluation, bench,
video) reads the plan; nothing resolves the environment, the algorithm or the runs again.

This module is imported once JAX's processes are set up (train.run): making an environment
starts JAX's backend. Tools that read a finished run's directory (evaluate, video) need no devices: `of_config(cfg)`
is the plan without them.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax

from jaxrl_mgpu import algos
from jaxrl_mgpu import autoscale
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu import multirun, parallel, rundir
from jaxrl_mgpu.algos import for_run
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit
from jaxrl_mgpu.algos.spec import Spec
from jaxrl_mgpu.asynchronous import collector
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.parallel import Parallel


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run resolved: what every later step reads."""
    cfg: Any                        # the validated config (config.Config)
    env: Any                        # the environment and its parameters (envs.make)
    env_params: Any
    spec: Spec                      # the algorithm that trains it (algos.for_run)
    runs: multirun.Runs | None      # --num-seeds / --sweep (None: one run)
    par: Parallel | None = None     # the devices (with a runs axis for many runs); None: a tool's plan
    split: BatchSplit | None = None  # the batch over `par`'s data devices
    notes: tuple[str, ...] = ()     # lines said under the banner (what a resume changed, ...)
    auto_scale_s: float = 0.0       # seconds --auto-scale searched before training

    @property
    def learner(self):
        """The spec's asynchronous session where this is a --mode learn|collect run, else None."""
        return self.spec.asynchronous if self.cfg.mode != "both" else None

    def algorithm(self) -> Algorithm:
        """The per-device algorithm the trainer compiles: the spec's, vmapped over the runs of a
        many-run plan (multirun.py), or the asynchronous learner's."""
        cfg, par, split = self.cfg, self.par, self.split
        if self.learner is not None:
            return self.learner.algorithm(cfg, par, split)
        if self.runs is not None:
            return multirun.algorithm(cfg, self.spec, self.env, self.env_params, split, par, self.runs)
        return self.spec.algorithm(cfg, self.env, self.env_params, split, par)

    def on(self, par: Parallel, cfg=None, **more) -> "Plan":
        """This plan on the devices `par` (with `cfg`: another size of the same run, as
        --auto-scale tries): a runs axis laid out beside the data axis for many runs, and the batch
        split over the data devices by the spec, or by its asynchronous session for --mode
        learn|collect (a ConfigError naming the option that does not split). `more`: the Plan's
        notes and auto_scale_s."""
        cfg = cfg or self.cfg
        if self.runs is not None and envs_lib.is_multi_agent(self.env):
            raise ConfigError(f"--num-seeds / --sweep: --env {cfg.env} is a multi-agent game; its teams train one "
                              f"run at a time")
        if cfg.mode != "both" and self.spec.asynchronous is None:
            raise ConfigError(f"--mode {cfg.mode}: --algo {cfg.algo} runs only as --mode both (learners and "
                              f"collectors: --algo {', '.join(n for n in algos.names() if algos.get(n).asynchronous)})")
        par = multirun.setup(cfg, par)
        check = self.spec.check if cfg.mode == "both" else self.spec.asynchronous.check
        return dataclasses.replace(self, cfg=cfg, par=par, split=check(cfg, par.data_devices), **more)

    def policy(self, cfg=None):
        """The algorithm's policy (nets.actor_critic.Policy) for `cfg` (default the plan's; a run of a
        sweep may differ in a number that shapes it), without building the algorithm."""
        return self.spec.policy(cfg or self.cfg, self.env, self.env_params)

    def params_shapes(self):
        """Shapes and dtypes of one run's params (no device or runs axis)."""
        return jax.eval_shape(self.policy().init_params, jax.random.PRNGKey(0))


def of_config(cfg) -> Plan:
    """The plan of a validated config without devices (a run directory's config, for the tools
    that read it)."""
    env, env_params = envs_lib.make(cfg.env, cfg.env_args)
    return Plan(cfg, env, env_params, for_run(cfg.algo, env), multirun.Runs.of(cfg))


def on_devices(cfg, par: Parallel, **more) -> Plan:
    """The plan of a validated config on the devices `par` (`more`: the Plan's notes and
    auto_scale_s)."""
    return of_config(cfg).on(par, **more)


def resolve(cfg, given: config_lib.Given) -> Plan:
    """The plan of the options `given` (a command line's or a Python caller's; `cfg`: their
    config, checked for the processes by train.run, which set JAX up before importing this
    module): a UserError for bad input, before anything is written."""
    cfg, changes = rundir.resolve(cfg, given)
    cfg, grid = config_lib.follow_log_grid(cfg, given.flags)
    notes = tuple(f"--resume: {change}" for change in changes) + tuple(grid)
    cfg = config_lib.validate(cfg)
    # a ConfigError naming the algorithms there are, before any option's "applies to"
    config_lib.check_applicable(cfg, given, algos.get(cfg.algo).reads)
    if cfg.mode == "collect":
        if not cfg.run_dir:
            raise ConfigError("--mode collect needs --run-dir: the run whose store it fills")
        collector.check_run_dir(cfg)  # not a run of another algorithm, nor a finished one
    par = parallel.setup(cfg.parallel, cfg.devices)
    config_lib.check_platform(cfg, par.devices[0].platform)
    plan = of_config(cfg)
    resuming = bool(cfg.resume and cfg.run_dir and (Path(cfg.run_dir) / "config.json").exists())
    if not cfg.auto_scale or resuming:  # a resumed run keeps the size its config.json holds
        return plan.on(par, notes=notes)
    from_s = time.monotonic()
    cfg, _ = autoscale.choose(plan, par)
    return plan.on(par, cfg, notes=notes, auto_scale_s=time.monotonic() - from_s)
