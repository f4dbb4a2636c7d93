"""Asynchronous, elastic collection and learning on one run directory (`--mode learn|collect`).

Collectors (any number, started and stopped at any time) append episodes in segments, as
each rollout ends or cuts them, or for Algorithm Distillation whole learning histories, to the
run's store as atomically written shards; one learner (any number of devices and hosts) reads
them into its on-device memory, learns, and publishes its params for the collectors (DQN's act
with them) after its chunks, and checkpoints for resuming. What is the same for every
algorithm is here; an algorithm's learner and collector are its spec's `asynchronous` record
(algos/dqn/asynchronous.py, algos/ad/asynchronous.py). The guide: docs/asynchronous.md.

    store.py        the shards on disk (written whole, read with checksums, evicted oldest first)
    workers.py      child processes that encode (collectors) and decode (the learner) shards
    reader.py       the learner's background shard reader
    ledger.py       what the learner received (saved in its checkpoints)
    checkpoints.py  the learner's published checkpoints, the store's eviction, the done marker
    source.py       what the learners' data sources (sources.LearnerSource) share; the warning when the
                    store holds what the learner cannot read
    rate.py         the rate limiter (samples per insert) and the collectors' back-pressure
    collector.py    what every collector shares: the run it may collect for, its name and seed, its
                    side of the rate limiter
    policy.py       a learner's newest params, published for its collectors
"""
