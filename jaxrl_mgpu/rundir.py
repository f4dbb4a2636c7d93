"""A run directory: where a run starts (fresh or from its newest whole checkpoint), what it
writes before training, and the summary it ends with.

A run directory is never clobbered: a new run needs an empty or absent one; `--resume`
continues the run in it with its own settings (its config.json, with the changes a resume may
make). A checkpoint that does not read back whole is set aside (never deleted) and the run
goes on from the one before it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.checkpoint import CheckpointMismatch, Checkpoints, DamagedCheckpoint
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.log import RunLog, runs_summary_lines, truncate_metrics, write_runs_summary


def resolve(cfg, given: dict):
    """The config this command runs: `cfg` for a new run; for `--resume` of an existing run, the
    run's own config.json with the changes a resume may make (config.resumed). Returns the
    config and the list of changes, which the run logs."""
    if not cfg.resume or not cfg.run_dir:
        return cfg, []
    path = Path(cfg.run_dir)
    if not (path / "config.json").exists() and (cfg.resume == "auto" or not path.exists()):
        return cfg, []  # nothing to resume; open_run says what happens next
    saved = config_lib.read_saved(path)
    try:
        return config_lib.resumed(saved, given)
    except TypeError as e:  # a config.json with options this version does not know
        raise ConfigError(f"--resume: {path / 'config.json'} was written by another version ({e})") from None


def check_writable(path: Path, flag: str = "--run-dir") -> None:
    """A ConfigError unless `path` can be created as a directory, or is one we may write in
    (checked by creating and removing a temporary one in it or in its nearest existing parent:
    nothing is left behind)."""
    parent = path.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: {parent} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".jaxrl_mgpu-check-"))
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot create it in {parent} ({e.strerror})") from None


class Start(NamedTuple):
    """Where a run starts: its config (with its run directory; resumed: counted on from the
    checkpoint), its trainer, the state (None: a fresh one, built while the chunk compiles), the
    checkpoint's update (None: a fresh start), the state's fields re-created rather than
    restored, and the lines that say which damaged checkpoints were set aside."""
    cfg: Any
    trainer: Any
    state: Any
    update: int | None
    recreated: list[str]
    set_aside: list[str]


def open_run(cfg, build: Callable, unit: str, steps_per_update: int) -> tuple[Path, Start | None]:
    """The run directory opened, in one call: checked (never clobbered), the start found (the
    newest checkpoint that reads back whole, with `--resume`; damaged ones set aside), the
    trainer built from `cfg` with the directory in it (`build(cfg) -> (trainer, state or
    None)`), and what a run writes before training written. Progress is counted in `unit`,
    `steps_per_update` of it per update. Returns the directory and the Start, None where the
    run is already complete (said in a line)."""
    run_dir, step = _find(cfg)
    begun = _start(dataclasses.replace(cfg, run_dir=str(run_dir)), run_dir, step, build, unit, steps_per_update)
    if begun is not None:
        _prepare(begun.cfg, run_dir, begun.update)
    return run_dir, begun


OCCUPIED = "--run-dir {path} already exists and is not empty; choose a new directory or continue it with --resume"


def _occupied(path: Path) -> bool:
    """Whether `path` holds something a fresh run may not write over. A learner may start in a
    directory its collectors began to fill (collectors may start first): a store alone is not
    a run."""
    collected_only = path.is_dir() and {p.name for p in path.iterdir()} <= {"store"}
    return path.exists() and (not path.is_dir() or any(path.iterdir())) and not collected_only


def check_free(cfg) -> None:
    """The refusal `_find` gives a fresh run's occupied --run-dir, early: before --auto-scale's
    search spends its minutes (the run directory is opened after it)."""
    if cfg.run_dir and not cfg.resume and _occupied(Path(cfg.run_dir)):
        raise ConfigError(OCCUPIED.format(path=cfg.run_dir))


def _find(cfg) -> tuple[Path, int | None]:
    """The run directory and the checkpoint step to resume from (None: a fresh start).
    Checks only; creates nothing. A run directory is never clobbered."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(parallel.broadcast(int(time.time()))))
    # the same name on every process; a suite's colon (dmc:HumanoidWalk) made a dash, as TensorBoard
    # reads NAME:PATH in --logdir as a named directory
    env_name = re.sub(r"[^\w.-]+", "-", cfg.env)
    path = Path(cfg.run_dir or f"runs/{env_name}-{cfg.algo}-{stamp}")
    occupied = _occupied(path)
    if not cfg.resume:
        if occupied:
            raise ConfigError(OCCUPIED.format(path=path))
        check_writable(path)
        return path, None
    if not occupied:
        if cfg.resume == "auto":
            check_writable(path)
            return path, None
        raise ConfigError(f"--resume: --run-dir {path} holds no run to resume")
    config_lib.read_saved(path)
    step = Checkpoints(path, read_only=True).latest_step() if (path / "checkpoints").is_dir() else None
    if step is None and cfg.resume == "latest":
        raise ConfigError(f"--resume: the run in {path} has no complete checkpoint (use --resume auto to start it over)")
    return path, step


