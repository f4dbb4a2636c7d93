"""The one host loop, for every algorithm and mode, and what surrounds it: the run directory,
resume, signals, checkpoints, evaluation and the run's summary.

An algorithm (algos/base.Algorithm) gives per-device functions `init(key)` and
`update(state, *data)`. The runner runs
`n` updates in one compiled call (`lax.fori_loop` with `n` an argument, so ONE program serves
every chunk length: the regular `--log-every` chunks, a shorter last one, a `--stop-at-update`
in between), maps it over all devices, and drives the chunks from the host. Between chunks it
logs, evaluates, checkpoints, and honours stop requests (SIGTERM / SIGINT), always at a chunk
boundary, so a resumed run continues exactly. The next chunk is dispatched before the
previous chunk's metrics are read, except where the state itself is needed on the host side
(evaluation, checkpoint, stop), so the devices never wait on logging. An asynchronous learner
(--mode learn) is the same loop with a `Feed` polled between chunks: it takes in the data the
collectors sent and says how many updates may run now.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

import jaxrl_mgpu
from jaxrl_mgpu import compile_cache
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu import multirun, parallel, runstats
from jaxrl_mgpu.algos import ALGOS, module_for
from jaxrl_mgpu.algos.base import Algorithm, Split, all_finite
from jaxrl_mgpu.checkpoint import CheckpointMismatch, Checkpoints, DamagedCheckpoint
from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.episodes import make_episodes, summarize
from jaxrl_mgpu.log import RunLog, truncate_metrics
from jaxrl_mgpu.parallel import Parallel
from jaxrl_mgpu.stop import StopSignal
from jaxrl_mgpu.cli import count


class Chunk(NamedTuple):
    """What a chunk leaves for the host (already reduced over devices): the numbers of its log
    interval so far. A log interval may take several chunks (they are sized to a wall time
    too: `ChunkSizer`), and each chunk carries the sums on from the one before it, so the
    interval's numbers are the same however many chunks ran it."""
    losses: dict          # means over the interval's updates so far
    episodes: Any         # vec.EpisodeStats (or a game's dict of sums) summed over them
    first_bad: jax.Array  # index in the interval of the first update with a non-finite loss or parameter; -1: none
    loss_sum: dict        # what the next chunk of the interval carries on from
    updates: jax.Array    # the interval's updates so far


class NonFinite(RuntimeError):
    """A loss or parameter became NaN/inf."""


def make_chunk(update: Callable, finite: Callable | None = None) -> tuple[Callable, Callable]:
    """Per-device functions `empty(state, *data) -> Chunk` (an interval with no update yet) and
    `chunk(state, n, before, fresh, *data) -> (state, Chunk)`, which runs `n` updates in one
    loop, carrying the interval's sums on from `before` (`fresh`: a new interval, `before`'s
    values unused). `n` and `fresh` are arguments, not shapes, so one compiled program runs
    chunks of any length. `data` (optional) is a read-only input every update sees, e.g. a
    dataset shard kept on the device. `finite` is the algorithm's (algos/base.Algorithm.finite):
    the chunk records the first update where it said no (per run, where it answers per run)."""
    # Traced once: eval_shape below and every call in the loop hit jit's trace cache (the same
    # function at the same abstract arguments), instead of tracing the update twice.
    update = jax.jit(update)
    finite = finite or (lambda losses, state: all_finite(losses, state.params))

    def empty(state, *data) -> Chunk:
        # The accumulators' shapes, from the update's abstract trace (nothing is computed).
        losses, episodes = jax.tree.map(parallel.zeros, jax.eval_shape(update, state, *data)[1])
        none_bad = jnp.full(jax.eval_shape(finite, losses, state).shape, -1, jnp.int32)
        return Chunk(losses, episodes, none_bad, losses, jnp.zeros((), jnp.int32))

    def chunk(state, n, before: Chunk, fresh, *data):
        def body(_, carry):
            state, loss_sum, episode_sum, done, first_bad = carry
            state, (losses, episodes) = update(state, *data)
            first_bad = jnp.where((first_bad < 0) & ~finite(losses, state), done, first_bad)
            return (state, jax.tree.map(jnp.add, loss_sum, losses), jax.tree.map(jnp.add, episode_sum, episodes),
                    done + 1, first_bad)

        def carried(x, start=0):
            return jnp.where(fresh, jnp.full_like(x, start), x)

        start = (state, jax.tree.map(carried, before.loss_sum), jax.tree.map(carried, before.episodes),
                 carried(before.updates), carried(before.first_bad, -1))
        state, loss_sum, episodes, done, first_bad = jax.lax.fori_loop(0, n, body, start)
        losses = jax.tree.map(lambda x: x / jnp.maximum(done, 1).astype(x.dtype), loss_sum)
        return state, Chunk(losses, episodes, first_bad, loss_sum, done)
    return empty, chunk


