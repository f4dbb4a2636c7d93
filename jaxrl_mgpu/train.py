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
from typing import Callable

import jaxrl_mgpu
# Only light imports here: environments (gymnax) start JAX's backend when imported, and
# `jax.distributed.initialize` must come first, so the rest is imported inside main().
from jaxrl_mgpu import compile_cache
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.cli import USER_ERRORS, fail, count
from jaxrl_mgpu.log import RunLog
from jaxrl_mgpu.result import Result
from jaxrl_mgpu.stop import StopSignal


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """Trains as the command line `argv` says. `started`: when the launch began, the zero of the
    summary's start-up times; by default this call (a run started from Python, a notebook or a
    test, must not count the time since the interpreter began)."""
    started = time.monotonic() if started is None else started
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        early = config_lib.distributed_before_parse(argv)
        if early is not None:  # the parse imports a user's algorithm, which may use JAX at once
            parallel.initialize(*early)
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
    cfg = config_lib.check_distributed(config_lib.build(given))
    _, warning = compile_cache.configure(cfg.compile_cache)  # before anything compiles
    if warning and not cfg.process_id:
        print(warning, file=sys.stderr)
    parallel.initialize(cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.local_device_ids,
                        cfg.failure_timeout)
    parallel.start_backend()  # on a thread, while the rest is imported
    from jaxrl_mgpu import plan as plan_lib, runner  # after jax.distributed (see above)
    plan = plan_lib.resolve(cfg, given)
    if plan.cfg.mode == "collect":
        return Result(collect(plan), plan.cfg.run_dir)
    return runner.run(plan, started, on_row)


def collect(plan) -> int:
    """`--mode collect`: no run directory of its own; it adds episodes (or, for --algo ad,
    learning histories) to `--run-dir`'s store."""
    cfg, par, asynchronous = plan.cfg, plan.par, plan.learner
    log = RunLog(None, 0)
    log.print(f"collector on {count(par.num_devices, par.devices[0].platform + ' device')}, "
              + asynchronous.collects(cfg)
              + f", store {cfg.run_dir}/store")
    stop = StopSignal(log)
    try:
        total = asynchronous.collect(plan, log, stop)
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
