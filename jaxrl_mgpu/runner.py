"""A training run, put together: the run directory and its start (rundir.py), the trainer
(chunks.py), the loop (loop.py) with what it does between chunks, and the summary.

`--mode both` rolls out and learns on the devices; a `--mode learn` learner learns from what
collectors send (asynchronous/), through the same loop: its feed is the loop's data source.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

import jax

from jaxrl_mgpu import compile_cache, multirun, parallel, runstats
from jaxrl_mgpu.algos import spec_for
from jaxrl_mgpu.algos.base import BatchSplit
from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.chunks import NonFinite, Trainer
from jaxrl_mgpu.cli import count
from jaxrl_mgpu.log import RunLog
from jaxrl_mgpu.loop import Callbacks, Loop, OnDevice
from jaxrl_mgpu.parallel import Parallel
from jaxrl_mgpu.result import Result
from jaxrl_mgpu.rundir import check_writable, ending, plan_run_dir, prepare, start
from jaxrl_mgpu.stop import StopSignal
from jaxrl_mgpu.tracing import Profile


def banner(cfg, par: Parallel, split: BatchSplit, per_update: str) -> dict:
    """The start-up summary of the distributed setup. `split` is the algorithm's
    split of the batch over the devices (its spec's `check`), a line per quantity."""
    device, spec = par.devices[0], spec_for(cfg)
    rows = {
        "jaxrl_mgpu": f"{cfg.algo} on {cfg.env}" + (f", policy {cfg.policy}" if spec.takes_policy else "")
                      + ("" if cfg.mode == "both" else f", --mode {cfg.mode}"),
        "processes": f"{jax.process_count()} (this is process {jax.process_index()})",
        "devices": f"{par.num_local_devices} local, {par.num_devices} global: "
                   f"{getattr(device, 'device_kind', device.platform)} ({device.platform})",
        "parallel": f"{par.backend} over axis '{parallel.AXIS}'",
    }
    runs = multirun.Runs.of(cfg)
    if runs is not None:
        rows["runs"] = (f"{runs.count}: {len(runs.grid)} configuration(s) x {runs.seeds} seed(s) from {cfg.seed}; "
                        f"{count(par.groups, 'group')} of {count(par.data_devices, 'device')} on axis '{parallel.RUNS}', "
                        f"{par.runs_per_device} run(s) per device")
        if runs.names:
            rows["sweep"] = cfg.sweep
    each = "" if runs is None else " per run"
    rows.update({what: f"{total} global{each}, {per_device} per device{each}"
                 for what, (total, per_device) in split.rows().items()})
    if cfg.auto_scale:
        size = spec.size_option
        rows["auto-scale"] = (f"{cfg.auto_scale}: --{size.replace('_', '-')} {getattr(cfg, size)} chosen at the "
                              f"run's start (kept on resume); minibatch count, epochs and lr as configured, so "
                              f"minibatches grow with the batch")
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


def run(cfg, par: Parallel, split: BatchSplit, notes: list[str], started: float, asynchronous=None,
        auto_scale_s: float = 0.0, on_row: Callable[[dict], None] | None = None) -> Result:
    """Trains in the run directory, from its newest whole checkpoint with `--resume`: `--mode
    both`, or a `--mode learn` learner fed by `asynchronous` (asynchronous/dqn.py or ad.py).
    `notes`: lines said under the banner (what a resume changed, what followed the log points);
    `started`: the `time.monotonic()` the launch began at, the zero of the start-up times;
    `auto_scale_s`: the seconds --auto-scale searched before this (the summary's own line);
    `on_row`: a caller's, given each log row."""
    entered = time.monotonic()
    run_dir, step = plan_run_dir(cfg)
    if cfg.profile:
        check_writable(Path(cfg.profile), "--profile")
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    from_store = cfg.mode == "learn"

    def build(cfg):
        trainer = Trainer(cfg, par, asynchronous.algorithm(cfg, par, split) if from_store else None, split)
        # A learner publishes its initial state for the collectors before it compiles.
        return trainer, trainer.init_state() if from_store else None

    begun = start(cfg, run_dir, step, build, from_store)
    if begun is None:
        return Result(0, str(run_dir))  # already complete
    cfg, trainer, state, step = begun.cfg, begun.trainer, begun.state, begun.update
    prepare(cfg, run_dir, step)
    log = open_log(cfg, trainer, run_dir, split, asynchronous.per_update(cfg) if from_store else None,
                   notes + begun.set_aside)
    if step is None and cfg.resume == "auto":
        log.print("  --resume auto: no checkpoint yet, starting fresh")
    if step is not None and not from_store:  # (a learner says where it resumed: asynchronous/checkpoints.py)
        log.print(f"  resumed from the checkpoint at update {step} ({cfg.resumed_steps:,} {trainer.step_unit})"
                  + (f"; re-created {', '.join(begun.recreated)} (the saved ones do not fit "
                     f"{count(trainer.par.num_devices, 'device')} x {cfg.num_envs} envs)" if begun.recreated else ""))
    log.timeline["imports_and_devices_s"] = entered - started - auto_scale_s
    if auto_scale_s:
        log.timeline["auto_scale_s"] = auto_scale_s
    log.timeline["setup_s"] = time.monotonic() - entered  # algorithm, initial state, restore, log files
    return train(cfg, trainer, state, step, log, split, asynchronous if from_store else None, on_row)


def open_log(cfg, trainer: Trainer, run_dir: Path, split: BatchSplit, per_update: str | None, notes: list[str]) -> RunLog:
    """The run's log (process 0 writes it), its banner and the lines under it."""
    runs = None if trainer.runs is None else [trainer.runs.describe(i) for i in range(trainer.runs.count)]
    log = RunLog(run_dir, cfg.steps_at(cfg.total_updates, trainer.steps_per_update), unit=trainer.step_unit,
                 episodic=trainer.algorithm.episodic, runs=runs, console=spec_for(cfg).console)
    log.banner(banner(cfg, trainer.par, split, per_update or f"{trainer.steps_per_update:,} {trainer.step_unit}"))
    for note in notes:
        log.print(f"  {note}")
    return log


def train(cfg, trainer: Trainer, state, step: int | None, log: RunLog, split: BatchSplit, asynchronous=None,
          on_row: Callable[[dict], None] | None = None) -> Result:
    """The loop from checkpoint `step` (None: the start), the last checkpoint and the summary;
    a learner's feed (`asynchronous`'s, for the batch `split`) is its source; `on_row` gets
    each row written."""
    run_dir, par, start_update = Path(cfg.run_dir), trainer.par, step or 0
    ckpts = Checkpoints(run_dir, keep=cfg.keep_checkpoints)
    agents = trainer.algorithm.agents_per_env

    def write(row: dict) -> None:
        if agents > 1:  # a multi-agent game's env step is `agents` agent steps
            row["agent_sps"] = row["sps"] * agents
        log.write(row)
        if on_row is not None and parallel.is_main():
            on_row(dict(row))

    def say_diverged(run: int, update: int, so_far: int) -> None:
        who = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in trainer.runs.describe(run).items())
        log.print(f"  {who}: non-finite loss or parameters at update {update}; this run stops learning there (its "
                  f"last finite parameters go on acting), the other {trainer.runs.count - so_far} go on")

    stop = StopSignal(log, kept=ckpts.any_complete)
    t_start, feed = time.perf_counter(), None
    try:
        if asynchronous is not None:
            feed = asynchronous.source(cfg, par, split, trainer.algo, ckpts, log, step, state)
            source, callbacks = feed, Callbacks(log=lambda row, updates: write(feed.log_row(row, updates)),
                                                checkpoint=feed.checkpoint, dispatched=feed.ran, stop=stop)
        else:
            source, callbacks = OnDevice(), both_callbacks(cfg, trainer, ckpts, write, stop)
        callbacks = callbacks._replace(profile=profile(cfg, start_update, trainer.end(cfg.stop_at_update), log),
                                       diverged=say_diverged if trainer.runs else None)
        # A resumed run's diverged runs (their frozen state is in the checkpoint) keep the update
        # where they went non-finite, from the rows logged before it.
        diverged = runstats.diverged_runs(runstats.read_rows(run_dir / "metrics.jsonl")) if trainer.runs else {}
        # A fresh learner has published its initial state already (asynchronous/checkpoints.py).
        saved = step if step is not None or feed is None else 0
        state, last, done = Loop(trainer, log, source, callbacks, start_update, cfg.stop_at_update, diverged,
                                 saved).run(state)
        if feed is not None:  # the last checkpoint, and unless stopped the marker that ends the collectors
            feed.finish(done, state, stopped=done < cfg.total_updates)
    except NonFinite as e:
        if feed is not None:
            feed.close()  # its last publication, on a thread of its own, is in the checkpoints
        ckpts.wait()
        last_good = ckpts.latest_step()
        where = (f"the last good checkpoint is at update {last_good}; continue from it with --resume and a smaller "
                 f"--lr" if last_good is not None else "no checkpoint was saved before it")
        print(f"error: {e}; stopped, {where}", file=sys.stderr)
        return Result(1, str(run_dir))
    finally:
        if feed is not None:
            feed.close()
        stop.restore()
        log.close()
        ckpts.close()  # waits for the asynchronous saves
    if done < cfg.total_updates:
        log.print(f"stopped at update {done} of {cfg.total_updates} with a checkpoint; continue with --resume")
    if feed is not None:  # what it learned from: the env steps the collectors sent
        unit, steps = "env_steps", last.get("env_steps", feed.ledger.env_steps)
    else:
        unit, steps = trainer.step_unit, last.get(trainer.step_unit, cfg.steps_at(done, trainer.steps_per_update))
    ending(cfg, log, last, done, unit, steps, time.perf_counter() - t_start, run_dir, trainer.runs)
    return Result(0, str(run_dir), state, last, done)


