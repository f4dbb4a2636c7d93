"""`python -m jaxrl_mgpu.train`: command line -> config -> devices -> runner.

With no arguments it trains PPO on CartPole-v1 on all local devices. The same command with
`--resume` continues the run in `--run-dir` from its latest complete checkpoint, with the
run's own settings (its config.json; config.resumable says what a resume may change).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import jaxrl_mgpu
# Only light imports here: environments (gymnax) start JAX's backend when imported, and
# `jax.distributed.initialize` must come first, so the rest is imported inside main().
from jaxrl_mgpu import compile_cache
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.cli import USER_ERRORS, fail, count
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.log import RunLog
from jaxrl_mgpu.result import Result
from jaxrl_mgpu.stop import StopSignal


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """Trains as the command line `argv` says. `started`: when the launch began, the zero of the
    summary's start-up times; by default this call (a run started from Python, a notebook or a
    test, must not count the time since the interpreter began)."""
    started = time.monotonic() if started is None else started
    try:
        return run(config_lib.parse_given(argv), started).code
    except USER_ERRORS as e:
        fail(e)
    except KeyboardInterrupt:  # Ctrl-C before training began (once it has, stop.py handles it)
        print("interrupted before training began", file=sys.stderr)
        return 128 + signal.SIGINT


def run(given: config_lib.Given, started: float, on_row: Callable[[dict], None] | None = None) -> Result:
    """Trains with the options `given` (a command line's or a Python caller's, api.train); a
    UserError for bad input, before anything is written. `on_row(row)` gets each log row as
    metrics.jsonl does (process 0)."""
    cfg = config_lib.check_distributed(config_lib.Config(**given))
    _, warning = compile_cache.configure(cfg.compile_cache)  # before anything compiles
    if warning and not cfg.process_id:
        print(warning, file=sys.stderr)
    parallel.initialize(cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.local_device_ids,
                        cfg.failure_timeout)
    parallel.start_backend()  # on a thread, while the rest is imported
    from jaxrl_mgpu import asynchronous, autoscale, multirun, rundir, runner  # after jax.distributed (see above)
    from jaxrl_mgpu.algos import spec_for
    cfg, changes = rundir.resolve(cfg, given)
    cfg, grid = config_lib.follow_log_grid(cfg, given.flags)
    notes = [f"--resume: {change}" for change in changes] + grid  # said under the banner
    cfg = config_lib.validate(cfg)
    config_lib.check_applicable(cfg, given)
    # --mode learn|collect: DQN from episodes, or AD from learning histories, in the run's store
    par = parallel.setup(cfg.parallel, cfg.devices)
    config_lib.check_platform(cfg, par.devices[0].platform)
    learn_collect = asynchronous.for_algo(cfg.algo)
    resuming = bool(cfg.resume and cfg.run_dir and (Path(cfg.run_dir) / "config.json").exists())
    searched_s = 0.0  # the summary's auto_scale_s, apart from the imports and devices before it
    if cfg.auto_scale and not resuming:  # a resumed run keeps the size its config.json holds
        t = time.monotonic()
        cfg, _ = autoscale.choose(cfg, par, spec_for(cfg))
        searched_s = time.monotonic() - t
    par = multirun.setup(cfg, par)  # --num-seeds / --sweep: a runs axis beside the data axis
    split = (spec_for(cfg).check if cfg.mode == "both" else learn_collect.check)(cfg, par.data_devices)
    if cfg.mode == "collect":
        if not cfg.run_dir:
            raise ConfigError("--mode collect needs --run-dir: the run whose store it fills")
        return Result(collect(cfg, par, split, learn_collect), cfg.run_dir)
    return runner.run(cfg, par, split, notes, started, learn_collect, auto_scale_s=searched_s, on_row=on_row)


def collect(cfg, par, split, asynchronous) -> int:
    """`--mode collect`: no run directory of its own; it adds episodes (or, for --algo ad,
    learning histories) to `--run-dir`'s store."""
    log = RunLog(None, 0)
    log.print(f"collector on {count(par.num_devices, par.devices[0].platform + ' device')}, "
              + asynchronous.collects(cfg)
              + f", store {cfg.run_dir}/store")
    stop = StopSignal(log)
    try:
        total = asynchronous.collect(cfg, par, split, log, stop)
    finally:
        stop.restore()
    log.print(f"collector done: {total:,} env steps written")
    return 0


if __name__ == "__main__":
    code = main(started=jaxrl_mgpu.STARTED)  # since the package's import: jax's too
    if code == 0:
        parallel.leave_job()
    # Everything is written and closed by now (logs, checkpoints): skip the interpreter's
    # teardown of JAX's runtime, which takes seconds on a GPU.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
