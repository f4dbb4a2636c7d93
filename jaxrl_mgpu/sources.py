"""Where a run's updates get their data, as the loop (loop.py) asks for it: a `Source`. In
--mode both the devices roll out their own (`OnDevice`); a --mode learn run's comes from the
collectors through the run's store (a `LearnerSource`: asynchronous/source.py's StoreSource is
the base of each algorithm's, algos/replay_async.py's and algos/ad/asynchronous.py's). Light: no
JAX, so the algorithms' specs (algos/spec.py) declare what their learner hands the loop."""

from __future__ import annotations

import sys
from typing import Any, Callable, Protocol


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


class LearnerSource(Source, Protocol):
    """A --mode learn run's Source, fed from the run's store, which the learner's session
    (session.py) also has log, checkpoint and end."""

    ledger: Any  # asynchronous/ledger.Ledger: what it received (env steps, episodes, ...)

    def ran(self, updates: int, state, between: tuple[float, float] | None = None) -> None:
        """A chunk of `updates` was dispatched (`between`: the host's time between two chunks)."""

    def log_row(self, row: dict, updates: int) -> dict:
        """The loop's row with the source's own numbers (data received, rates, waits)."""

    def checkpoint(self, update: int, state) -> None:
        """Saves `state` at `update` and publishes the params for the collectors."""

    def finish(self, update: int, state, stopped: bool) -> None:
        """The run ended at `update` (`stopped`: asked to stop): its last checkpoint, published."""

    def close(self) -> None:
        """Stops its threads and the store's reader."""