def profile(cfg, start_update: int, end: int, log: RunLog) -> Profile | None:
    """--profile: two log intervals, by default those after the first (compiling and warming up
    left out), or from --profile-from."""
    if not cfg.profile:
        return None
    first = (start_update + cfg.log_every - start_update % cfg.log_every if cfg.profile_from is None
             else cfg.profile_from)
    return Profile(cfg.profile, first, first + 2 * cfg.log_every, start_update, end, log)


def both_callbacks(cfg, trainer: Trainer, ckpts: Checkpoints, write: Callable[[dict], None],
                   stop: StopSignal) -> Callbacks:
    """What `--mode both` does between chunks: logs, checkpoints, and evaluations that also keep
    the best parameters so far (checkpoints/best)."""
    unit, per_update, par = trainer.step_unit, trainer.steps_per_update, trainer.par
    best = {"return": float("-inf")}

    def meta(update):
        return {"update": update, unit: cfg.steps_at(update, per_update), "num_envs": cfg.num_envs,
                "config": cfg.to_dict()}

    def checkpoint(update, state):
        ckpts.save(update, state, trainer.layout, par, meta(update))

    def evaluate(update, state):
        result = trainer.evaluate(state.params, update)
        if result["mean_return"] > best["return"]:
            best["return"] = result["mean_return"]
            ckpts.save_best(update, state.params, par, {**meta(update), "eval": result})
        more = {f"eval/{k}": v for k, v in result.items() if k not in ("mean_return", "std_return", "episodes")}
        return {"eval/episode_return": result["mean_return"], "eval/episode_return_std": result["std_return"], **more}

    return Callbacks(log=lambda row, updates: write(row), checkpoint=checkpoint,
                     evaluate=evaluate if cfg.eval_every else None, stop=stop)
