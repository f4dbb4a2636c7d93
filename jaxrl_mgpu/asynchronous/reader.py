"""Reading the store's shards in the background, oldest first, so that a learner keeps
learning while it reads."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from jaxrl_mgpu.asynchronous.store import Shard, Store
from jaxrl_mgpu.asynchronous.workers import Pool

IDLE_S = 0.01  # with nothing new listed, the reader lists the store again this often


class ShardReader:
    """Reads the store's shards in a background thread, oldest first, so the learner keeps
    learning while it reads (a large shard takes longer to decode than many learning chunks
    take to run, and collectors may write faster than one thread decodes). `read(shard)` turns
    a shard into what the learner inserts (None skips it); at most `max_ready` read shards
    wait, so a slow learner holds back the reader, not its memory. After a restart (`refill`),
    the shards in `consumed` are read once more, to refill the learner's on-device memory, and
    are flagged as not new (not counted again).

    With `decode` (a picklable function of a shard, used in place of `read`), shards are decoded
    by `workers` processes (workers.Pool), several at once, and delivered oldest first: TFDS
    parses records in Python, which on a thread holds the GIL the learner's thread needs to
    dispatch its compiled steps. The thread then only waits for the processes and unpickles the
    arrays."""

    def __init__(self, store: Store, consumed: set, refill: bool, read: Callable[[Shard], Any],
                 decode: Callable[[Shard], Any] | None = None, workers: int = 1, max_ready: int = 4):
        self._store, self._read, self._refill = store, read, refill
        self._seen = set() if refill else set(consumed)
        # The newest shard taken up to be read (or decoded): what collectors count as unread is
        # written after it. Not the newest the learner has taken from this reader: then the
        # reader's own pipeline (up to max_ready + workers shards) would count as unread too,
        # more than the collectors' slack, and they would pause while the learner waits for data.
        self.newest_taken: str | None = None
        self.untaken_steps = 0  # transitions in the shards listed at the last pass, not taken up yet
        # Transitions taken up and not yet handed to the learner (`pipeline_steps`), as counts
        # that each have one writer: taken (this thread), delivered (the learner's), skipped
        # (this thread: evicted while being read).
        self._taken_steps = self._delivered_steps = self._skipped_steps = 0
        self._consumed_at_start = set(consumed)
        self._ready: queue.Queue = queue.Queue(max_ready)
        self._stop, self._error = threading.Event(), None
        self._decoders = Pool(decode, workers) if decode is not None else None
        self._timing = [0.0, 0]  # seconds spent reading, shards read, since decode_seconds() last asked
        self._timing_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="shard-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                listed = [s for s in self._store.shards() if s.path.name not in self._seen]
                # (for the learner's log, without a listing of its own)
                self.untaken_steps = sum(s.meta.get("env_steps", 0) for s in listed)
                for shard in listed:
                    if self._stop.is_set():
                        return
                    if self._decoders is not None and self._decoders.full:
                        break  # the rest on a later pass, once a decoder is free
                    self._seen.add(shard.path.name)
                    self.newest_taken = max(self.newest_taken or "", shard.path.name)
                    self.untaken_steps -= shard.meta.get("env_steps", 0)
                    if not shard.path.exists():  # evicted by the learner since the listing
                        continue
                    self._taken_steps += shard.meta.get("env_steps", 0)
                    if self._decoders is not None:
                        self._decoders.submit(shard, tag=shard)
                        continue
                    start = time.perf_counter()
                    self._taken(shard, lambda: self._read(shard), lambda: time.perf_counter() - start)
                if self._decoders is None or not self._decoders.in_flight:
                    if not listed:
                        time.sleep(IDLE_S)
                    continue
                # Hand over the decoded shards, oldest first, waiting for the oldest at most
                # IDLE_S, then list again: waiting for the oldest decode before listing again
                # would take up a written shard up to a decode late.
                wait = IDLE_S
                while not self._stop.is_set() and self._decoders.oldest_answers_within(wait):
                    shard, wait = self._decoders.oldest, 0.0
                    self._taken(shard, lambda: self._decoders.receive()[1], lambda: self._decoders.seconds)
        except BaseException as e:  # handed to the learner's thread by ready()
            self._error = e

    def _taken(self, shard: Shard, take: Callable[[], Any], seconds: Callable[[], float]) -> None:
        """Hands `take()` (the shard read or decoded) to the learner, unless the shard was
        evicted while being read."""
        try:
            data = take()
        except Exception:
            if shard.path.exists():
                raise
            self._skipped_steps += shard.meta.get("env_steps", 0)
            return  # evicted while being read
        with self._timing_lock:
            self._timing[0] += seconds()
            self._timing[1] += 1
        new = shard.path.name not in self._consumed_at_start
        while not self._stop.is_set():  # a bounded wait, so close() is never stuck
            try:
                self._ready.put((shard, new, data), timeout=0.1)
                return
            except queue.Full:
                continue

    def ready(self) -> list[tuple[Shard, bool, Any]]:
        """The shards read since the last call (oldest first): (shard, is it new, read(shard))."""
        out = []
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            self._delivered_steps += item[0].meta.get("env_steps", 0)
            if item[2] is not None:
                out.append(item)
        if self._error is not None and not out:
            raise self._error
        return out

    @property
    def pipeline_steps(self) -> int:
        """Transitions in the shards taken up to be read and not yet handed to the learner."""
        return max(self._taken_steps - self._delivered_steps - self._skipped_steps, 0)

    def decode_seconds(self) -> float | None:
        """Mean seconds per shard read (by one decoder) since the last call (None: none read)."""
        with self._timing_lock:
            (seconds, shards), self._timing = self._timing, [0.0, 0]
        return seconds / shards if shards else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._decoders is not None:
            self._decoders.close()
