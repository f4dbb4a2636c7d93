"""JAX's persistent compilation cache, on by default.

Compiling the training chunk is most of a short run's start-up (tens of seconds on a GPU for
PPO on CartPole). JAX can keep compiled programs on disk and load them when the same program
is compiled again: the same command, another seed, a resume. `configure` points JAX there:

- `--compile-cache DIR` (or JAX's own JAX_COMPILATION_CACHE_DIR, or by default
  `$XDG_CACHE_HOME/jaxrl_mgpu/jax`, i.e. `~/.cache/jaxrl_mgpu/jax`), every program cached
  whatever its size or compile time, at most MAX_BYTES on disk (least recently used dropped);
- `--compile-cache off`: nothing read or written;
- a directory that cannot be written: one warning line, and the run goes on uncached.

In a job of several processes every process reads the cache and process 0 writes it (JAX's
rule); on a cluster give a directory on the shared filesystem so that all hosts find it.
`CacheUse` counts what a block of code took from the cache, for the start-up banner.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter
from pathlib import Path

import jax
import jax.monitoring
from jax._src import compilation_cache as jax_cache

MAX_BYTES = 4 * 2 ** 30
OFF = "off"

# Counted per thread: JAX reports a compile's cache events in the thread that compiles, and the
# initial state compiles in a thread of its own while the chunk compiles (runner.train).
_events: Counter = Counter()  # (thread id, "requests" | "hits") -> count


def _count(event: str, **_) -> None:
    if event == "/jax/compilation_cache/compile_requests_use_cache":
        _events[threading.get_ident(), "requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits":
        _events[threading.get_ident(), "hits"] += 1


jax.monitoring.register_event_listener(_count)


def default_dir() -> Path:
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxrl_mgpu" / "jax"


def configure(spec: str | None) -> tuple[str | None, str | None]:
    """Turns the cache on in `spec` (a directory; None: the default) or off (`"off"`). Returns
    the directory in use (None: off) and a warning to print, if any. Call it before the first
    compile that should use the cache."""
    if spec == OFF:
        _use(None)
        return None, None
    path = Path(spec) if spec else default_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-")
        probe.close()
    except OSError as e:
        _use(None)
        return None, (f"warning: --compile-cache {path} cannot be written ({e.strerror}); running without the "
                      f"compilation cache (every program is compiled afresh)")
    _use(str(path.absolute()))
    return str(path.absolute()), None


def directory() -> str | None:
    """Where compiled programs are cached now (None: not at all)."""
    return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None


def _use(directory: str | None) -> None:
    if directory is not None and jax.config.jax_compilation_cache_dir not in (None, directory):
        # JAX sets its cache up once per process; a new directory (tests, notebooks) needs a reset.
        jax_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", directory is not None)
    if directory is not None:
        jax.config.update("jax_compilation_cache_dir", directory)
        # Cache every program: the chunk, and the small ones start-up compiles (each a fraction
        # of a second on a GPU, and there are many).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)


def settle() -> None:
    """Makes JAX decide now whether this process uses the cache. It decides on the first
    compile, and when two threads compile first at once (the chunk, and the initial state
    built beside it) the one that loses the race is told no: its program is neither looked up
    nor kept (jax 0.11, compilation_cache.is_cache_used)."""
    jax_cache.is_cache_used(jax.devices()[0].client)


class CacheUse:
    """`with CacheUse() as use:` ... `use.hits`, `use.requests`: the compiles of this thread
    inside the block that asked the persistent cache, and how many it answered."""

    def __enter__(self) -> "CacheUse":
        self._thread = threading.get_ident()
        self._start = {key: _events[self._thread, key] for key in ("requests", "hits")}
        return self

    def __exit__(self, *exc) -> None:
        self.requests = _events[self._thread, "requests"] - self._start["requests"]
        self.hits = _events[self._thread, "hits"] - self._start["hits"]

    @property
    def all_loaded(self) -> bool:
        """Every program compiled in the block came from the cache."""
        return self.requests > 0 and self.hits == self.requests
