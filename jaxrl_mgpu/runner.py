"""The outer loop every algorithm shares.

An algorithm gives two per-device functions, `init(key)` and `update(state)`. The runner fuses
`log_every` updates into one compiled chunk (`lax.scan`), maps it over all devices, and drives
the chunks from the host: the next chunk is dispatched before the previous chunk's metrics are
read, so the devices never wait on logging.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.algos import ALGOS
from jaxrl_mgpu.parallel import Parallel


class Chunk(NamedTuple):
    """What the host reads after a chunk: loss means and episode totals over all devices."""
    losses: dict
    episodes: Any  # vec.EpisodeStats


def make_chunk(update: Callable, length: int) -> Callable:
    """A per-device function running `length` updates in one `lax.scan`."""
    def chunk(state):
        state, (losses, episodes) = jax.lax.scan(lambda s, _: update(s), state, None, length=length)
        return state, Chunk(jax.tree.map(jnp.mean, losses), jax.tree.map(jnp.sum, episodes))
    return chunk


class Trainer:
    """Builds the algorithm for a config and device set, and the compiled pieces to run it."""

    def __init__(self, cfg, par: Parallel):
        self.cfg, self.par = cfg, par
        self.env, self.env_params = envs_lib.make(cfg.env)
        self.algo = ALGOS[cfg.algo].make(cfg, self.env, self.env_params, par.num_devices)
        self._chunks: dict[int, Callable] = {}

    def init_state(self):
        key = np.asarray(jax.random.PRNGKey(self.cfg.seed))
        return self.par.map(self.algo.init)(self.par.replicate(key))

    def chunk_fn(self, length: int, state) -> Callable:
        """The compiled chunk of `length` updates (compiled once per length, ahead of time)."""
        if length not in self._chunks:
            mapped = self.par.map(make_chunk(self.algo.update, length), donate=True)
            self._chunks[length] = mapped.lower(state).compile()
        return self._chunks[length]

    def chunk_lengths(self, start_update: int = 0) -> list[int]:
        left = self.cfg.num_updates - start_update
        full, rest = divmod(left, self.cfg.log_every)
        return [self.cfg.log_every] * full + ([rest] if rest else [])


def read_chunk(par: Parallel, chunk: Chunk) -> dict:
    """Device 0's copy of the (already all-reduced) chunk metrics, as plain numbers."""
    losses, episodes = par.first((chunk.losses, chunk.episodes))
    count = float(episodes.count)
    row = {"episode_return": float(episodes.return_sum) / count if count else float("nan"),
           "episode_length": float(episodes.length_sum) / count if count else float("nan"),
           "episodes": int(count)}
    row.update({k: float(v) for k, v in losses.items()})
    return row


def train(trainer: Trainer, log, state=None, start_update: int = 0) -> tuple[Any, dict]:
    """Runs the chunks to the end; returns the final state and the last log row."""
    cfg = trainer.cfg
    state = trainer.init_state() if state is None else state
    lengths = trainer.chunk_lengths(start_update)
    t0 = time.perf_counter()
    compiled = {n: trainer.chunk_fn(n, state) for n in set(lengths)}
    log.print(f"  compiled {len(compiled)} chunk size(s) in {time.perf_counter() - t0:.1f}s")
    log.start(start_update * cfg.batch_size)

    clock = {"start": time.perf_counter(), "prev": time.perf_counter()}

    def emit(done_update: int, length: int, metrics: Chunk) -> dict:
        row = read_chunk(trainer.par, metrics)  # blocks until that chunk is done
        now = time.perf_counter()
        row = {"update": done_update, "env_steps": done_update * cfg.batch_size, **row,
               "sps": length * cfg.batch_size / (now - clock["prev"]), "time": now - clock["start"]}
        clock["prev"] = now
        log.write(row)
        return row

    update, pending, row = start_update, None, {}
    for length in lengths:
        # Dispatch the next chunk before reading the previous one's metrics: the host logs
        # while the devices compute.
        state, metrics = compiled[length](state)
        if pending is not None:
            row = emit(*pending)
        update += length
        pending = (update, length, metrics)
    if pending is not None:
        row = emit(*pending)
    return state, row
