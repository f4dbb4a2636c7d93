"""The asynchronous DQN learner's ingest: n-step transitions on their way from the shard
reader to the on-device replay (`Ingest`), queued on the host, copied to the devices in whole
blocks on a thread of their own while a chunk runs, and inserted between chunks within a
budget, so that ingest never crowds out learning."""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Any

import numpy as np

from jaxrl_mgpu.algos.replay import Transitions

BLOCK = 256                   # transitions per device per small replay insert (one compiled shape)
LARGE_BLOCK = 4096            # ... and per large insert (a second compiled shape), while there are as many
INSERT_BUDGET = 4 * LARGE_BLOCK   # transitions per device inserted between two chunks at most
QUEUE_STEPS = 2               # the learner takes shards from its reader while it holds fewer than this many budgets


def _host_blocks(pending: list[Transitions], devices: int,
                 budget: int | None = None) -> tuple[list[Transitions], list[Transitions]]:
    """Whole blocks from the front of `pending`, at most `budget` transitions per device (None: all): of
    LARGE_BLOCK per device while there are that many, then of BLOCK; and what remains (the
    queue's arrays, or views of them). A block within one queued array is a view of it; only a
    block across two joins its own rows: the learner's thread never copies a whole shard (a
    large one is as long to copy as a learning chunk is to run), nor the queue per block."""
    available = sum(len(t.reward) for t in pending)
    sizes, room = [], available if budget is None else budget * devices
    for size in (LARGE_BLOCK * devices, BLOCK * devices):
        while available >= size and room >= size:
            sizes.append(size)
            available, room = available - size, room - size
    queue, blocks = list(pending), []
    for size in sizes:
        parts, need = [], size
        while need:
            head, n = queue[0], len(queue[0].reward)
            if n <= need:
                parts.append(queue.pop(0))
                need -= n
            else:
                parts.append(Transitions(*(f[:need] for f in head)))
                queue[0] = Transitions(*(f[need:] for f in head))
                need = 0
        blocks.append(parts[0] if len(parts) == 1 else Transitions(*(np.concatenate(f) for f in zip(*parts))))
    return blocks, queue


class Ingest:
    """Transitions on their way from the shard reader to the replay: queued on the host, copied
    to the devices in whole blocks (_host_blocks) on a copier thread, then inserted. `to_devices`
    (on the copier thread) lays a host block out on the devices; `insert` puts a copied block
    into the replay. While a chunk runs, `stage` starts copying every whole block; between
    chunks, `insert_arrived` inserts the copies that have arrived, at most `budget` transitions
    per device, so ingest never crowds out learning. The queue is bounded: the learner takes shards from its reader only
    while `has_room`, so when ingest falls behind, the reader stops, unread shards pile up in the
    store, and collectors pause (rate.READING) instead of the learner's memory growing."""

    def __init__(self, devices: int, to_devices, insert, budget: int = INSERT_BUDGET):
        self.devices, self.to_devices, self.insert, self.budget = devices, to_devices, insert, budget
        self.pending: list[Transitions] = []  # read, not yet on their way to the devices
        # per add, oldest first: [its transitions not yet inserted, its tag]; and (transitions,
        # tag) inserted since the caller last emptied `landed` (inserts keep the order of adds)
        self.stamps: collections.deque[list] = collections.deque()
        self.landed: list[tuple[int, Any]] = []
        # blocks being copied, oldest first: (transitions, the copy's future)
        self.copies: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
        self.copier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replay-copier")

    @property
    def copying(self) -> int:
        """Transitions on their way to the devices (all devices)."""
        return sum(rows for rows, _ in self.copies)

    @property
    def queued(self) -> int:
        """Transitions read, not yet in the replay (all devices)."""
        return sum(len(t.reward) for t in self.pending) + self.copying

    @property
    def has_room(self) -> bool:
        return self.queued < QUEUE_STEPS * self.budget * self.devices

    def add(self, transitions: Transitions, tag: Any = None) -> None:
        """Queues `transitions`; `tag` (e.g. the policy step that collected them) comes back in
        `landed` once they are in the replay."""
        self.pending.append(transitions)
        self.stamps.append([len(transitions.reward), tag])

    def _land(self, inserted: int) -> None:
        while inserted:
            head = self.stamps[0]
            n = min(inserted, head[0])
            self.landed.append((n, head[1]))
            head[0], inserted = head[0] - n, inserted - n
            if not head[0]:
                self.stamps.popleft()

    def stage(self) -> None:
        """Starts copying the queue's whole blocks to the devices (on the copier thread): host
        work, done while a chunk runs, so that they are there to insert when it ends. (The
        queue, and so what is on its way, is bounded by `has_room`.)"""
        blocks, self.pending = _host_blocks(self.pending, self.devices)
        for block in blocks:
            self.copies.append((len(block.reward), self.copier.submit(self.to_devices, block)))

    def insert_arrived(self) -> int:
        """Inserts the blocks whose copies have arrived, oldest first, at most `budget`
        transitions per device (between chunks: the insert takes the replay the chunks read, and
        the devices wait for it); returns the transitions inserted."""
        inserted = 0
        while (self.copies and self.copies[0][1].done()
               and inserted + self.copies[0][0] <= self.budget * self.devices):
            rows, copied = self.copies.popleft()
            self.insert(copied.result())
            inserted += rows
        self._land(inserted)
        return inserted

    def close(self) -> None:
        self.copier.shutdown(wait=True, cancel_futures=True)
