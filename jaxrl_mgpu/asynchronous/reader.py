"""Reading the store's shards on a background thread, oldest first, so that a learner keeps
learning while it reads."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from jaxrl_mgpu.asynchronous.store import Shard, Store


class ShardReader:
    """Reads the store's shards in a background thread, oldest first, so the learner keeps
    learning while it reads. Read on the learner's own thread, a 65k-step MinAtar shard took
    ~2 s of host time; two collectors wrote faster than that, and the learner then did nothing
    but read (seen on 4 H100s). `read(shard)` turns a shard into what the learner inserts (None
    skips it); at most `max_ready` read shards wait, so a slow learner holds back the reader,
    not its memory. After a restart (`refill`), the shards in `consumed` are read once more, to
    refill the learner's on-device memory, and are flagged as not new (not counted again)."""

    def __init__(self, store: Store, consumed: set, refill: bool, read, max_ready: int = 4):
        self._store, self._read, self._refill = store, read, refill
        self._seen = set() if refill else set(consumed)
        self._consumed_at_start = set(consumed)
        self._ready: queue.Queue = queue.Queue(max_ready)
        self._stop, self._error = threading.Event(), None
        self._thread = threading.Thread(target=self._run, name="shard-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                todo = [s for s in self._store.shards() if s.path.name not in self._seen]
                for shard in todo:
                    if self._stop.is_set():
                        return
                    self._seen.add(shard.path.name)
                    if not shard.path.exists():  # evicted by the learner since the listing
                        continue
                    try:
                        data = self._read(shard)
                    except Exception:
                        if shard.path.exists():
                            raise
                        continue  # evicted while being read
                    new = shard.path.name not in self._consumed_at_start
                    while not self._stop.is_set():  # a bounded wait, so close() is never stuck
                        try:
                            self._ready.put((shard, new, data), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                if not todo:
                    time.sleep(0.05)
        except BaseException as e:  # handed to the learner's thread by ready()
            self._error = e

    def ready(self) -> list[tuple[Shard, bool, Any]]:
        """The shards read since the last call (oldest first): (shard, is it new, read(shard))."""
        out = []
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if item[2] is not None:
                out.append(item)
        if self._error is not None and not out:
            raise self._error
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