def _saved_steps(ckpts: Checkpoints, step: int, unit: str, steps_per_update: int) -> int:
    """The env steps (or the algorithm's unit) done at a checkpoint, as its metadata says."""
    meta = ckpts.meta(step)
    return int(meta.get(unit, step * steps_per_update))


def _reading(run_dir: Path, read: Callable):
    """`read(Checkpoints)` on a read-only view of the run's checkpoints. A checkpoint damaged on
    any process is damaged on every one (DamagedCheckpoint everywhere), so that all processes
    take the same way on; a checkpoint of another version is a ConfigError."""
    reader = Checkpoints(run_dir, read_only=True)
    damaged = None
    try:
        value = read(reader)
    except DamagedCheckpoint as e:
        damaged = e
    except CheckpointMismatch as e:
        raise ConfigError(f"--resume: {e}") from None
    finally:
        reader.close()
    if parallel.any_process(damaged is not None):
        raise damaged or DamagedCheckpoint(-1, "unreadable on another process")
    return value


def _set_aside(run_dir: Path, damaged: DamagedCheckpoint) -> tuple[int, str]:
    """Moves a damaged checkpoint out of the way (never deletes it); the next older one to try,
    and the line that says so. With none left, a ConfigError."""
    ckpts = Checkpoints(run_dir, read_only=True)
    try:
        step = damaged.step if damaged.step >= 0 else ckpts.latest_step()
        moved = ckpts.set_aside(step)
        older = ckpts.latest_step()
    finally:
        ckpts.close()
    note = f"checkpoint at update {step} cannot be read ({damaged.why}); set aside in {moved}"
    if older is None:
        raise ConfigError(f"--resume: no checkpoint of {run_dir} reads back whole: {note}")
    return older, f"{note}; resuming from update {older} instead"


def _start(cfg, run_dir: Path, step: int | None, build: Callable, unit: str, steps_per_update: int) -> Start | None:
    """The run's start from checkpoint `step` or, where that one does not read back whole,
    from the newest one that does (`step` None: a fresh start). `build(cfg) -> (trainer, state
    or None)` makes the trainer (and, where the run needs it before compiling, its initial
    state); progress is counted in `unit`, `steps_per_update` of it per update. None where the
    run is already complete (said in a line)."""
    set_aside: list[str] = []
    while True:
        try:
            return _start_at(cfg, run_dir, step, build, unit, steps_per_update, set_aside)
        except DamagedCheckpoint as e:
            step, note = _set_aside(run_dir, e)
            set_aside.append(note)


