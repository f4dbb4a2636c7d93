"""Asynchronous, elastic collection and learning on one run directory (`--mode learn|collect`).

Collectors (any number, started and stopped at any time) append episodes in segments, as
each rollout ends or cuts them, or for Algorithm Distillation whole learning histories, to the
run's store as atomically written shards; one learner (any number of devices and hosts) reads
them into its on-device memory, learns, and publishes its params for the collectors (DQN's act
with them) after its chunks, and checkpoints for resuming.

    store.py        the shards on disk (written whole, read with checksums, evicted oldest first)
    workers.py      child processes that encode (collectors) and decode (the learner) shards
    reader.py       the learner's background shard reader
    ledger.py       what the learner received (saved in its checkpoints)
    checkpoints.py  the learner's published checkpoints, the store's eviction, the done marker
    source.py       what the learners' data sources (loop.Source) share
    rate.py         the rate limiter (samples per insert) and the collectors' back-pressure
    collector.py    what every collector shares: its name and seed, its side of the rate limiter
    policy.py       the DQN learner's newest params, published for its collectors
    ingest.py       the DQN learner's transitions on their way to its replay
    dqn.py          the DQN learner and episode-segment collector
    ad.py           the AD learner and learning-history collector
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from jaxrl_mgpu.asynchronous import ad, dqn


class LearnAndCollect(NamedTuple):
    """What --mode learn and --mode collect run for one --algo."""
    check: Callable       # (cfg, num_devices) -> BatchSplit, or a ConfigError
    per_update: Callable  # cfg -> what one learner iteration does, in words (the banner)
    algorithm: Callable   # (cfg, par, split) -> Algorithm: the learner's update
    source: Callable      # (cfg, par, split, Algorithm.parts, ckpts, log, resume_step, state) -> its loop.Source
    collect: Callable     # (cfg, par, split, log, stop) -> env steps collected
    collects: Callable    # cfg -> what one collector runs, in words (its start line)


def for_algo(algo: str) -> LearnAndCollect:
    """The learner and collector of `--algo`: AD's from learning histories, else DQN's (each
    checks the config itself)."""
    if algo == "ad":
        return LearnAndCollect(ad.check, ad.per_update, ad.algorithm, ad.HistorySource, ad.collect,
                               lambda cfg: f"{cfg.ad_history_tasks} tasks")
    return LearnAndCollect(dqn.check, dqn.per_update, dqn.algorithm, dqn.ReplaySource, dqn.collect,
                           lambda cfg: f"{cfg.num_envs} envs")
