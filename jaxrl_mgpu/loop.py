"""The host loop: chunks of updates dispatched to the devices, and what happens between them.

A chunk is the trainer's one compiled program (chunks.Trainer) running some updates. The loop
keeps one chunk in flight: the next is dispatched before the host reads the last one's
numbers, so the devices never wait on logging; the dispatch itself runs on a thread of its
own, since XLA:GPU drives a loop whose trip count is a run-time value from the host and
returns only when the chunk is all but done. Between chunks, at the points the options say,
the callbacks log, evaluate, checkpoint and profile. A chunk ends at every log point and after
about CHUNK_S seconds, so a stop request (which waits for the chunks already dispatched) is
honoured within seconds; where chunks end does not change the numbers.

Where the data comes from is a `Source`: the devices' own rollouts (`OnDevice`), or what
collectors send a learner (asynchronous/). The loop asks it, before each chunk, how many
updates may run, and lets it take in data while a chunk runs.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
from typing import Any, Callable, NamedTuple, Protocol

import jax

from jaxrl_mgpu import parallel
from jaxrl_mgpu.chunks import Chunk, Trainer, check_finite, read_chunk
from jaxrl_mgpu.stop import StopSignal

# A chunk runs for about this long at most, so that a stop request, which waits for the chunks
# already dispatched (at most two), is honoured within seconds whatever --log-every is.
CHUNK_S = 2.0


class Source(Protocol):
    """Where the updates' data comes from."""

    data: tuple | None  # device memory the updates read (None: the algorithm's own)

    def before(self, update: int, stop: Callable[[], bool], waiting: Callable[[], None]) -> int:
        """Between chunks: puts what arrived into the devices' memory and says how many updates
        may run now. Where none may yet, it calls `waiting()` once (the loop reads the chunk it
        holds, so its row is not held back) and waits, saying what for, until one may; 0 where
        `stop()` said so meanwhile."""

    def during(self, update: int, done: Callable[[], bool]) -> None:
        """While a chunk runs, until `done()`: takes in what arrives, as far as the host can
        without touching the device memory the chunk reads."""


class OnDevice:
    """--mode both: the updates roll out their own data; any number may run at any time."""
    data = None

    def before(self, update: int, stop: Callable[[], bool], waiting: Callable[[], None]) -> int:
        return sys.maxsize

    def during(self, update: int, done: Callable[[], bool]) -> None:
        return None


class Callbacks(NamedTuple):
    """What the loop does between chunks; any may be None."""
    log: Callable[[dict, int], None] | None = None          # (row, updates since the last row)
    evaluate: Callable[[int, Any], dict] | None = None      # (update, state) -> eval/ metrics for the row
    checkpoint: Callable[[int, Any], None] | None = None    # (update, state)
    dispatched: Callable[[int, Any, tuple | None], None] | None = None  # (updates, state, (returned, began) | None)
    profile: Any = None                                     # Profile: at(update, state), close(update, state)
    stop: StopSignal | None = None
    # many runs: (run, the update where it went non-finite, runs diverged so far), once per run
    diverged: Callable[[int, int, int], None] | None = None


class ChunkSizer:
    """How many updates the next chunk may run: what fits in about `target_s` seconds of the
    devices' time at the speed of the last chunk read (one update to begin with)."""

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


def due(every: int | None, update: int) -> bool:
    return bool(every) and update % every == 0