def step_unit(cfg) -> str:
    """What progress is counted in: environment steps, or what the algorithm consumes."""
    return module_for(cfg).STEP_UNIT


def steps_per_update(cfg) -> int:
    return module_for(cfg).steps_per_update(cfg)


class Trainer:
    """An algorithm (algos/base.Algorithm: by default `--algo`'s) on a config and device set,
    and the one compiled chunk that runs it."""

    def __init__(self, cfg, par: Parallel, algorithm: Algorithm | None = None, split: Split | None = None):
        # --num-seeds / --sweep: many runs, vmapped over a runs axis (multirun.py)
        self.runs = multirun.Runs.of(cfg)
        par = multirun.setup(cfg, par)
        self.cfg, self.par = cfg, par
        if algorithm is None:
            module = module_for(cfg)
            split = module.check(cfg, par.data_devices) if split is None else split
            self.env, self.env_params = envs_lib.make(cfg.env, cfg.env_args)
            algorithm = (module.algorithm(cfg, self.env, self.env_params, split, par) if self.runs is None else
                         multirun.algorithm(cfg, module, self.env, self.env_params, split, par, self.runs))
        self.algorithm = algorithm
        self.algo = algorithm.parts  # the algorithm's own functions (rollout, learn, ...)
        self.layout, self.data = algorithm.layout, algorithm.data
        self.step_unit, self.steps_per_update = algorithm.step_unit, algorithm.steps_per_update
        self._compiled = None
        self._init = None
        self._eval = None
        self._lengths: dict[int, jax.Array] = {}
        self._flags: dict[bool, jax.Array] = {}
        self._empty = None

    def init_state(self):
        return self.compile_init()(self.key(self.cfg.seed))

    def compile_init(self) -> Callable:
        """The program that builds the initial state, compiled once (ahead of time where the
        backend can)."""
        if self._init is None:
            self._init = self.par.compile(self.par.map(self.algorithm.init), self.key(self.cfg.seed))
        return self._init

    def abstract_state(self):
        """The shapes, dtypes and layout of `init_state()`, without computing it."""
        shapes = jax.eval_shape(self.par.map(self.algorithm.init), self.key(self.cfg.seed))
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.par.sharding), shapes)

    def key(self, seed: int):
        """PRNGKey(seed) on every device; with many runs, each run's key: PRNGKey(its own seed +
        (seed - --seed)), the key its single run would use."""
        if self.runs is not None:
            return self.par.shard_runs(self.runs.keys(seed - self.cfg.seed))
        return self.par.replicate(np.asarray(jax.random.PRNGKey(seed)))

    @property
    def compiled(self):
        """The compiled chunk (for its memory analysis: autoscale, bench), None before `compile`."""
        return self._compiled

    def compile(self, state, data: tuple | None = None) -> None:
        """Compiles the chunk for `state`'s (and `data`'s) shapes, once (ahead of time where the
        backend can)."""
        if self._compiled is None:
            data = self.data if data is None else data
            empty, chunk = make_chunk(self.algorithm.update, self.algorithm.finite)
            # An interval with no update yet: zeros of the chunk's sums (its values are unused
            # where a chunk starts an interval), put on the devices from the host.
            shapes = jax.eval_shape(self.par.map(empty), state, *data)
            self._empty = self.par.replicate(jax.tree.map(lambda s: np.zeros(s.shape[1:], s.dtype), shapes))
            mapped = self.par.map(chunk, donate=True)
            self._compiled = self.par.compile(mapped, state, self._length(1), self._empty, self._flag(True), *data)

    def _length(self, n: int):
        """A chunk's length on the devices, put there once per length (a learner's chunks take a
        few lengths, and a transfer per chunk is a needless step on its way)."""
        if n not in self._lengths:
            self._lengths[n] = self.par.replicate(np.int32(n))
        return self._lengths[n]

    def _flag(self, value: bool):
        if value not in self._flags:
            self._flags[value] = self.par.replicate(np.bool_(value))
        return self._flags[value]

    def run_chunk(self, length: int, state, before: Chunk | None, data: tuple | None = None):
        """Dispatches `length` updates from `state` (donated): `(state, Chunk)`, whose numbers
        carry on from `before`'s interval (None: a new interval)."""
        self.compile(state, data)
        fresh = before is None
        return self._compiled(state, self._length(length), self._empty if fresh else before, self._flag(fresh),
                              *(self.data if data is None else data))

    def chunk_fn(self, length: int, state, data: tuple | None = None) -> Callable:
        """`state -> (state, Chunk)` running `length` updates (the one compiled program) on
        `data` (default: the algorithm's), each call an interval of its own."""
        self.compile(state, data)
        return lambda state: self.run_chunk(length, state, None, data)

    def end(self, stop_at: int | None = None) -> int:
        return self.cfg.total_updates if stop_at is None else min(stop_at, self.cfg.total_updates)

    def next_length(self, update: int, end: int) -> int:
        """Chunks end on multiples of `log_every` and at `end` (the last update, or
        `stop_at`); where they end does not change the numbers (every update is the same
        computation), only where the host logs, saves and may stop."""
        return min((update // self.cfg.log_every + 1) * self.cfg.log_every, end) - update

    def chunk_lengths(self, start_update: int = 0, stop_at: int | None = None) -> list[int]:
        end, update, lengths = self.end(stop_at), start_update, []
        while update < end:
            lengths.append(self.next_length(update, end))
            update += lengths[-1]
        return lengths

    def evaluate(self, params, update: int) -> dict:
        """`eval_episodes` episodes with the current params, spread over all devices."""
        if self._eval is None:
            if self.algorithm.evaluation is not None:
                episodes, self._summarize = self.algorithm.evaluation(self.cfg.eval_episodes, self.par.num_devices,
                                                                      False)
            else:
                episodes = make_episodes(self.algorithm.policy, self.env, self.env_params, self.cfg.eval_episodes,
                                         self.par.num_devices, greedy=False)
                self._summarize = summarize
            self._eval = self.par.map(episodes)
        # A fixed key per evaluation point: a resumed run evaluates like an uninterrupted one.
        key = self.key(self.cfg.seed + 1_000_003 * (update + 1))
        return self._summarize(self.par.first(self._eval(params, key)))


def check_finite(par: Parallel, first_bad: jax.Array, first_update: int, diverged: dict | None = None) -> None:
    """A single run that went non-finite raises NonFinite (`first_bad`: a Chunk's, counted from
    `first_update`); with many runs, `diverged` ({run: the update where it went non-finite})
    gains the runs that did, and NonFinite comes when every run has. Blocks until the chunk
    is done."""
    if par.runs is None:
        bad = par.first(first_bad)
        if bad >= 0:
            raise NonFinite(f"non-finite loss or parameters at update {first_update + int(bad)}")
        return
    diverged = {} if diverged is None else diverged
    for run, bad in enumerate(par.runs_of(first_bad)):
        if bad >= 0:
            diverged.setdefault(run, first_update + int(bad))
    if len(diverged) == par.runs:
        raise NonFinite(f"non-finite loss or parameters in every run (the last at update {max(diverged.values())})")


def read_chunk(par: Parallel, chunk: Chunk, first_update: int, diverged: dict | None = None) -> dict:
    """Device 0's copy of the (already all-reduced) numbers of a chunk's log interval, which
    began at `first_update`, as plain numbers (after `check_finite`). With many runs: each
    run's row under "runs", and their means over the runs that have not diverged (the
    console's line); the rows of runs that went non-finite say so ("diverged_at")."""
    diverged = {} if diverged is None else diverged
    check_finite(par, chunk.first_bad, first_update, diverged)
    if par.runs is None:
        return chunk_row(*par.first((chunk.losses, chunk.episodes)))
    losses, episodes = par.runs_of((chunk.losses, chunk.episodes))
    rows = [chunk_row(*jax.tree.map(lambda x: x[i], (losses, episodes))) for i in range(par.runs)]
    live = [r for i, r in enumerate(rows) if i not in diverged]
    means = {k: _mean([r[k] for r in live]) for k in rows[0] if k != "episodes"}
    for run, update in diverged.items():
        rows[run]["diverged_at"] = update
    return {**means, "episodes": sum(r["episodes"] for r in rows), "runs": rows}


def _mean(values: list[float]) -> float:
    """The mean of the numbers that are not NaN (a run with no episode ended has none)."""
    known = [v for v in values if not np.isnan(v)]
    return sum(known) / len(known) if known else float("nan")


def chunk_row(losses, episodes) -> dict:
    """One run's chunk metrics (host numpy) as a log row."""
    if isinstance(episodes, dict):  # sums named by the metric, and "episodes" (multi-agent games)
        count = float(episodes["episodes"])
        row = {k: float(v) / count if count else float("nan") for k, v in episodes.items() if k != "episodes"}
        row["episodes"] = int(count)
    else:
        count = float(episodes.count)
        row = {"episode_return": float(episodes.return_sum) / count if count else float("nan"),
               "episode_length": float(episodes.length_sum) / count if count else float("nan"),
               "episodes": int(count)}
    row.update({k: float(v) for k, v in losses.items()})
    return row


class Hooks(NamedTuple):
    """What the loop does between chunks; any may be None."""
    checkpoint: Callable | None = None   # (update, state) -> None
    evaluate: Callable | None = None     # (update, state) -> dict of eval/ metrics
    stop: StopSignal | None = None       # stop requests (SIGTERM / SIGINT)


class Feed(Protocol):
    """Data that arrives while a learner trains (--mode learn: asynchronous/). Between chunks
    the loop asks the feed how many updates may run now; the chunk's updates read its device
    memory (a replay of transitions, a buffer of learning histories)."""

    data: tuple         # the device memory every update reads
    waiting_for: str    # what the loop waits for while `poll` allows no update

    def poll(self, update: int) -> int:
        """Between chunks: takes in what arrived since the last call, into the device memory;
        how many updates may run now (0: none)."""

    def take_in(self, update: int) -> None:
        """While a chunk runs: takes in what arrived since the last call as far as the host can
        (reading, staging, copies to the devices), without touching the device memory the chunk
        reads (poll puts it there)."""

    def ran(self, updates: int, state, between: tuple[float, float] | None) -> None:
        """The chunk just dispatched runs `updates` updates, to `state` (possibly still being
        computed); `between`: when (time.perf_counter) the last dispatch returned and this one
        began (None: after a wait for data, or the first)."""

    def log_row(self, row: dict, updates: int) -> dict:
        """The log row of the chunks since the last one (`updates` updates) with what the feed
        counts: data received, its rates, its age."""


POLL_S = 0.005  # a learner with nothing to learn from looks for new data this often (a poll is cheap)


class Profile:
    """--profile DIR: a jax.profiler trace of the updates after `start` up to `stop`, two log
    intervals (by default those after the first, so that compiling and warming up stay out of
    it; --profile-from moves them); each process writes its own (DIR/process_<i> where there
    are several). The trace starts and stops between chunks, with the device caught up (this
    drains the pipeline of chunks twice: profiling only)."""

    def __init__(self, directory: str, start: int, stop: int, first_update: int, end: int, log):
        # (run() checked that the directory can be made)
        self.directory = directory if jax.process_count() == 1 else f"{directory}/process_{jax.process_index()}"
        self.start, self.stop, self.first_update, self.log = start, stop, first_update, log
        self.on, self.started_at = False, None
        self.said = start >= end  # the run ends before the window: said now, not again at the end
        if self.said:
            log.print(f"  --profile: this run ends at update {end}, before the updates to profile ({start + 1}-{stop}): "
                      f"nothing will be traced (see --profile-from)")

    def at(self, update: int, state) -> None:
        """Called before the chunk that begins after `update` is dispatched."""
        if self.started_at is None and self.start <= update < self.stop:
            jax.block_until_ready(state)
            jax.profiler.start_trace(self.directory)
            self.on, self.started_at = True, update
        elif self.on and update >= self.stop:
            self.close(update, state)

    def close(self, update: int, state) -> None:
        if self.on:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.on = False
            self.log.print(f"  profile of updates {self.started_at + 1}-{update} written under {self.directory}")
        elif self.started_at is None and not self.said:
            self.log.print(f"  --profile: this run did updates {self.first_update + 1}-{update}, none of those to "
                           f"profile ({self.start + 1}-{self.stop}); nothing was traced")


# A chunk runs for about this long at most, so that a stop request, which waits for the chunks
# already dispatched (at most two), is honoured within seconds whatever --log-every is.
CHUNK_S = 2.0


class ChunkSizer:
    """How many updates the next chunk may run: what fits in about `target_s` seconds of the
    devices' time at the speed of the last chunk read (one update to begin with). Chunks also
    end at every log point; where they end does not change the numbers (every update is the
    same computation, and a chunk carries its log interval's sums on), only where the host
    may stop."""

    def __init__(self, target_s: float = CHUNK_S):
        self.target_s = target_s
        self.update_s: float | None = None  # seconds per update, as last measured
        self._last_done: float | None = None

    def limit(self) -> int:
        return 1 if self.update_s is None else max(1, int(self.target_s / self.update_s))

    def done(self, length: int, dispatched_at: float, now: float) -> None:
        """A chunk of `length` updates, dispatched at `dispatched_at`, was found done at `now`
        (time.perf_counter): it ran from then, or from when the chunk before it was done."""
        began = dispatched_at if self._last_done is None else max(dispatched_at, self._last_done)
        self.update_s = max(now - began, 1e-6) / length
        self._last_done = now


class InFlight(NamedTuple):
    """A dispatched chunk whose numbers the host has not read yet."""
    interval_start: int   # the update its log interval began after
    last: int             # its last update
    length: int           # its updates
    metrics: Chunk        # on the devices
    dispatched_at: float  # time.perf_counter()
    row_due: bool         # its interval ends with it (a log point, the last update, a stop): a row is written


def train(trainer: Trainer, log, state=None, start_update: int = 0, hooks: Hooks = Hooks(),
          stop_at: int | None = None, feed: Feed | None = None,
          diverged: dict[int, int] | None = None) -> tuple[Any, dict, int]:
    """Runs chunks until the last update (or `stop_at`, or a stop request); returns the final
    state, the last log row and the number of updates done. With a `feed` (a learner), each
    chunk runs as many updates as the feed allows, on its data. `diverged`: with many runs,
    those that went non-finite before `start_update` (a resume), {run: update}."""
    cfg = trainer.cfg
    end = trainer.end(stop_at)
    data = None if feed is None else feed.data
    stop = hooks.stop
    t0 = time.perf_counter()
    aot = trainer.par.backend != "pmap" or jax.process_count() == 1
    compile_cache.settle()  # before two threads compile at once
    if stop is not None:
        stop.activity = lambda: "before the first update, once the training chunk is compiled"
    if state is None and aot:
        # The initial state (its own small program) is built while the chunk compiles for its
        # shapes: the two compiles overlap.
        initial = _background(trainer.init_state)
        with log.waiting("compiling the training chunk"), compile_cache.CacheUse() as cache:
            trainer.compile(trainer.abstract_state(), data)
        state = initial.result()
    else:
        state = trainer.init_state() if state is None else state
        with log.waiting("compiling the training chunk"), compile_cache.CacheUse() as cache:
            trainer.compile(state, data)
    log.timeline["compile_s"] = time.perf_counter() - t0
    if aot:
        source = ("loaded from the compilation cache" if cache.all_loaded else
                  "compiled; kept in the compilation cache for the next run" if cache.requests else "compiled")
        log.print(f"  training chunk {source} in {time.perf_counter() - t0:.1f}s")
    unit, per_update = trainer.step_unit, trainer.steps_per_update
    log.start(cfg.steps_at(start_update, per_update))
    clock = {"start": time.perf_counter(), "prev": time.perf_counter()}
    last_row: dict = {}
    diverged = dict(diverged or {})  # many runs: {run: the update where it went non-finite}
    sizer = ChunkSizer()
    profile = None
    if cfg.profile:
        first = start_update + cfg.log_every - start_update % cfg.log_every if cfg.profile_from is None else cfg.profile_from
        profile = Profile(cfg.profile, first, first + 2 * cfg.log_every, start_update, end, log)
    dispatched = {"last": start_update}  # the last update dispatched (what a stop waits for)
    if stop is not None:
        def doing() -> str:
            eta = "" if sizer.update_s is None else f", about {sizer.update_s * (dispatched['last'] - update):.0f}s"
            return f"after update {dispatched['last']}, the last one dispatched{eta}"
        stop.activity = doing

    def emit(chunk: InFlight) -> None:
        """Reads a chunk (blocks until it is done): its non-finite check, and where its row is
        due, the row."""
        nonlocal last_row
        first = chunk.last - chunk.length + 1
        what = f"updates {first}-{chunk.last}" + ("" if aot or first > start_update + 1 else
                                                  " (compiled on this first call: pmap over several processes)")
        known = len(diverged)
        with log.waiting(what):
            if chunk.row_due:
                row = read_chunk(trainer.par, chunk.metrics, chunk.interval_start + 1, diverged)
            else:
                check_finite(trainer.par, chunk.metrics.first_bad, chunk.interval_start + 1, diverged)
        now = time.perf_counter()
        if chunk.length:
            sizer.done(chunk.length, chunk.dispatched_at, now)
        for run in list(diverged)[known:]:
            who = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in trainer.runs.describe(run).items())
            log.print(f"  {who}: non-finite loss or parameters at update {diverged[run]}; this run stops learning "
                      f"there (its last finite parameters go on acting), the other {trainer.runs.count - len(diverged)} "
                      f"go on")
        log.timeline.setdefault("first_chunk_s", now - clock["start"])
        if chunk.row_due:
            updates = chunk.last - chunk.interval_start
            last_row = {"update": chunk.last, unit: cfg.steps_at(chunk.last, per_update), **row,
                        "sps": updates * per_update / (now - clock["prev"]), "time": now - clock["start"]}
            if trainer.algorithm.agents_per_env > 1:
                last_row["agent_sps"] = last_row["sps"] * trainer.algorithm.agents_per_env
            clock["prev"] = now

    def write(update: int) -> None:
        nonlocal last_row
        if feed is not None:
            last_row = feed.log_row(last_row, update - written["update"])
        log.write(last_row)
        written["update"] = update

    def stop_requested() -> bool:  # a collective across processes
        return stop is not None and stop()

    def due(every: int | None, update: int) -> bool:
        return bool(every) and update % every == 0

    def settle(chunk: InFlight) -> None:
        emit(chunk)
        if chunk.row_due:
            write(chunk.last)

    # One chunk stays in flight: the next one is dispatched before the host reads (and logs)
    # the last, and a learner's feed takes in data (feed.take_in) while the devices learn. The
    # dispatch itself runs on a thread of its own: XLA:GPU drives a while loop whose trip count
    # is a run-time value (the chunk's `n`) from the host, so the call returns only when the
    # chunk is all but done, and the host's work between chunks would otherwise leave the
    # devices idle.
    dispatcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chunk-dispatch")
    # Across processes, reading a chunk's metrics and the per-chunk decisions (a stop, the next
    # length) are collectives, which every process must issue in the same order as the
    # chunks': never beside a dispatch.
    alone = jax.process_count() == 1

    def settle_taking_in(chunk: InFlight, update: int) -> None:
        if feed is not None:  # data taken in while the devices run, not a chunk later
            while not all(x.is_ready() for x in jax.tree.leaves(chunk.metrics)):
                feed.take_in(update)
                time.sleep(POLL_S)
        settle(chunk)

    update, pending, written, saved = start_update, None, {"update": start_update}, {"update": start_update}
    interval_start, before = start_update, None  # the open log interval: where it began, its last chunk
    limit, stopping = 1, False
    returned_at = None  # when the last dispatch returned (the host's time between chunks, for a feed's log)
    try:
        while update < end:
            if profile is not None:
                profile.at(update, state)
            if alone and stop is not None and stop.requested:
                stopping = True  # no chunk is dispatched after a stop request
                break
            length = min(trainer.next_length(update, end), limit)  # a feed may allow fewer updates, never more
            waited = False
            if feed is not None:
                allowed = feed.poll(update)
                if not allowed:
                    waited = True
                    if pending is not None:  # its row is not held back while the learner waits
                        settle(pending)
                        pending = None
                    with log.waiting(feed.waiting_for):
                        while not (allowed := feed.poll(update)) and not stop_requested():
                            time.sleep(POLL_S)
                if not allowed:  # stopped while waiting (the learner's last checkpoint follows)
                    stopping = True
                    break
                length = min(length, allowed)
            # Dispatch (a feed's data is new after each poll); meanwhile the host reads and logs
            # the chunk before, and a feed takes in data.
            between = None if waited or returned_at is None else (returned_at, time.perf_counter())
            dispatched_at = time.perf_counter()
            dispatch = dispatcher.submit(trainer.run_chunk, length, state, before, data)
            dispatched["last"] = update + length
            if pending is not None and alone:
                settle_taking_in(pending, update)
                pending = None
            if feed is not None:
                while not dispatch.done():
                    feed.take_in(update)
                    concurrent.futures.wait([dispatch], timeout=POLL_S)
            state, metrics = dispatch.result()
            returned_at = time.perf_counter()
            if pending is not None:  # several processes: read once the dispatch is done
                settle_taking_in(pending, update)
                pending = None
            if feed is not None:
                feed.ran(length, state, between)
            update += length
            final = update == cfg.total_updates or update == stop_at
            # One collective for both decisions; the length from the chunks read so far.
            stopping, limit = parallel.agree(stop is not None and stop.requested, sizer.limit())
            ends_interval = update % cfg.log_every == 0 or final or stopping
            pending = InFlight(interval_start, update, length, metrics, dispatched_at, ends_interval)
            interval_start, before = (update, None) if ends_interval else (interval_start, metrics)
            evaluate = hooks.evaluate is not None and (due(cfg.eval_every, update) or final)
            checkpoint = hooks.checkpoint is not None and (due(cfg.checkpoint_every, update) or final or stopping)
            if evaluate or checkpoint or final or stopping:
                emit(pending)  # the state is needed as it is now: read this chunk
                pending, row_due = None, ends_interval
                if evaluate:
                    last_row.update(hooks.evaluate(update, state))
                if row_due:
                    write(update)
                if checkpoint:
                    hooks.checkpoint(update, state)
                    saved["update"] = update
            if final or stopping:
                break
        if stopping and before is not None:
            # Asked to stop between log points, after the last chunk's checks: its interval's
            # row, and its checkpoint.
            pending = InFlight(interval_start, update, 0, before, time.perf_counter(), True) if pending is None \
                else pending._replace(row_due=True)
        if pending is not None:
            settle(pending)
        if stopping and hooks.checkpoint is not None and saved["update"] < update:
            hooks.checkpoint(update, state)
    finally:
        dispatcher.shutdown(wait=True)
    if profile is not None:  # the run ended inside the profiled updates, or before them
        profile.close(update, state)
    return state, last_row, update


def _background(fn: Callable, *args) -> concurrent.futures.Future:
    """`fn(*args)` on a thread of its own, to overlap with what the caller does next (JAX
    releases the GIL while it compiles, runs or waits on a device)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


# -- the run directory and resume -----------------------------------------------------------

def resolve(cfg, given: dict):
    """The config this command runs: `cfg` for a new run; for `--resume` of an existing run, the
    run's own config.json with the changes a resume may make (config.resumed). Returns the
    config and the list of changes, which the run logs."""
    if not cfg.resume or not cfg.run_dir:
        return cfg, []
    path = Path(cfg.run_dir)
    if not (path / "config.json").exists() and (cfg.resume == "auto" or not path.exists()):
        return cfg, []  # nothing to resume; plan_run_dir says what happens next
    saved = config_lib.read_saved(path)
    state_keys = config_lib.STATE_KEYS + ALGOS[saved["algo"]].STATE_KEYS
    try:
        return config_lib.resumed(saved, given, state_keys)
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


def plan_run_dir(cfg) -> tuple[Path, int | None]:
    """The run directory and the checkpoint step to resume from (None: a fresh start).
    Checks only; creates nothing. A run directory is never clobbered."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(parallel.broadcast(int(time.time()))))
    path = Path(cfg.run_dir or f"runs/{cfg.env}-{cfg.algo}-{stamp}")  # the same name on every process
    # A learner may start in a directory its collectors began to fill (collectors may start
    # first): a store alone is not a run.
    collected_only = cfg.mode == "learn" and path.is_dir() and {p.name for p in path.iterdir()} <= {"store"}
    occupied = path.exists() and (not path.is_dir() or any(path.iterdir())) and not collected_only
    if not cfg.resume:
        if occupied:
            raise ConfigError(f"--run-dir {path} already exists and is not empty; choose a new directory "
                              f"or continue it with --resume")
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


def banner(cfg, par: Parallel, layout: Split, per_update: str) -> dict:
    """The start-up summary of the distributed setup. `layout` is the algorithm's
    {what: (global, per device)} split of the batch (its `check`)."""
    device = par.devices[0]
    rows = {
        "jaxrl_mgpu": f"{cfg.algo} on {cfg.env}" + ("" if cfg.algo == "ad" else f", policy {cfg.policy}")
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
                 for what, (total, per_device) in layout.items()})
    if cfg.auto_scale:
        size = "--ad-batch-size" if cfg.algo == "ad" else "--num-envs"
        rows["auto-scale"] = (f"{cfg.auto_scale}: {size} {getattr(cfg, size[2:].replace('-', '_'))} chosen at the "
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


def saved_steps(ckpts: Checkpoints, step: int, unit: str, steps_per_update: int) -> int:
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


def run(cfg, par: Parallel, layout: Split, notes: list[str], asynchronous=None, auto_scale_s: float = 0.0) -> int:
    """Trains in the run directory, from its latest checkpoint with `--resume`: `--mode both`,
    or a `--mode learn` learner fed by `asynchronous` (asynchronous/dqn.py or ad.py), in the
    same loop. `notes`: lines said under the banner (what a resume changed, what followed the
    log points); `auto_scale_s`: the seconds --auto-scale searched before this (the summary's
    own line). Returns the exit code."""
    entered = time.monotonic()
    run_dir, resume_step = plan_run_dir(cfg)
    if cfg.profile:
        check_writable(Path(cfg.profile), "--profile")
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    learner = cfg.mode == "learn"
    recreated: list[str] = []
    set_aside: list[str] = []  # damaged checkpoints moved out of the way, said in the log
    start_cfg = cfg
    while True:  # from the newest checkpoint down, until one reads back whole
        cfg = start_cfg
        try:
            if resume_step is not None:
                if not learner:
                    done = _reading(run_dir, lambda r: saved_steps(r, resume_step, step_unit(cfg), steps_per_update(cfg)))
                    cfg = dataclasses.replace(cfg, resumed_update=resume_step, resumed_steps=done)
                else:
                    _reading(run_dir, lambda r: r.meta(resume_step))
                if cfg.stop_at_update is not None and cfg.stop_at_update <= resume_step < cfg.total_updates:
                    raise ConfigError(f"--stop-at-update {cfg.stop_at_update}: the run is already at update "
                                      f"{resume_step}")
                if resume_step >= cfg.total_updates:
                    for line in set_aside:
                        print(line)
                    ended = "" if learner else f", {cfg.resumed_steps:,} {step_unit(cfg)}"
                    print(f"the run in {run_dir} is already complete (update {resume_step} of {cfg.total_updates}"
                          f"{ended}); nothing to do. To train it further, resume with a larger "
                          f"{'--num-updates' if cfg.num_updates is not None else '--total-timesteps'}")
                    return 0
            parallel.barrier("run directory checked")  # every process checks it before process 0 writes in it
            trainer = Trainer(cfg, par, asynchronous.algorithm(cfg, par, layout) if learner else None, layout)
            # A learner publishes its initial state for the collectors before it compiles.
            state = trainer.init_state() if learner else None
            if resume_step is not None:
                # Restored before process 0 rewrites config.json and metrics.jsonl, so that a
                # checkpoint this version cannot read leaves the run directory as it was.
                target = state if learner else trainer.init_state()
                state, recreated = _reading(run_dir, lambda r: r.restore(resume_step, target, trainer.layout,
                                                                         trainer.par))
            break
        except DamagedCheckpoint as e:
            resume_step, note = _set_aside(run_dir, e)
            set_aside.append(note)
    par = trainer.par  # with many runs, laid out for them (multirun.setup)
    if parallel.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(config_lib.dump(cfg))
        # Rows logged after the checkpoint we resume from are logged again by this run.
        truncate_metrics(run_dir / "metrics.jsonl", resume_step or 0)
    parallel.barrier("run directory ready")
    unit, per_update = trainer.step_unit, trainer.steps_per_update
    runs = None if trainer.runs is None else [trainer.runs.describe(i) for i in range(trainer.runs.count)]
    log = RunLog(run_dir, cfg.steps_at(cfg.total_updates, per_update), unit=unit, episodic=cfg.algo != "ad",
                 runs=runs)
    log.banner(banner(cfg, par, layout, asynchronous.per_update(cfg) if learner else f"{per_update:,} {unit}"))
    for note in notes:
        log.print(f"  {note}")
    for line in set_aside:
        log.print(f"  {line}")
    ckpts = Checkpoints(run_dir, keep=cfg.keep_checkpoints)
    start = 0
    if resume_step is None:
        if cfg.resume == "auto":
            log.print("  --resume auto: no checkpoint yet, starting fresh")
    else:
        start = resume_step
    if resume_step is not None and not learner:  # (a learner says where it resumed: asynchronous/ledger.py)
        log.print(f"  resumed from the checkpoint at update {start} ({cfg.resumed_steps:,} {unit})"
                  + (f"; re-created {', '.join(recreated)} (the saved ones do not fit {count(par.num_devices, 'device')}"
                     f" x {cfg.num_envs} envs)" if recreated else ""))

    log.timeline["imports_and_devices_s"] = entered - jaxrl_mgpu.STARTED - auto_scale_s
    if auto_scale_s:
        log.timeline["auto_scale_s"] = auto_scale_s
    log.timeline["setup_s"] = time.monotonic() - entered  # algorithm, initial state, restore, log files
    stop = StopSignal(log)
    t_start = time.perf_counter()
    feed = None
    try:
        if learner:
            feed = asynchronous.Feed(cfg, par, layout, trainer.algo, ckpts, log, resume_step, state)
            hooks = Hooks(checkpoint=feed.checkpoint, stop=stop)
        else:
            hooks = trainer_hooks(cfg, trainer, par, ckpts, stop)
        # A resumed run's diverged runs (their frozen state is in the checkpoint) keep the update
        # where they went non-finite, from the rows logged before it.
        diverged = runstats.diverged_runs(runstats.read_rows(run_dir / "metrics.jsonl")) if trainer.runs else {}
        state, last, done = train(trainer, log, state, start, hooks, stop_at=cfg.stop_at_update, feed=feed,
                                  diverged=diverged)
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
        return 1
    finally:
        if feed is not None:
            feed.close()
        stop.restore()
        log.close()
        ckpts.close()  # waits for the asynchronous saves
    if done < cfg.total_updates:
        log.print(f"stopped at update {done} of {cfg.total_updates} with a checkpoint; continue with --resume")
    if learner:  # what it learned from: the env steps the collectors sent
        unit, steps = "env_steps", last.get("env_steps", feed.ledger.env_steps)
    else:
        steps = last.get(unit, cfg.steps_at(done, trainer.steps_per_update))
    values = summary(cfg, log, last, done, unit, steps, time.perf_counter() - t_start, run_dir)
    stopped_runs = [f"run {i} at update {r['diverged_at']}" for i, r in enumerate(last.get("runs", []))
                    if "diverged_at" in r]
    if stopped_runs:  # many runs: where each run that went non-finite did
        values["diverged_runs"] = ", ".join(stopped_runs)
    across = []
    if trainer.runs is not None and parallel.is_main():  # per configuration, across its seeds
        across = runstats.write(run_dir, trainer.runs.names, unit, cfg.target_return)
        values["across_runs"] = (f"{len(across)} configuration(s) x {trainer.runs.seeds} seed(s): runs_summary.json, "
                                 f"learning_curves.png")
    log.summary(values)
    for line in runstats.lines(across, () if trainer.runs is None else trainer.runs.names):
        log.print(f"  {line}")
    return 0


def summary(cfg, log: RunLog, last: dict, done: int, unit: str, steps: int | None, seconds: float,
            run_dir: Path) -> dict:
    """What a user wants to know at the end of a run (also written to summary.json)."""
    best = log.best
    values = {
        "status": "complete" if done >= cfg.total_updates else f"stopped at update {done} (continue with --resume)",
        "updates": done,
        unit: steps,
        "time_s": round(seconds, 1),
    }
    if log.episodic:
        values["final_return"] = last.get("episode_return")
        values["best_return"] = best.get("episode_return", (None,))[0]
        if "eval/episode_return" in best:
            values["best_eval_return"] = best["eval/episode_return"][0]
    for key in ("loss/cross_entropy", "loss/accuracy"):
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


def trainer_hooks(cfg, trainer, par: Parallel, ckpts, stop):
    """What `--mode both` does between chunks (Hooks): checkpoints, and evaluations that also
    keep the best parameters so far (checkpoints/best)."""
    unit, per_update = trainer.step_unit, trainer.steps_per_update
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

    return Hooks(checkpoint=checkpoint, evaluate=evaluate if cfg.eval_every else None, stop=stop)
