"""Stopping a run on request: SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C).

The first request is acknowledged at once and honoured between chunks: the loop dispatches
no chunk after it, waits for the chunks already dispatched (each sized to about
`loop.CHUNK_S` seconds of device time, so at most about twice that unless one update takes
longer), saves a checkpoint and exits 0. A second request exits at once with code 128 + the
signal's number, keeping the last complete checkpoint. Two signals less than `REPEAT_S`
apart are one request: `timeout` and some schedulers signal the process and then its whole
process group, so the same request arrives twice within microseconds.

Signals are read by a watcher thread from Python's signal wakeup fd. A Python-level handler
runs only in the main thread, between bytecodes, and the main thread spends most of a run
waiting in native code (a compile, a chunk's results), where the handler would wait with it.

SIGUSR1 is the launcher saying that another process of the job failed: nothing can be saved
(a checkpoint needs every process), and the main thread may be waiting in a collective for
the dead process, so the watcher leaves at once with exit code 1; the complete checkpoints stay.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

import jax

from jaxrl_mgpu import parallel

REQUESTS = (signal.SIGTERM, signal.SIGINT)
PEER_FAILED = signal.SIGUSR1
REPEAT_S = 1.0  # a signal this soon after the first is the same request
_DONE = 0       # the byte restore() writes to end the watcher


def _ignore(signum, frame) -> None:
    """The Python-level handler: the watcher thread does the work (see the module's doc)."""


class StopSignal:
    """Installs the handlers for the length of a run; `restore()` puts the previous ones back.
    Calling it says whether any process was asked to stop (a collective across processes: every
    process must call it at the same point of the loop)."""

    def __init__(self, log, activity: Callable[[], str] | None = None, kept: Callable[[], bool] | None = None):
        self.log = log
        # Whether the run has a complete checkpoint on disk, for what a second request says.
        self.kept = kept or (lambda: True)
        # What the run is doing, for the acknowledgement ("the chunk of updates 41-44, about 2 s"):
        # the loop sets it as it goes.
        self.activity = activity or (lambda: "")
        self._requested = threading.Event()
        self._first_at = 0.0
        self.previous = {sig: signal.signal(sig, _ignore) for sig in (*REQUESTS, PEER_FAILED)}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, name="stop-signal", daemon=True)
        self._watcher.start()

    @property
    def requested(self) -> bool:
        """Whether this process was asked to stop (no collective)."""
        return self._requested.is_set()

    def __call__(self) -> bool:
        # Every process must stop at the same chunk, even if the signal reached only some.
        return parallel.any_process(self.requested)

    def request(self, signum: int) -> None:
        """What a signal does (the watcher thread calls it; tests may too)."""
        name = signal.Signals(signum).name
        now = time.monotonic()
        if not self._requested.is_set():
            self._first_at = now
            self._requested.set()
            doing = self.activity()
            self.log.print(f"{name}: stopping{': ' + doing if doing else ''}; then a checkpoint is saved and the run "
                           f"exits. {name} again exits at once, keeping the last complete checkpoint")
            return
        if now - self._first_at < REPEAT_S:
            return  # the same request, delivered to the process and then to its group
        self.log.print(f"{name} again: exiting now; " + ("the run's last complete checkpoint is kept" if self.kept() else
                                                         "no checkpoint was saved yet (--resume auto starts the run "
                                                         "over)"))
        _leave(128 + signum)

    def _watch(self) -> None:
        while True:
            try:
                got = os.read(self._wake_r, 64)
            except OSError:
                return
            for signum in got:
                if signum == _DONE:
                    os.close(self._wake_r)
                    return
                if signum == PEER_FAILED:
                    print(f"error: process {jax.process_index()}: another process of this job failed; leaving "
                          f"without a checkpoint (the run's complete checkpoints are kept)", file=sys.stderr,
                          flush=True)
                    _leave(1)
                if signum in REQUESTS:
                    self.request(signum)

    def restore(self) -> None:
        signal.set_wakeup_fd(self._previous_wakeup)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        os.write(self._wake_w, bytes([_DONE]))
        os.close(self._wake_w)


def _leave(code: int) -> None:
    """Exits the process now, from any thread (what is on disk stays: Orbax's saves are atomic)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