def _start_at(cfg, run_dir: Path, step: int | None, build: Callable, unit: str, steps_per_update: int,
              set_aside: list[str]):
    if step is not None:
        done = _reading(run_dir, lambda r: _saved_steps(r, step, unit, steps_per_update))
        if unit != "update":  # the rest of the run counted on from the env steps (tokens) done; a
            # learner's (--mode learn) progress is its updates, the config's total as it stands
            cfg = dataclasses.replace(cfg, resumed_update=step, resumed_steps=done)
        if cfg.stop_at_update is not None and cfg.stop_at_update <= step < cfg.total_updates:
            raise ConfigError(f"--stop-at-update {cfg.stop_at_update}: the run is already at update {step}")
        if step >= cfg.total_updates:
            for line in set_aside:
                print(line)
            ended = "" if unit == "update" else f", {cfg.resumed_steps:,} {unit}"
            print(f"the run in {run_dir} is already complete (update {step} of {cfg.total_updates}{ended}); nothing "
                  f"to do. To train it further, resume with a larger "
                  f"{'--num-updates' if cfg.num_updates is not None else '--total-timesteps'}")
            return None
    parallel.barrier("run directory checked")  # every process checks it before process 0 writes in it
    trainer, state = build(cfg)
    recreated: list[str] = []
    if step is not None:
        # Restored before process 0 rewrites config.json and metrics.jsonl, so that a checkpoint
        # this version cannot read leaves the run directory as it was.
        target = state if state is not None else trainer.init_state()
        state, recreated = _reading(run_dir, lambda r: r.restore(step, target, trainer.layout, trainer.par))
    return Start(cfg, trainer, state, step, recreated, set_aside)


def _prepare(cfg, run_dir: Path, resume_step: int | None) -> None:
    """What a run writes before it trains: its config.json, and its metrics.jsonl without the
    rows after the checkpoint it resumes from (this run logs them again). Process 0 writes."""
    if parallel.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(config_lib.dump(cfg))
        truncate_metrics(run_dir / "metrics.jsonl", resume_step or 0)
    parallel.barrier("run directory ready")


def summary(plan, log: RunLog, last: dict, done: int, unit: str, steps: int | None, seconds: float,
            run_dir: Path) -> dict:
    """What a user wants to know at the end of a run (also written to summary.json)."""
    cfg, best = plan.cfg, log.best
    values = {
        "status": "complete" if done >= cfg.total_updates else f"stopped at update {done} (continue with --resume)",
        "updates": done,
        unit: steps,
        "time_s": round(seconds, 1),
    }
    if log.episodic:
        # the last row's, or where no episode ended in its interval, the last one logged before it
        final = last.get("episode_return")
        values["final_return"] = final if final is not None else log.latest_return
        values["best_return"] = best.get("episode_return", (None,))[0]
        if "eval/episode_return" in best:
            values["best_eval_return"] = best["eval/episode_return"][0]
    for key in plan.spec.summary:
        if last.get(key) is not None:
            values[key.split("/")[1]] = last[key]
    values["startup"] = {k: round(v, 2) for k, v in log.timeline.items()}
    # The allocator's high-water mark on this process's first device, where the backend keeps
    # one (GPUs): the programs' buffers, and any that XLA's autotuner took while compiling.
    peak = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    if peak:
        values["device_memory_peak_bytes"] = int(peak)
    values["run_dir"] = str(run_dir)
    values["files"] = "config.json, metrics.jsonl, summary.json, TensorBoard events, checkpoints/" + \
        (", best/" if cfg.eval_every else "")
    values["tensorboard"] = f"tensorboard --logdir {run_dir}  (pip install tensorboard)"
    return values


def ending(plan, log: RunLog, last: dict, done: int, unit: str, steps: int | None, seconds: float,
           run_dir: Path) -> None:
    """The run's summary (console and summary.json), with many runs their rows across seeds
    (runs_summary.json, learning curves)."""
    cfg, runs = plan.cfg, plan.runs
    values = summary(plan, log, last, done, unit, steps, seconds, run_dir)
    stopped_runs = [f"run {i} at update {r['diverged_at']}" for i, r in enumerate(last.get("runs", []))
                    if "diverged_at" in r]
    if stopped_runs:  # many runs: where each run that went non-finite did
        values["diverged_runs"] = ", ".join(stopped_runs)
    across = []
    if runs is not None and parallel.is_main():  # per configuration, across its seeds
        across = write_runs_summary(run_dir, runs.names, unit, cfg.target_return)
        values["across_runs"] = (f"{len(across)} configuration(s) x {runs.seeds} seed(s): runs_summary.json, "
                                 f"learning_curves.png")
    log.summary(values)
    for line in runs_summary_lines(across, () if runs is None else runs.names):
        log.print(f"  {line}")
