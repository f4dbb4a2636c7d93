"""A training run, put together: the run directory and its start (rundir.py), the trainer
(chunks.py), the loop (loop.py) with what the plan's session (session.py) does between chunks,
and the summary. One path for every mode: a `--mode learn` learner differs only in its session,
whose data source is fed by collectors (asynchronous/).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Callable

import jax

from jaxrl_mgpu import compile_cache, parallel, session as session_lib, tracking
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu.autoscale import host
from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.chunks import ChunkReader, NonFinite, Trainer
from jaxrl_mgpu.cli import count
from jaxrl_mgpu.log import RunLog, diverged_runs, read_rows
from jaxrl_mgpu.loop import Loop
from jaxrl_mgpu.plan import Plan
from jaxrl_mgpu.result import Result
from jaxrl_mgpu.rundir import check_writable, ending, open_run
from jaxrl_mgpu.session import Session
from jaxrl_mgpu.stop import StopSignal
from jaxrl_mgpu.tracing import Profile


def banner(plan: Plan, per_update: str) -> dict:
    """The start-up summary of the distributed setup: a line per quantity of the algorithm's
    split of the batch over the devices (its spec's `check`)."""
    cfg, par, spec, runs = plan.cfg, plan.par, plan.spec, plan.runs
    device = par.devices[0]
    rows = {
        "jaxrl_mgpu": f"{cfg.algo} on {cfg.env}" + (f", policy {cfg.policy}" if config_lib.uses(cfg, "policy") else "")
                      + ("" if cfg.mode == "both" else f", --mode {cfg.mode}"),
        "processes": f"{jax.process_count()} (this is process {jax.process_index()})",
        "devices": f"{par.num_local_devices} local, {par.num_devices} global: "
                   f"{getattr(device, 'device_kind', device.platform)} ({device.platform})",
        "parallel": f"{par.backend} over axis '{parallel.AXIS}'",
    }
    if runs is not None:
        rows["runs"] = (f"{runs.count}: {len(runs.grid)} configuration(s) x {runs.seeds} seed(s) from {cfg.seed}; "
                        f"{count(par.groups, 'group')} of {count(par.data_devices, 'device')} on axis '{parallel.RUNS}', "
                        f"{par.runs_per_device} run(s) per device")
        if runs.names:
            rows["sweep"] = cfg.sweep
    each = "" if runs is None else " per run"
    rows.update({what: f"{total} global{each}, {per_device} per device{each}"
                 for what, (total, per_device) in plan.split.rows().items()})
    if (on_host := host.describe(plan)) is not None:  # games stepped on this host's cores (Atari)
        rows["host"] = on_host
    if cfg.auto_scale:
        size = spec.options.size
        rows["auto-scale"] = (f"{cfg.auto_scale}: --{size.replace('_', '-')} {getattr(cfg, size)} chosen at the "
                              f"run's start (kept on resume); {spec.auto_scale_keeps}")
    rows.update({
        "per update": per_update,
        "updates": f"{cfg.total_updates}, {cfg.log_every} per compiled chunk",
        "precision": f"{cfg.precision} compute, fp32 params" + (f", {cfg.grad_accum} micro-batches per step"
                                                                if cfg.grad_accum > 1 else ""),
        **({"kernels": f"attention {cfg.attention}, mlp {cfg.mlp}"
                       + ("" if device.platform == "gpu" or "pallas" not in (cfg.attention, cfg.mlp)
                          else f" (no GPU: the Pallas kernels run through the Pallas interpreter on "
                               f"{device.platform}, correct but slow)")}
           if (cfg.attention, cfg.mlp) != ("xla", "xla") else {}),
        "compile cache": compile_cache.directory() or "off",
        "run dir": cfg.run_dir,
    })
    return rows


def run(plan: Plan, started: float, on_row: Callable[[dict], None] | None = None) -> Result:
    """Trains the plan in its run directory, from its newest whole checkpoint with `--resume`.
    `started`: the `time.monotonic()` the launch began at, the zero of the start-up times;
    `on_row`: a caller's, given each log row."""
    entered = time.monotonic()
    if plan.cfg.profile:
        check_writable(Path(plan.cfg.profile), "--profile")
    session = session_lib.for_plan(plan)

    def build(cfg):
        trainer = Trainer(dataclasses.replace(plan, cfg=cfg))
        return trainer, trainer.init_state() if session.eager_state else None

    tracker = tracking.connect(plan.cfg)  # before anything is written: a tracker that is down is one line
    run_dir, begun = open_run(plan.cfg, build, *plan.progress())
    if begun is None:
        return Result(0, str(run_dir))  # already complete
    trainer, state, step = begun.trainer, begun.state, begun.update
    plan = trainer.plan
    log = open_log(plan, trainer, run_dir, session, list(plan.notes) + begun.set_aside)
    if tracker is not None:
        described = None if plan.runs is None else [plan.runs.describe(i) for i in range(plan.runs.count)]
        tracker.start(run_dir, json.loads(config_lib.dump(plan.cfg)), described, trainer.step_unit, facts(plan))
        log.track = tracker.log
    if step is None and plan.cfg.resume == "auto":
        log.print("  --resume auto: no checkpoint yet, starting fresh")
    log.timeline["imports_and_devices_s"] = entered - started - plan.auto_scale_s
    if plan.auto_scale_s:
        log.timeline["auto_scale_s"] = plan.auto_scale_s
    log.timeline["setup_s"] = time.monotonic() - entered  # algorithm, initial state, restore, log files
    if tracker is None:
        return train(plan, session, trainer, state, step, begun.recreated, log, on_row)
    try:
        result = train(plan, session, trainer, state, step, begun.recreated, log, on_row)
    except BaseException:
        tracker.finish([], "FAILED")
        raise
    complete = result.updates >= plan.cfg.total_updates
    tracker.finish([run_dir / name for name in ("summary.json", "runs_summary.json", "learning_curves.png")],
                   "FAILED" if result.code else "FINISHED" if complete else "KILLED")
    return result


def facts(plan: Plan) -> dict:
    """What the start-up banner says of where the run runs, as the trackers' tags."""
    device = plan.par.devices[0]
    card = getattr(device, "device_kind", device.platform)
    return {"devices": plan.par.num_devices, "hosts": jax.process_count(), "card": card, "platform": device.platform,
            "version": jaxrl_mgpu_version(), "commit": tracking.git_commit() or "unknown"}


def jaxrl_mgpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("jaxrl_mgpu")
    except PackageNotFoundError:
        return "unknown"


def open_log(plan: Plan, trainer: Trainer, run_dir: Path, session: Session, notes: list[str]) -> RunLog:
    """The run's log (process 0 writes it), its banner and the lines under it."""
    cfg, runs, per_update = plan.cfg, plan.runs, session.per_update(plan)
    described = None if runs is None else [runs.describe(i) for i in range(runs.count)]
    log = RunLog(run_dir, cfg.steps_at(cfg.total_updates, trainer.steps_per_update), unit=trainer.step_unit,
                 episodic=trainer.algorithm.episodic, runs=described, console=plan.spec.console, rate=session.rate)
    log.banner(banner(plan, per_update or f"{trainer.steps_per_update:,} {trainer.step_unit}"))
    for note in notes:
        log.print(f"  {note}")
    return log


def train(plan: Plan, session: Session, trainer: Trainer, state, step: int | None, recreated: list[str],
          log: RunLog, on_row: Callable[[dict], None] | None = None) -> Result:
    """The loop from checkpoint `step` (None: the start) with the session's source and callbacks,
    the session's end and the summary; `on_row` gets each row written."""
    cfg = plan.cfg
    run_dir, start_update, runs = Path(cfg.run_dir), step or 0, plan.runs
    ckpts = Checkpoints(run_dir, keep=cfg.keep_checkpoints)
    agents = trainer.algorithm.agents_per_env

    written: dict = {}  # the last row as written: a learner's session rewrites the loop's (its episodes arrive apart)

    def write(row: dict) -> None:
        if agents > 1:  # a multi-agent game's env step is `agents` agent steps
            row["agent_sps"] = row["sps"] * agents
        log.write(row)
        written.clear()
        written.update(row)
        if on_row is not None and parallel.is_main():
            on_row(dict(row))

    def say_diverged(run: int, update: int, so_far: int) -> None:
        who = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in runs.describe(run).items())
        log.print(f"  {who}: non-finite loss or parameters at update {update}; this run stops learning there (its "
                  f"last finite parameters go on acting), the other {runs.count - so_far} go on")

    stop = StopSignal(log, kept=ckpts.any_complete)
    t_start, opened = time.perf_counter(), None
    try:
        opened = session.open(plan, trainer, ckpts, log, write, stop, step, state, recreated)
        callbacks = opened.callbacks._replace(profile=profile(cfg, start_update, trainer.end(cfg.stop_at_update), log))
        # A resumed run's diverged runs (their frozen state is in the checkpoint) keep the update
        # where they went non-finite, from the rows logged before it.
        diverged = diverged_runs(read_rows(run_dir / "metrics.jsonl")) if runs else {}
        reader = ChunkReader(trainer.par, diverged, say_diverged if runs else None,
                             on_growth=lambda text: log.print(f"  warning: {text}"))
        state, last, done = Loop(trainer, log, opened.source, callbacks, start_update, cfg.stop_at_update, reader,
                                 opened.saved).run(state)
        last = dict(written) or last
        opened.finish(done, state, done < cfg.total_updates)
    except NonFinite as e:
        if opened is not None:
            opened.close()  # a publication in flight, on a thread of its own, is in the checkpoints
        ckpts.wait()
        last_good = ckpts.latest_step()
        where = (f"the last good checkpoint is at update {last_good}; continue from it with --resume and a smaller "
                 f"--lr" if last_good is not None else "no checkpoint was saved before it")
        print(f"error: {e}; stopped, {where}", file=sys.stderr)
        return Result(1, str(run_dir))
    finally:
        if opened is not None:
            opened.close()
        stop.restore()
        log.close()
        ckpts.close()  # waits for the asynchronous saves
    if done < cfg.total_updates:
        log.print(f"stopped at update {done} of {cfg.total_updates} with a checkpoint; continue with --resume")
    unit, steps = opened.progress(last, done)
    ending(plan, log, last, done, unit, steps, time.perf_counter() - t_start, run_dir)
    return Result(0, str(run_dir), state, last, done)


def profile(cfg, start_update: int, end: int, log: RunLog) -> Profile | None:
    """--profile: two log intervals, by default those after the first (compiling and warming up
    left out), or from --profile-from."""
    if not cfg.profile:
        return None
    first = (start_update + cfg.log_every - start_update % cfg.log_every if cfg.profile_from is None
             else cfg.profile_from)
    return Profile(cfg.profile, first, first + 2 * cfg.log_every, start_update, end, log)
