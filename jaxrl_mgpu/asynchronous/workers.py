"""Child processes that run a function of one argument for an asynchronous learner or collector:
the store's shards are encoded and decoded by TFDS in Python, work that holds the GIL. A
collector hands its shards to writers (`Pool` of `store.write_job`), the learner's reader hands
shards to decoders (`Pool` of its source's `decode`, which also computes the n-step targets),
so that neither the rollout nor the learner's thread waits for TFDS, and several shards are
encoded or decoded at once.

A plain subprocess (`python -c "...; _serve()"`), not multiprocessing: spawn
would re-import the caller's main script (a user's own script without a `__main__` guard would
run again), and fork would copy JAX's threads mid-flight. A worker never touches an accelerator.
"""

from __future__ import annotations

import collections
import os
import pickle
import select
import subprocess
import sys
import time
from typing import Any, Callable

MAX_WORKERS = 4  # per pool: beyond this a pool's parent (one thread) is the limit, not its workers


def default_workers() -> int:
    """Workers per pool where `--store-workers` is 0 (auto): a quarter of the cores this process
    may run on, 1 to MAX_WORKERS (a 16-core GPU host: 4; a 2-core laptop: 1), since a learner
    and a few collectors with their pools share the host."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) // 4))


class WorkerError(RuntimeError):
    """A worker process that stopped (killed, or out of memory)."""


class Worker:
    """`fn(x)` in a child process. `fn` must be picklable (a module-level function, or a
    functools.partial of one); it goes to the child first, then each `x`, pickled over its
    stdin; results (or the exception raised, re-raised by `receive`) come back over its stdout,
    with the seconds `fn` took. At most one call is in flight: a child blocked writing a large
    result could not read the next argument."""

    def __init__(self, fn: Callable[[Any], Any]):
        # A session of its own: Ctrl-C, `timeout` and schedulers signal the whole process group,
        # and a worker killed by that would turn its parent's orderly stop (finish the shards in
        # hand, checkpoint) into an error. The parent stops it by closing its stdin.
        self._proc = subprocess.Popen([sys.executable, "-c", f"from {__name__} import _serve; _serve()"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                                      env={**os.environ, "JAX_PLATFORMS": "cpu"})
        self.busy = False
        self.seconds = 0.0  # what fn took in the last call received
        self._send(fn)

    def _send(self, x) -> None:
        try:
            pickle.dump(x, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerError(f"a worker process stopped (exit code {self._proc.poll()})") from None

    def send(self, x) -> None:
        assert not self.busy, "one call in flight per worker"
        self._send(x)
        self.busy = True

    def answered(self, within_s: float = 0.0) -> bool:
        """Whether the call in flight has answered (or the child has stopped), waiting up to
        `within_s`: `receive` would not wait for it to finish. (Python's reader holds nothing
        beyond a received answer: one call at a time.)"""
        return bool(select.select([self._proc.stdout], [], [], within_s)[0])

    def receive(self) -> Any:
        self.busy = False
        try:
            ok, value, self.seconds = pickle.load(self._proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            raise WorkerError(f"a worker process stopped (exit code {self._proc.wait()})") from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stops the child: the end of its input; a result it is still writing is dropped
        (closing our end of its output), rather than waited for."""
        for pipe in (self._proc.stdin, self._proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class Pool:
    """`workers` Workers of `fn`, called in turn, results received in the order of the calls
    (each worker answers its own calls in order, and calls go to the workers round-robin)."""

    def __init__(self, fn: Callable[[Any], Any], workers: int):
        self._workers = [Worker(fn) for _ in range(workers)]
        self._in_flight: collections.deque = collections.deque()  # (worker, tag) oldest first
        self._next = 0
        self.seconds = 0.0  # what fn took in the last call received

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def tags(self) -> list:
        """The tags of the calls in flight, oldest first."""
        return [tag for _, tag in self._in_flight]

    @property
    def oldest(self) -> Any:
        """The tag of the oldest call in flight."""
        return self._in_flight[0][1]

    @property
    def full(self) -> bool:
        return self._workers[self._next].busy

    def submit(self, x, tag=None) -> None:
        """Starts `fn(x)` on the next worker, which must be free (not `full`: else `receive`
        the oldest first). `tag` comes back with the result."""
        worker = self._workers[self._next]
        worker.send(x)
        self._in_flight.append((worker, tag))
        self._next = (self._next + 1) % len(self._workers)

    @property
    def oldest_answered(self) -> bool:
        """Whether the oldest call in flight has answered (`receive` would not wait for it)."""
        return self.oldest_answers_within(0.0)

    def oldest_answers_within(self, seconds: float) -> bool:
        """Whether the oldest call in flight answers within `seconds` (waits at most that long)."""
        return bool(self._in_flight) and self._in_flight[0][0].answered(seconds)

    def receive(self) -> tuple[Any, Any]:
        """The oldest call's (tag, result); blocks until it is done (`seconds`: what fn took).
        An exception of fn is raised here (with the call gone from the pool)."""
        worker, tag = self._in_flight.popleft()
        try:
            return tag, worker.receive()
        finally:
            self.seconds = worker.seconds

    def close(self) -> None:
        for w in self._workers:
            w.close()


def _serve() -> None:
    """A worker's child: reads fn, then `fn(x)` for every x on stdin, until stdin closes (its
    parent closed it, or died)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints of libraries go to stderr, never into the results
    try:
        fn = pickle.load(sys.stdin.buffer)
    except EOFError:
        return
    while True:
        try:
            x = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        start = time.perf_counter()
        try:
            result = (True, fn(x))
        except Exception as e:  # raised again in the parent
            result = (False, e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}"))
        try:
            pickle.dump((*result, time.perf_counter() - start), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
        except (BrokenPipeError, OSError):  # the parent closed the pool, or died: nobody waits
            return


def _picklable(e: Exception) -> bool:
    try:
        pickle.loads(pickle.dumps(e))
        return True
    except Exception:
        return False

