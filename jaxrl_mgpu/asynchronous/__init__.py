"""Asynchronous, elastic collection and learning on one run directory (`--mode learn|collect`).

Collectors (any number, started and stopped at any time) append episodes in segments, as
each rollout ends or cuts them, or for Algorithm Distillation whole learning histories, to the
run's store as atomically written shards; one learner (any number of devices and hosts) reads
them into its on-device memory, learns, and publishes its params for the collectors (DQN's act
with them) after its chunks, and checkpoints for resuming.

    store.py    the shards on disk (written whole, read with checksums, evicted oldest first)
    workers.py  child processes that encode (collectors) and decode (the learner) shards
    reader.py   the learner's background shard reader
    ledger.py   what the learner received (saved in its checkpoints), publishing, the done marker
    rate.py     the rate limiter (samples per insert) and the collectors' back-pressure
    policy.py   the DQN learner's newest params, published for its collectors
    dqn.py      the DQN learner and episode-segment collector
    ad.py       the AD learner and learning-history collector
"""

from __future__ import annotations

from types import ModuleType

from jaxrl_mgpu.asynchronous import ad, dqn


def for_algo(algo: str) -> ModuleType:
    """The learner and collector of `--algo` (dqn.py or ad.py; each checks the config itself)."""
    return ad if algo == "ad" else dqn
