"""The training chunk: `n` updates of an algorithm in one compiled program, mapped over the
devices, and what the host reads of it.

An algorithm (algos/base.Algorithm) gives per-device functions `init(key)` and
`update(state, *data)`. A chunk runs `n` of its updates in one `lax.fori_loop`, with `n` an
argument, not a shape, so ONE program serves every chunk length. Its numbers (losses, finished
episodes, the first non-finite update) are sums over its log interval, carried on from chunk to
chunk, so a log interval's row is the same however many chunks ran it.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import compile_cache, parallel
from jaxrl_mgpu.algos.base import Algorithm, all_finite
from jaxrl_mgpu.episodes import make_episodes, summarize
from jaxrl_mgpu.parallel import Parallel


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


class Trainer:
    """A plan's algorithm (plan.Plan: its config, devices and runs; by default the algorithm
    `plan.algorithm()` builds) and the one compiled chunk that runs it."""

    def __init__(self, plan, algorithm: Algorithm | None = None):
        self.plan, self.cfg, self.par, self.runs = plan, plan.cfg, plan.par, plan.runs
        self.env, self.env_params = plan.env, plan.env_params
        self.algorithm = algorithm = plan.algorithm() if algorithm is None else algorithm
        self.layout, self.data = algorithm.layout, algorithm.data
        self.step_unit, self.steps_per_update = plan.progress()
        self._compiled = None
        self._init = None
        self._eval = None
        self._eval_ready: concurrent.futures.Future | None = None
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

    def _mapped(self, state, data: tuple) -> tuple[Callable, tuple]:
        """The chunk mapped over the devices, and its arguments for `state` and `data` (a chunk
        of one update that starts an interval)."""
        empty, chunk = make_chunk(self.algorithm.update, self.algorithm.finite)
        if self._empty is None:
            # An interval with no update yet: zeros of the chunk's sums (its values are unused
            # where a chunk starts an interval), put on the devices from the host; pmap across
            # processes has no abstract evaluation of global arrays, so there they are computed
            # (the state is concrete there: such a chunk compiles on its first call).
            if self.par.backend == "pmap" and jax.process_count() > 1:
                self._empty = self.par.map(empty)(state, *data)
            else:
                shapes = jax.eval_shape(self.par.map(empty), state, *data)
                self._empty = self.par.replicate(jax.tree.map(lambda s: np.zeros(s.shape[1:], s.dtype), shapes))
        return self.par.map(chunk, donate=True), (state, self._length(1), self._empty, self._flag(True), *data)

    def lower(self, state, data: tuple | None = None):
        """The chunk lowered for `state`'s (and `data`'s) shapes (`.as_text()`, `.compile()`)."""
        mapped, args = self._mapped(state, self.data if data is None else data)
        return mapped.lower(*args)

    def compile(self, state, data: tuple | None = None) -> None:
        """Compiles the chunk for `state`'s (and `data`'s) shapes, once (ahead of time where the
        backend can)."""
        if self._compiled is None:
            mapped, args = self._mapped(state, self.data if data is None else data)
            self._compiled = self.par.compile(mapped, *args)

    def prepare(self, log, state=None, data: tuple | None = None, aot: bool = True):
        """The chunk compiled for the state's shapes (`aot`: ahead of time), with the time and
        where it came from (the compilation cache) in `log`; the initial state (`state` None)
        is built meanwhile on a thread of its own where compiling ahead of time lets the two
        overlap. Returns the state."""
        t0 = time.perf_counter()
        compile_cache.settle()  # before two threads compile at once
        if state is None and aot:
            initial = _background(self.init_state)
            with log.waiting("compiling the training chunk"), compile_cache.CacheUse() as cache:
                self.compile(self.abstract_state(), data)
            state = initial.result()
        else:
            state = self.init_state() if state is None else state
            with log.waiting("compiling the training chunk"), compile_cache.CacheUse() as cache:
                self.compile(state, data)
        log.timeline["compile_s"] = time.perf_counter() - t0
        if aot:
            how = ("loaded from the compilation cache" if cache.all_loaded else
                   "compiled; kept in the compilation cache for the next run" if cache.requests else "compiled")
            log.print(f"  training chunk {how} in {time.perf_counter() - t0:.1f}s")
        return state

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

    def _evaluation(self) -> Callable:
        """The evaluation program, mapped over the devices (not compiled yet)."""
        if self._eval is None:
            if self.algorithm.evaluation is not None:
                episodes, self._summarize = self.algorithm.evaluation.episodes(
                    self.cfg.eval_episodes, self.par.num_devices, False)
            else:
                episodes = make_episodes(self.algorithm.policy, self.env, self.env_params, self.cfg.eval_episodes,
                                         self.par.num_devices, greedy=False)
                self._summarize = summarize
            self._eval = self.par.map(episodes)
        return self._eval

    def compile_evaluation(self) -> None:
        """Compiles the evaluation program on a thread of its own, beside the training chunk's
        compile and first chunks, so that the first evaluation does not stall training to
        compile it."""
        if self._eval_ready is None:
            mapped = self._evaluation()
            compile_cache.settle()  # before two threads compile at once
            self._eval_ready = _background(
                lambda: self.par.compile(mapped, self.abstract_state().params, self.key(self.cfg.seed)))

    def evaluate(self, params, update: int) -> dict:
        """`eval_episodes` episodes with the current params, spread over all devices."""
        program = self._evaluation() if self._eval_ready is None else self._eval_ready.result()
        # A fixed key per evaluation point: a resumed run evaluates like an uninterrupted one.
        key = self.key(self.cfg.seed + 1_000_003 * (update + 1))
        return self._summarize(self.par.first(program(params, key)))


def check_finite(par: Parallel, chunk: Chunk, first_update: int, diverged: dict | None = None) -> None:
    """A single run that went non-finite raises NonFinite, naming the numbers of its log interval
    that are (or else its parameters), at the update where it happened (`chunk.first_bad`,
    counted from `first_update`); with many runs, `diverged` ({run: the update where it went
    non-finite}) gains the runs that did, and NonFinite comes when every run has. Blocks until
    the chunk is done."""
    if par.runs is None:
        bad = par.first(chunk.first_bad)
        if bad >= 0:
            losses = par.first(chunk.losses)
            named = [k for k, v in losses.items() if not np.isfinite(np.asarray(v)).all()]
            raise NonFinite(f"non-finite {', '.join(named) or 'parameters'} at update {first_update + int(bad)}")
        return
    diverged = {} if diverged is None else diverged
    for run, bad in enumerate(par.runs_of(chunk.first_bad)):
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
    check_finite(par, chunk, first_update, diverged)
    if par.runs is None:
        return chunk_row(*par.first((chunk.losses, chunk.episodes)))
    losses, episodes = par.runs_of((chunk.losses, chunk.episodes))
    rows = [chunk_row(*jax.tree.map(lambda x: x[i], (losses, episodes))) for i in range(par.runs)]
    live = [r for i, r in enumerate(rows) if i not in diverged]
    means = {k: _mean([r[k] for r in live]) for k in rows[0] if k != "episodes"}
    for run, update in diverged.items():
        rows[run]["diverged_at"] = update
    return {**means, "episodes": sum(r["episodes"] for r in rows), "runs": rows}


# A loss logged at this many times its first logged size (or 1, if larger), or above LOSS_LIMIT,
# is taken for one that diverges while still finite: a step size far too large (PPO's value loss
# was 6e19 in its first log interval at --lr 1e9, DQN's TD loss 1e10 at --lr 1e3). Legitimate
# growth, as values rise with the returns, stays orders of magnitude below both.
LOSS_GROWTH = 1e6
LOSS_LIMIT = 1e9


class ChunkReader:
    """Reads chunks' numbers on the host for the loop (blocking until they are done): a row
    where one is due, else the non-finite check alone. With many runs it keeps which went
    non-finite and where (`diverged`: a resumed run's earlier ones to begin with), and tells
    `on_diverged(run, update, diverged so far)` once per run, so the loop knows none of it.
    `on_growth(text)` is told once per run, of its first loss that grows past LOSS_GROWTH times
    its first logged size, or past LOSS_LIMIT."""

    def __init__(self, par: Parallel, diverged: dict[int, int] | None = None,
                 on_diverged: Callable[[int, int, int], None] | None = None,
                 on_growth: Callable[[str], None] | None = None):
        self.par, self.diverged, self.on_diverged, self.on_growth = par, dict(diverged or {}), on_diverged, on_growth
        self.sizes: dict[tuple, float] = {}  # (run, loss) -> its first logged size
        self.told: set = set()  # the runs (None: the single run) whose losses have been said to diverge

    def read(self, chunk: Chunk, first_update: int, row: bool) -> dict | None:
        known = len(self.diverged)
        out = read_chunk(self.par, chunk, first_update, self.diverged) if row else \
            check_finite(self.par, chunk, first_update, self.diverged)
        if self.on_diverged is not None:
            for run in list(self.diverged)[known:]:
                self.on_diverged(run, self.diverged[run], len(self.diverged))
        if out is not None and self.on_growth is not None:
            self.watch_growth(out, first_update)
        return out

    def watch_growth(self, row: dict, first_update: int) -> None:
        runs = [(None, row)] if "runs" not in row else list(enumerate(row["runs"]))
        for run, numbers in runs:
            grown = []
            for key, value in numbers.items():
                # zeros are an interval before learning starts (SAC, DQN), not a size
                if run in self.told or not (key == "loss" or key.startswith("loss/")) or not np.isfinite(value) \
                        or value == 0:
                    continue
                first = self.sizes.setdefault((run, key), abs(value))
                if abs(value) > min(LOSS_GROWTH * max(first, 1.0), LOSS_LIMIT):
                    grown.append((abs(value), key, value, first))
            if grown:  # the largest of them
                _, key, value, first = max(grown)
                self.told.add(run)
                who = "" if run is None else f"run {run}: "
                self.on_growth(f"{who}{key} is {value:.3g} in the log interval from update {first_update} (first "
                               f"logged: {first:.3g}): training is diverging though still finite (a smaller --lr?)")


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
        row.update({f"env/{name}": float(x) / count if count else float("nan")
                    for name, x in episodes.metric_sums.items()})
    row.update({k: float(v) for k, v in losses.items()})
    return row


def _background(fn: Callable, *args) -> concurrent.futures.Future:
    """`fn(*args)` on a thread of its own, to overlap with what the caller does next (JAX
    releases the GIL while it compiles, runs or waits on a device)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future
