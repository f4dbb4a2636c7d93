"""Reading the store's shards in the background, oldest first, so that a learner keeps
learning while it reads."""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Callable

from jaxrl_mgpu.asynchronous.store import Shard, Store


class ShardReader:
    """Reads the store's shards in a background thread, oldest first, so the learner keeps
    learning while it reads. Read on the learner's own thread, a 65k-step MinAtar shard took
    ~2 s of host time; two collectors wrote faster than that, and the learner then did nothing
    but read (seen on 4 H100s). `read(shard)` turns a shard into what the learner inserts (None
    skips it); at most `max_ready` read shards wait, so a slow learner holds back the reader,
    not its memory. After a restart (`refill`), the shards in `consumed` are read once more, to
    refill the learner's on-device memory, and are flagged as not new (not counted again).

    With `decode` (a module-level function of a shard, used in place of `read`), shards are
    decoded in a process of their own (`Decoder`): TFDS parses an episode record in Python
    (~0.4 ms each, 2,000 episodes in a 65k-step MinAtar shard), and on a thread that parsing
    holds the GIL the learner's thread needs to dispatch its compiled steps. The thread then
    only waits for the process and unpickles the arrays."""

    def __init__(self, store: Store, consumed: set, refill: bool, read: Callable[[Shard], Any],
                 decode: Callable[[Shard], Any] | None = None, max_ready: int = 4):
        self._store, self._read, self._refill = store, read, refill
        self._seen = set() if refill else set(consumed)
        self._consumed_at_start = set(consumed)
        self._ready: queue.Queue = queue.Queue(max_ready)
        self._stop, self._error = threading.Event(), None
        self._decoder = Decoder(decode) if decode is not None else None
        self._timing = [0.0, 0]  # seconds spent reading, shards read, since decode_seconds() last asked
        self._timing_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="shard-reader", daemon=True)
        self._thread.start()

    def _take(self, shard: Shard) -> Any:
        start = time.perf_counter()
        data = self._decoder(shard) if self._decoder else self._read(shard)
        with self._timing_lock:
            self._timing[0] += time.perf_counter() - start
            self._timing[1] += 1
        return data

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
                        data = self._take(shard)
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

    def decode_seconds(self) -> float | None:
        """Mean seconds per shard read since the last call (None: none read)."""
        with self._timing_lock:
            (seconds, shards), self._timing = self._timing, [0.0, 0]
        return seconds / shards if shards else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._decoder is not None:
            self._decoder.close()


class Decoder:
    """`fn(shard)` run in a child process (`python -m jaxrl_mgpu.asynchronous.reader`; `fn` is
    picklable: a module-level function, or a functools.partial of one): shards
    go to it pickled over its stdin, results (or the exception raised) come back over its
    stdout. A plain subprocess, not multiprocessing: spawn would re-import the caller's main
    script (a user's own script without a `__main__` guard would run again), and fork would
    copy JAX's threads mid-flight. The child never touches an accelerator."""

    def __init__(self, fn: Callable):
        self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      env={**os.environ, "JAX_PLATFORMS": "cpu"})
        pickle.dump(fn, self._proc.stdin)  # a module-level function, or a functools.partial of one
        self._proc.stdin.flush()

    def __call__(self, shard) -> Any:
        try:
            pickle.dump(shard, self._proc.stdin)
            self._proc.stdin.flush()
            ok, value = pickle.load(self._proc.stdout)
        except (EOFError, BrokenPipeError, OSError):
            raise RuntimeError(f"the shard decoder process stopped (exit code {self._proc.poll()})") from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        try:
            self._proc.stdin.close()  # the child's end of input: it exits
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()


def _serve() -> None:
    """The decoder's child: reads `fn`, then `fn(shard)` for every shard on stdin, until stdin closes."""
    fn = pickle.load(sys.stdin.buffer)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints of libraries go to stderr, never into the results
    while True:
        try:
            shard = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        try:
            result = (True, fn(shard))
        except Exception as e:  # raised again in the reader's thread
            result = (False, e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}"))
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


def _picklable(e: Exception) -> bool:
    try:
        pickle.loads(pickle.dumps(e))
        return True
    except Exception:
        return False


if __name__ == "__main__":
    _serve()
