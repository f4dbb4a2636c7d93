"""A run, resolved once: its config, environment, algorithm spec, runs, devices and batch split.

`resolve(given)` turns a command line's (or a Python caller's, api.py) options into a `Plan`:
the config checked (a resumed run's own, with the changes a resume may make), the environment
made, the algorithm's spec chosen for it (`spec_for`: PPO on a multi-agent game is MAPPO),
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
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Progress
from jaxrl_mgpu.algos.spec import Spec
from jaxrl_mgpu.asynchronous import collector
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.nets import fused_attention, fused_mlp
from jaxrl_mgpu.parallel import Parallel


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run resolved: what every later step reads, and what an algorithm is built from (it
    is an algos.base.Resolved)."""
    cfg: Any                        # the validated config (config.Config)
    env: Any                        # the environment and its parameters (envs.make)
    env_params: Any
    spec: Spec                      # the algorithm that trains it (spec_for)
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
        if self.learner is not None:
            return self.learner.algorithm(self)
        if self.runs is not None:
            return multirun.algorithm(self, self.spec, self.runs)
        return self.spec.algorithm(self)

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
        check_kernels(cfg, self.spec.attention_window(cfg) if self.spec.attention_window else None)
        par = multirun.setup(cfg, par)
        check = self.spec.check if cfg.mode == "both" else self.spec.asynchronous.check
        unsplit = dataclasses.replace(self, cfg=cfg, par=par, split=None)
        split = check(unsplit, par.data_devices)
        # Each --sweep configuration is a config of its own: its values too must pass the checks
        # that relate options (--v-max above --v-min), which checking each value alone cannot.
        for values in (self.runs.configurations() if self.runs is not None else ()):
            try:
                check(dataclasses.replace(unsplit, cfg=dataclasses.replace(cfg, **values)), par.data_devices)
            except ConfigError as e:
                raise ConfigError(f"--sweep {' '.join(f'{k}={v:g}' for k, v in values.items())}: {e}") from None
        return dataclasses.replace(unsplit, split=split, **more)

    def progress(self) -> Progress:
        """How its progress is counted: its spec's unit and steps per update, or a --mode learn
        learner's iterations."""
        if self.learner is not None:
            return Progress("update", 1)
        return Progress(self.spec.step_unit, self.spec.steps_per_update(self.cfg))

    def with_config(self, cfg) -> "Plan":
        """This plan for another config of the same run (a run of a sweep, which may differ in a
        number that shapes the algorithm)."""
        return dataclasses.replace(self, cfg=cfg)

    def policy(self, cfg=None):
        """The algorithm's policy (nets.actor_critic.Policy) for `cfg` (default the plan's),
        without building the algorithm."""
        return self.spec.policy(self if cfg is None else self.with_config(cfg))

    def evaluation(self):
        """How the algorithm's policy plays evaluation episodes where not as
        episodes.make_episodes plays them (algos.base.Evaluation; None: as it does)."""
        return None if self.spec.evaluation is None else self.spec.evaluation(self)

    def params_shapes(self):
        """Shapes and dtypes of one run's params (no device or runs axis)."""
        return jax.eval_shape(self.policy().init_params, jax.random.PRNGKey(0))


def spec_for(cfg, env) -> Spec:
    """The spec `--algo` trains `env` with: on a multi-agent game, the algorithm's multi-agent
    spec (PPO's is multi-agent PPO), the one place that choice is made."""
    spec = algos.get(cfg.algo)
    if not envs_lib.is_multi_agent(env):
        return spec
    if spec.multi_agent is None:
        able = [n for n in algos.names() if algos.get(n).multi_agent is not None]
        raise ConfigError(f"--env {cfg.env} is a multi-agent game: it trains with --algo {' or '.join(able)} "
                          f"--policy mlp (one network per team) in --mode both, without --normalize-reward")
    return spec.multi_agent


