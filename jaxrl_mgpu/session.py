"""What a run's mode does around the loop: where its data comes from, what it does between
chunks, and how it ends. The runner (runner.py) has one path for every mode; the plan's
session (`for_plan`) is the part that differs:

- `Training` (`--mode both`): the devices roll out their own data (sources.OnDevice); between
  chunks it logs, evaluates (keeping the best parameters, checkpoints/best) and checkpoints.
- `Learning` (`--mode learn`): a learner fed from the run's store by its spec's asynchronous
  source (algos/dqn/asynchronous.py, ad_async.py), which also logs its data and rate counts, publishes
  its checkpoints for the collectors, and at the end leaves the marker that stops them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Protocol

from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.chunks import Trainer
from jaxrl_mgpu.cli import count
from jaxrl_mgpu.loop import Callbacks
from jaxrl_mgpu.sources import LearnerSource, OnDevice, Source
from jaxrl_mgpu.stop import StopSignal


class Opened(NamedTuple):
    """A session begun: the loop's data source and callbacks, and what ends it."""
    source: Source
    callbacks: Callbacks
    saved: int | None                            # the newest checkpoint's update (None: none yet)
    finish: Callable[[int, Any, bool], None]     # (updates done, state, stopped): after the loop
    close: Callable[[], None]                    # always, also after an error; may be called twice
    progress: Callable[[dict, int], tuple[str, int]]  # (last row, updates done) -> the summary's (unit, count)


class Session(Protocol):
    """How a mode runs the plan's algorithm."""
    rate: str | None                            # what a row's rate ("sps") counts, per second (None: the unit's steps)
    eager_state: bool                           # the initial state is built (and published) before compiling

    def per_update(self, plan) -> str | None:
        """The banner's 'per update' line (None: the trainer's steps per update)."""

    def open(self, plan, trainer: Trainer, ckpts: Checkpoints, log, write: Callable[[dict], None],
             stop: StopSignal, step: int | None, state, recreated: list[str]) -> Opened:
        """Begins the session for the loop from checkpoint `step` (None: fresh) with `state`;
        `write(row)` writes a log row; `recreated`: state fields re-created on the resume."""


def _nothing(*_) -> None:
    return None


class Training:
    """--mode both."""
    eager_state = False  # built while the chunk compiles
    rate = None          # the unit's own: env steps, tokens (RunLog)

    def per_update(self, plan) -> None:
        return None

    def open(self, plan, trainer, ckpts, log, write, stop, step, state, recreated) -> Opened:
        cfg = plan.cfg
        if step is not None:
            log.print(f"  resumed from the checkpoint at update {step} ({cfg.resumed_steps:,} {trainer.step_unit})"
                      + (f"; re-created {', '.join(recreated)} (the saved ones do not fit "
                         f"{count(trainer.par.num_devices, 'device')} x {cfg.num_envs} envs)" if recreated else ""))
        unit, per_update = trainer.step_unit, trainer.steps_per_update
        best = {"return": float("-inf")}

        def meta(update):
            return {"update": update, unit: cfg.steps_at(update, per_update), "num_envs": cfg.num_envs,
                    "config": cfg.to_dict()}

        def checkpoint(update, state):
            ckpts.save(update, state, trainer.layout, trainer.par, meta(update))

        def evaluate(update, state):
            result = trainer.evaluate(state.params, update)
            if result["mean_return"] > best["return"]:
                best["return"] = result["mean_return"]
                ckpts.save_best(update, state.params, trainer.par, {**meta(update), "eval": result})
            more = {f"eval/{k}": v for k, v in result.items() if k not in ("mean_return", "std_return", "episodes")}
            return {"eval/episode_return": result["mean_return"], "eval/episode_return_std": result["std_return"],
                    **more}

        if cfg.eval_every:
            trainer.compile_evaluation()
        callbacks = Callbacks(log=lambda row, updates: write(row), checkpoint=checkpoint,
                              evaluate=evaluate if cfg.eval_every else None, stop=stop)
        return Opened(OnDevice(), callbacks, step, _nothing, _nothing,
                      lambda last, done: (unit, last.get(unit, cfg.steps_at(done, per_update))))


class Learning:
    """--mode learn: the spec's asynchronous learner (algos.spec.Asynchronous)."""
    eager_state = True  # published at update 0 for the collectors, before the chunk compiles
    rate = "env steps received"  # its source's rows count what reached it (asynchronous/source.py)

    def __init__(self, asynchronous):
        self.asynchronous = asynchronous

    def per_update(self, plan) -> str:
        return self.asynchronous.per_update(plan.cfg)

    def open(self, plan, trainer, ckpts, log, write, stop, step, state, recreated) -> Opened:
        # (it says where it resumed itself: asynchronous/checkpoints.py)
        feed: LearnerSource = self.asynchronous.source(plan, trainer.algorithm, ckpts, log, step, state)
        callbacks = Callbacks(log=lambda row, updates: write(feed.log_row(row, updates)),
                              checkpoint=feed.checkpoint, dispatched=feed.ran, stop=stop)

        def finish(done, state, stopped):  # the last checkpoint, and unless stopped the collectors' end
            feed.finish(done, state, stopped)

        # what it learned from: the env steps the collectors sent
        return Opened(feed, callbacks, 0 if step is None else step, finish, feed.close,
                      lambda last, done: ("env_steps", last.get("env_steps", feed.ledger.env_steps)))


def for_plan(plan) -> Session:
    """The session that runs `plan`: a learner where it is a --mode learn run."""
    return Training() if plan.learner is None else Learning(plan.learner)
