"""Shards of Breakout-MinAtar's shape for the host-side experiments (reader_host.py,
gil_wait.py): 10x10x4 byte observations, episodes of random play (~10 steps each)."""
import tempfile

import numpy as np

from jaxrl_mgpu.asynchronous.store import Segments, Store


def random_play_store(prefix: str, shards: int, shard_transitions: int) -> Store:
    """A new store in a temporary directory holding `shards` shards of about
    `shard_transitions` transitions each, from three collectors in turn."""
    rng = np.random.default_rng(0)
    store = Store(tempfile.mkdtemp(prefix=prefix))
    for i in range(shards):
        lengths = rng.geometric(0.1, shard_transitions // 5)
        lengths = lengths[:np.searchsorted(np.cumsum(lengths), shard_transitions) + 1]
        n = int(lengths.sum())
        obs = (rng.random((n, 10, 10, 4)) < 0.05).astype(np.uint8)
        ones, returns = np.ones(len(lengths), bool), np.zeros(len(lengths), np.float32)
        store.write(Segments(obs, rng.integers(0, 3, n).astype(np.int32), rng.random(n).astype(np.float32), lengths,
                             ones, ones, rng.random(len(lengths)) < 0.9, np.zeros(len(lengths), np.int64),
                             obs[:len(lengths)], returns, lengths), f"c{i % 3}", 0, "Breakout-MinAtar")
    return store
