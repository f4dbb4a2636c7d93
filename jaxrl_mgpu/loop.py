"""The host loop: chunks of updates dispatched to the devices, and what happens between them.

A chunk is the trainer's one compiled program (chunks.Trainer) running some updates. The loop
keeps one chunk in flight: the next is dispatched before the host reads the last one's
numbers, so the devices never wait on logging; the dispatch itself runs on a thread of its
own, since XLA:GPU drives a loop whose trip count is a run-time value from the host and
returns only when the chunk is all but done. Between chunks, at the points the options say,
the callbacks log, evaluate, checkpoint and profile. A chunk ends at every log point and after
about CHUNK_S seconds, so a stop request (which waits for the chunks already dispatched) is
honoured within seconds; where chunks end does not change the numbers.

Where the data comes from is a `Source` (sources.py): the devices' own rollouts (`OnDevice`),
or what collectors send a learner (asynchronous/). The loop asks it, before each chunk, how many
updates may run, and lets it take in data while a chunk runs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax

from jaxrl_mgpu import parallel
from jaxrl_mgpu.chunks import Chunk, ChunkReader, Trainer
from jaxrl_mgpu.sources import OnDevice, Source
from jaxrl_mgpu.stop import StopSignal

# A chunk runs for about this long at most, so that a stop request, which waits for the chunks
# already dispatched (at most two), is honoured within seconds whatever --log-every is.
CHUNK_S = 2.0


class Callbacks(NamedTuple):
    """What the loop does between chunks; any may be None."""
    log: Callable[[dict, int], None] | None = None          # (row, updates since the last row)
    evaluate: Callable[[int, Any], dict] | None = None      # (update, state) -> eval/ metrics for the row
    checkpoint: Callable[[int, Any], None] | None = None    # (update, state)
    dispatched: Callable[[int, Any, tuple | None], None] | None = None  # (updates, state, (returned, began) | None)
    profile: Any = None                                     # Profile: at(update, state), close(update, state)
    stop: StopSignal | None = None


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


class Span(NamedTuple):
    """The updates a loop runs."""
    start: int            # it starts after this one (0, or the checkpoint resumed from)
    end: int              # its last (the run's last, or --stop-at-update)
    stop_at: int | None   # --stop-at-update


@dataclasses.dataclass
class Progress:
    """Where the loop is, in updates."""
    update: int            # dispatched so far
    dispatched_to: int     # the last update of the chunk dispatched last
    logged: int            # the last row's
    saved: int | None      # the newest checkpoint's (None: none yet)
    interval_start: int    # the open log interval began after this update ...
    carry: Chunk | None    # ... and its earlier chunks' numbers, where it spans several


@dataclasses.dataclass
class Clock:
    """The loop's times (time.perf_counter) and the chunk sizer timed by them."""
    sizer: ChunkSizer
    start: float                      # the loop's first dispatch (after compiling)
    prev: float                       # the last row's
    returned_at: float | None = None  # when the last dispatch returned

    @classmethod
    def now(cls, sizer: ChunkSizer) -> "Clock":
        now = time.perf_counter()
        return cls(sizer, now, now)


def due(every: int | None, update: int) -> bool:
    return bool(every) and update % every == 0


