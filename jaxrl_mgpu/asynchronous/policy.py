"""The asynchronous DQN learner's newest params, for its collectors to act with:
`<run-dir>/policy.msgpack`, replaced atomically after the learner's chunks (at most every
PUBLISH_S), with the iteration that produced them and the env steps the learner had received
by then (a collector's epsilon follows that count). Checkpoints, every `--checkpoint-every`
iterations, stay what a restarted learner and `evaluate` read.

Why not the checkpoints: DQN learns much worse from data acted with stale params, and
collectors that followed the checkpoints would act with params half a checkpoint period old on
average, plus an Orbax restore; a small file written after every chunk keeps the params a
collector acts with a few learner iterations old.

Only the main process of a (multi-host) learner publishes; the run directory is shared.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from pathlib import Path

import jax
import numpy as np
from flax import serialization

from jaxrl_mgpu import parallel

POLICY = "policy.msgpack"
# The learner publishes at most this often (each publication serialises the params); a
# collector takes the newest before each rollout, so short, to keep the params it acts with
# within a learner iteration or two of the newest.
PUBLISH_S = 0.02


class ParamsPublisher:
    """The learner's side: `offer` the params after a chunk; one publication at a time, on a
    thread of its own (it waits for the chunk to finish and copies the params to the host), so
    the learner's thread only dispatches a copy on the devices."""

    def __init__(self, run_dir, enabled: bool = True):
        self.path = Path(run_dir) / POLICY
        self.enabled = enabled
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="params-publisher")
        self._writing: concurrent.futures.Future | None = None
        self._offered_at = float("-inf")

    def offer(self, iteration: int, params, env_steps_received: int, force: bool = False) -> None:
        """Publishes `params` (global arrays, replicated; possibly still being computed) as
        those of `iteration`, unless a publication is in flight or the last was under
        PUBLISH_S ago (`force`: waits for the one in flight and publishes anyway)."""
        if not self.enabled:
            return
        busy = self._writing is not None and not self._writing.done()
        if not force and (busy or time.monotonic() - self._offered_at < PUBLISH_S):
            return
        self.wait()  # the one in flight (if forced); raises the last publication's error, if any
        self._offered_at = time.monotonic()
        # A copy of this process's first device's slice, on that device: the learner's next
        # chunk takes (donates) the params. One device's op, no collective (only the main
        # process of a multi-host learner publishes), and one program for every leaf: one
        # dispatch of the learner's thread between chunks, not one per leaf.
        local = parallel.copy_on_devices(jax.tree.map(lambda x: x.addressable_shards[0].data, params))
        self._writing = self._thread.submit(self._write, iteration, local, env_steps_received)

    def _write(self, iteration: int, local, env_steps_received: int) -> None:
        params = jax.tree.map(lambda x: np.asarray(x)[0], local)  # without the device axis
        data = serialization.msgpack_serialize({"iteration": iteration, "env_steps_received": env_steps_received,
                                                "published": time.time(),
                                                "params": serialization.to_state_dict(params)})
        tmp = self.path.with_name(f".{POLICY}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(self.path)

    def wait(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._thread.shutdown(wait=True)


class ParamsFollower:
    """A collector's side: the newest published params, read only when the file has been
    replaced since the last read."""

    def __init__(self, run_dir, template):
        self.path = Path(run_dir) / POLICY
        self.template = template  # the params' structure (shapes from runs.params_template)
        self._seen = None

    def newer(self):
        """`(params, iteration, env_steps_received, published)` if params newer than the last
        read were published (host numpy arrays; `published`: the wall-clock time they were
        written), else None."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                key = (st.st_ino, st.st_mtime_ns, st.st_size)  # a replacement is a new file
                if key == self._seen:
                    return None
                data = serialization.msgpack_restore(f.read())
        except FileNotFoundError:
            return None
        self._seen = key
        params = serialization.from_state_dict(self.template, data["params"])
        return params, int(data["iteration"]), int(data["env_steps_received"]), float(data["published"])