class Loop:
    """One run of the loop, from `start_update` to the last update, `stop_at`, or a stop
    request. `diverged`: with many runs, those that went non-finite before (a resume). `saved`:
    the update of the run's newest checkpoint (None: it has none yet, and a stop before the
    first update saves the initial state, so that what the run says on stopping holds)."""

    def __init__(self, trainer: Trainer, log, source: Source = OnDevice(), callbacks: Callbacks = Callbacks(),
                 start_update: int = 0, stop_at: int | None = None, diverged: dict[int, int] | None = None,
                 saved: int | None = None):
        self.trainer, self.cfg, self.log, self.source, self.cb = trainer, trainer.cfg, log, source, callbacks
        self.start, self.end, self.stop_at = start_update, trainer.end(stop_at), stop_at
        # pmap over several processes compiles on its first call, not ahead of time
        self.aot = trainer.par.backend != "pmap" or jax.process_count() == 1
        # Across processes, reading a chunk and the decisions between chunks are collectives,
        # which every process must issue in the same order as the chunks: never beside a dispatch.
        self.alone = jax.process_count() == 1
        self.diverged = dict(diverged or {})  # many runs: {run: the update where it went non-finite}
        self.sizer = ChunkSizer()
        self.update = self.logged = self.dispatched_to = start_update
        self.saved = saved
        self.interval_start, self.carry = start_update, None  # the open log interval: its start, its last chunk
        self.pending: InFlight | None = None
        self.returned_at: float | None = None  # when the last dispatch returned
        self.last_row: dict = {}
        self.clock = {"start": time.perf_counter(), "prev": time.perf_counter()}
        self.dispatcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chunk-dispatch")

    def doing(self) -> str:
        """What a stop request waits for (the stop signal's acknowledgement)."""
        eta = "" if self.sizer.update_s is None else f", about {self.sizer.update_s * (self.dispatched_to - self.update):.0f}s"
        return f"after update {self.dispatched_to}, the last one dispatched{eta}"

    # -- reading chunks -----------------------------------------------------------------
    def read(self, chunk: InFlight) -> None:
        """Reads a chunk (blocks until it is done): its non-finite check, and where its row is
        due, the row (`last_row`)."""
        trainer, par = self.trainer, self.trainer.par
        first = chunk.last - chunk.length + 1
        what = f"updates {first}-{chunk.last}" + ("" if self.aot or first > self.start + 1 else
                                                  " (compiled on this first call: pmap over several processes)")
        known = len(self.diverged)
        with self.log.waiting(what):
            if chunk.row_due:
                row = read_chunk(par, chunk.metrics, chunk.interval_start + 1, self.diverged)
            else:
                check_finite(par, chunk.metrics, chunk.interval_start + 1, self.diverged)
        now = time.perf_counter()
        if chunk.length:
            self.sizer.done(chunk.length, chunk.dispatched_at, now)
        if self.cb.diverged is not None:
            for run in list(self.diverged)[known:]:
                self.cb.diverged(run, self.diverged[run], len(self.diverged))
        self.log.timeline.setdefault("first_chunk_s", now - self.clock["start"])
        if chunk.row_due:
            unit, per_update = trainer.step_unit, trainer.steps_per_update
            updates = chunk.last - chunk.interval_start
            self.last_row = {"update": chunk.last, unit: self.cfg.steps_at(chunk.last, per_update), **row,
                             "sps": updates * per_update / (now - self.clock["prev"]),
                             "time": now - self.clock["start"]}
            self.clock["prev"] = now

    def write(self, update: int) -> None:
        if self.cb.log is not None:
            self.cb.log(self.last_row, update - self.logged)
        self.logged = update

    def settle(self, chunk: InFlight, update: int | None = None) -> None:
        """Reads a chunk and writes its row where one is due; with `update`, the source takes
        in data until the chunk is done."""
        if update is not None:
            self.source.during(update, lambda: all(x.is_ready() for x in jax.tree.leaves(chunk.metrics)))
        self.read(chunk)
        if chunk.row_due:
            self.write(chunk.last)

    # -- the loop -----------------------------------------------------------------------
    def run(self, state=None) -> tuple[Any, dict, int]:
        """Runs chunks; returns the final state, the last log row and the updates done."""
        if self.cb.stop is not None:
            self.cb.stop.activity = lambda: "before the first update, once the training chunk is compiled"
        state = self.trainer.prepare(self.log, state, self.source.data, self.aot)
        self.log.start(self.cfg.steps_at(self.start, self.trainer.steps_per_update))
        self.clock = {"start": time.perf_counter(), "prev": time.perf_counter()}
        if self.cb.stop is not None:
            self.cb.stop.activity = self.doing
        stopping, limit = False, 1
        try:
            while self.update < self.end:
                if self.cb.profile is not None:
                    self.cb.profile.at(self.update, state)
                if self.alone and self.cb.stop is not None and self.cb.stop.requested:
                    stopping = True  # no chunk is dispatched after a stop request
                    break
                state, length = self.next_chunk(state, limit)
                if not length:  # stopped while the source waited for data
                    stopping = True
                    break
                self.update += length
                final = self.update in (self.cfg.total_updates, self.stop_at)
                # One collective for both decisions; the length from the chunks read so far.
                stopping, limit = parallel.agree(self.cb.stop is not None and self.cb.stop.requested,
                                                 self.sizer.limit())
                self.between_chunks(state, length, final, stopping)
                if final or stopping:
                    break
            self.finish(state, stopping)
        finally:
            self.dispatcher.shutdown(wait=True)
        if self.cb.profile is not None:  # the run ended inside the profiled updates, or before them
            self.cb.profile.close(self.update, state)
        return state, self.last_row, self.update

    def next_chunk(self, state, limit: int) -> tuple[Any, int]:
        """Asks the source how many updates may run, dispatches them (at most `limit`, and not
        past the next log point), and meanwhile reads the chunk before. Returns the new state
        and the updates dispatched (0: stopped while waiting for data)."""
        update, waited = self.update, []

        def waiting() -> None:
            waited.append(True)
            if self.pending is not None:
                self.settle(self.pending)
                self.pending = None

        allowed = self.source.before(update, lambda: self.cb.stop is not None and self.cb.stop(), waiting)
        if not allowed:
            return state, 0
        length = min(self.trainer.next_length(update, self.end), limit, allowed)
        between = None if waited or self.returned_at is None else (self.returned_at, time.perf_counter())
        dispatched_at = time.perf_counter()
        dispatch = self.dispatcher.submit(self.trainer.run_chunk, length, state, self.carry, self.source.data)
        self.dispatched_to = update + length
        if self.pending is not None and self.alone:
            self.settle(self.pending, update)
            self.pending = None
        self.source.during(update, dispatch.done)
        state, metrics = dispatch.result()
        self.returned_at = time.perf_counter()
        if self.pending is not None:  # several processes: read once the dispatch is done
            self.settle(self.pending, update)
            self.pending = None
        if self.cb.dispatched is not None:
            self.cb.dispatched(length, state, between)
        self.pending = InFlight(self.interval_start, update + length, length, metrics, dispatched_at, False)
        return state, length

    def between_chunks(self, state, length: int, final: bool, stopping: bool) -> None:
        """After a chunk: its interval ends at a log point, the last update or a stop; where the
        state is needed as it is now (an evaluation, a checkpoint), the chunk is read now."""
        update, cb = self.update, self.cb
        ends_interval = update % self.cfg.log_every == 0 or final or stopping
        self.pending = self.pending._replace(row_due=ends_interval)
        self.interval_start, self.carry = ((update, None) if ends_interval else
                                           (self.interval_start, self.pending.metrics))
        evaluate = cb.evaluate is not None and (due(self.cfg.eval_every, update) or final)
        checkpoint = cb.checkpoint is not None and (due(self.cfg.checkpoint_every, update) or final or stopping)
        if not (evaluate or checkpoint or final or stopping):
            return
        self.read(self.pending)
        self.pending = None
        if evaluate:
            self.last_row.update(cb.evaluate(update, state))
        if ends_interval:
            self.write(update)
        if checkpoint:
            cb.checkpoint(update, state)
            self.saved = update

    def finish(self, state, stopping: bool) -> None:
        """The last chunk's row; asked to stop between log points, the row of the updates since
        the last one, and a checkpoint."""
        if stopping and self.carry is not None:
            self.pending = (InFlight(self.interval_start, self.update, 0, self.carry, time.perf_counter(), True)
                            if self.pending is None else self.pending._replace(row_due=True))
        if self.pending is not None:
            self.settle(self.pending)
            self.pending = None
        if stopping and self.cb.checkpoint is not None and (self.saved is None or self.saved < self.update):
            self.cb.checkpoint(self.update, state)