def check_kernels(cfg, window: int | None) -> None:
    """--attention / --mlp: what the fused kernels take (they run in bf16/fp16 only). `window`:
    the tokens the algorithm's learner attends over whole, without a cache (its spec's
    attention_window), which --attention pallas fuses; None: it attends over a cached prefix."""
    if not config_lib.uses(cfg, "attention"):
        return
    if cfg.attention == "cudnn" and jax.default_backend() != "gpu":  # before the precision: it would not help
        raise ConfigError(f"--attention cudnn is cuDNN's flash attention, for NVIDIA GPUs; this run's devices are "
                          f"{jax.default_backend()}: use --attention xla")
    if (cfg.attention, cfg.mlp) != ("xla", "xla") and cfg.precision == "fp32":
        raise ConfigError(f"--attention {cfg.attention} / --mlp {cfg.mlp}: the fused kernels compute in "
                          f"bf16 or fp16; add --precision bf16")
    if cfg.mlp == "pallas" and not fused_mlp.supported(cfg.d_model, 4 * cfg.d_model):
        raise ConfigError(f"--mlp pallas needs --d-model a power of 2 from 16 to {fused_mlp.MAX_D_MODEL}, "
                          f"got {cfg.d_model}")
    if cfg.attention == "pallas":
        if window is None:
            able = [n for n in algos.names() if algos.get(n).attention_window is not None]
            raise ConfigError(f"--attention pallas fuses the cache-free learner of --algo {' or '.join(able)}; "
                              f"--algo {cfg.algo}'s learner attends over a key/value prefix: use --attention xla or "
                              f"cudnn")
        if not fused_attention.supported(window, cfg.d_model // cfg.n_heads, cfg.d_model):
            raise ConfigError(f"--attention pallas takes windows of at most {fused_attention.MAX_LEN} tokens, "
                              f"--d-model a power of 2 from 16 to {fused_attention.MAX_D_MODEL} and a head size "
                              f"(--d-model / --n-heads) that is a multiple of 32 up to 128; got {window} "
                              f"tokens, d_model {cfg.d_model} and head size {cfg.d_model // cfg.n_heads}")


def of_config(cfg) -> Plan:
    """The plan of a validated config without devices (a run directory's config, for the tools
    that read it): its environment made (a ConfigError for a bad --env or --env-args) and its
    algorithm's spec chosen for it."""
    envs_lib.check(cfg.env)
    env, env_params = envs_lib.make(cfg.env, cfg.env_args)
    return Plan(cfg, env, env_params, spec_for(cfg, env), multirun.Runs.of(cfg))


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
    if getattr(given, "dropped", ()):
        notes += (f"--algo {cfg.algo} leaves out what --config {cfg.config} sets for its own algorithm: "
                  f"{', '.join(config_lib.flag(name) for name in given.dropped)}",)
    cfg = config_lib.validate(cfg)
    plan = of_config(cfg)  # the environment and the algorithm's spec for it, checked
    config_lib.check_applicable(cfg, given)
    if cfg.mode == "learn" and not cfg.run_dir:  # its collectors find the store by the directory's name
        raise ConfigError("--mode learn needs --run-dir: the directory whose store its --mode collect processes fill")
    if cfg.mode == "collect":
        if not cfg.run_dir:
            raise ConfigError("--mode collect needs --run-dir: the run whose store it fills")
        collector.check_run_dir(cfg)  # not a run of another algorithm, nor a finished one
    par = parallel.setup(cfg.parallel, cfg.devices)
    config_lib.check_platform(cfg, par.devices[0].platform)
    plan = autoscale.host.with_threads(plan, par)
    resuming = bool(cfg.resume and cfg.run_dir and (Path(cfg.run_dir) / "config.json").exists())
    if not cfg.auto_scale or resuming:  # a resumed run keeps the size its config.json holds
        resolved = plan.on(par, notes=notes)
    else:
        rundir.check_free(cfg)
        from_s = time.monotonic()
        cfg, _ = autoscale.choose(plan, par)
        resolved = plan.on(par, cfg, notes=notes, auto_scale_s=time.monotonic() - from_s)
    autoscale.host.check_memory(resolved)
    return resolved