class Loop:
    """One run of the loop, from `start_update` to the last update, `stop_at`, or a stop
    request. `reader`: reads a chunk's numbers (chunks.ChunkReader: with many runs, it also
    keeps which went non-finite). `saved`: the update of the run's newest checkpoint (None: it
    has none yet, and a stop before the first update saves the initial state, so that what the
    run says on stopping holds)."""

    def __init__(self, trainer: Trainer, log, source: Source = OnDevice(), callbacks: Callbacks = Callbacks(),
                 start_update: int = 0, stop_at: int | None = None, reader: ChunkReader | None = None,
                 saved: int | None = None):
        self.trainer, self.log, self.source, self.cb = trainer, log, source, callbacks
        self.reader = reader or ChunkReader(trainer.par)
        self.span = Span(start_update, trainer.end(stop_at), stop_at)
        self.at = Progress(start_update, start_update, start_update, saved, start_update, None)
        self.clock = Clock.now(ChunkSizer())
        self.pending: InFlight | None = None  # the chunk dispatched last, not read yet
        self.last_row: dict = {}
        self.dispatcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chunk-dispatch")

    @property
    def cfg(self):
        return self.trainer.cfg

    @property
    def aot(self) -> bool:
        """Whether the chunk is compiled ahead of time (pmap over several processes compiles on
        its first call)."""
        return self.trainer.par.backend != "pmap" or jax.process_count() == 1

    @property
    def alone(self) -> bool:
        """One process. Across processes, reading a chunk and the decisions between chunks are
        collectives, which every process must issue in the same order as the chunks: never
        beside a dispatch."""
        return jax.process_count() == 1

    def doing(self) -> str:
        """What a stop request waits for (the stop signal's acknowledgement)."""
        update_s = self.clock.sizer.update_s
        eta = "" if update_s is None else f", about {update_s * (self.at.dispatched_to - self.at.update):.0f}s"
        return f"after update {self.at.dispatched_to}, the last one dispatched{eta}"

    # -- reading chunks -----------------------------------------------------------------
    def read(self, chunk: InFlight) -> None:
        """Reads a chunk (blocks until it is done): its non-finite check, and where its row is
        due, the row (`last_row`)."""
        trainer = self.trainer
        first = chunk.last - chunk.length + 1
        what = f"updates {first}-{chunk.last}" + ("" if self.aot or first > self.span.start + 1 else
                                                  " (compiled on this first call: pmap over several processes)")
        with self.log.waiting(what):
            row = self.reader.read(chunk.metrics, chunk.interval_start + 1, chunk.row_due)
        now = time.perf_counter()
        if chunk.length:
            self.clock.sizer.done(chunk.length, chunk.dispatched_at, now)
        self.log.timeline.setdefault("first_chunk_s", now - self.clock.start)
        if chunk.row_due:
            unit, per_update = trainer.step_unit, trainer.steps_per_update
            updates = chunk.last - chunk.interval_start
            self.last_row = {"update": chunk.last, unit: self.cfg.steps_at(chunk.last, per_update), **row,
                             "sps": updates * per_update / (now - self.clock.prev),
                             "time": now - self.clock.start}
            self.clock.prev = now

    def write(self, update: int) -> None:
        if self.cb.log is not None:
            self.cb.log(self.last_row, update - self.at.logged)
        self.at.logged = update

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
        self.log.start(self.cfg.steps_at(self.span.start, self.trainer.steps_per_update))
        self.clock = Clock.now(self.clock.sizer)
        if self.cb.stop is not None:
            self.cb.stop.activity = self.doing
        stopping, limit = False, 1
        try:
            while self.at.update < self.span.end:
                if self.cb.profile is not None:
                    self.cb.profile.at(self.at.update, state)
                if self.alone and self.cb.stop is not None and self.cb.stop.requested:
                    stopping = True  # no chunk is dispatched after a stop request
                    break
                state, length = self.next_chunk(state, limit)
                if not length:  # stopped while the source waited for data
                    stopping = True
                    break
                self.at.update += length
                final = self.at.update in (self.cfg.total_updates, self.span.stop_at)
                # One collective for both decisions; the length from the chunks read so far.
                stopping, limit = parallel.agree(self.cb.stop is not None and self.cb.stop.requested,
                                                 self.clock.sizer.limit())
                self.between_chunks(state, length, final, stopping)
                if final or stopping:
                    break
            self.finish(state, stopping)
        finally:
            self.dispatcher.shutdown(wait=True)
        if self.cb.profile is not None:  # the run ended inside the profiled updates, or before them
            self.cb.profile.close(self.at.update, state)
        return state, self.last_row, self.at.update

    def next_chunk(self, state, limit: int) -> tuple[Any, int]:
        """Asks the source how many updates may run, dispatches them (at most `limit`, and not
        past the next log point), and meanwhile reads the chunk before. Returns the new state
        and the updates dispatched (0: stopped while waiting for data)."""
        update, waited = self.at.update, []

        def waiting() -> None:
            waited.append(True)
            if self.pending is not None:
                self.settle(self.pending)
                self.pending = None

        allowed = self.source.before(update, lambda: self.cb.stop is not None and self.cb.stop(), waiting)
        if not allowed:
            return state, 0
        length = min(self.trainer.next_length(update, self.span.end), limit, allowed)
        between = None if waited or self.clock.returned_at is None else (self.clock.returned_at, time.perf_counter())
        dispatched_at = time.perf_counter()
        dispatch = self.dispatcher.submit(self.trainer.run_chunk, length, state, self.at.carry, self.source.data)
        self.at.dispatched_to = update + length
        if self.pending is not None and self.alone:
            self.settle(self.pending, update)
            self.pending = None
        self.source.during(update, dispatch.done)
        state, metrics = dispatch.result()
        self.clock.returned_at = time.perf_counter()
        if self.pending is not None:  # several processes: read once the dispatch is done
            self.settle(self.pending, update)
            self.pending = None
        if self.cb.dispatched is not None:
            self.cb.dispatched(length, state, between)
        self.pending = InFlight(self.at.interval_start, update + length, length, metrics, dispatched_at, False)
        return state, length

    def between_chunks(self, state, length: int, final: bool, stopping: bool) -> None:
        """After a chunk: its interval ends at a log point, the last update or a stop; where the
        state is needed as it is now (an evaluation, a checkpoint), the chunk is read now."""
        update, cb = self.at.update, self.cb
        ends_interval = update % self.cfg.log_every == 0 or final or stopping
        self.pending = self.pending._replace(row_due=ends_interval)
        self.at.interval_start, self.at.carry = ((update, None) if ends_interval else
                                                 (self.at.interval_start, self.pending.metrics))
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
            self.at.saved = update

    def finish(self, state, stopping: bool) -> None:
        """The last chunk's row; asked to stop between log points, the row of the updates since
        the last one, and a checkpoint."""
        if stopping and self.at.carry is not None:
            self.pending = (self.pending._replace(row_due=True) if self.pending is not None else
                            InFlight(self.at.interval_start, self.at.update, 0, self.at.carry, time.perf_counter(), True))
        if self.pending is not None:
            self.settle(self.pending)
            self.pending = None
        if stopping and self.cb.checkpoint is not None and (self.at.saved is None or self.at.saved < self.at.update):
            self.cb.checkpoint(self.at.update, state)
