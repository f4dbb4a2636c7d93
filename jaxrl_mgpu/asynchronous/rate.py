"""Rate limiting between the asynchronous learner and its collectors, with Reverb's
SampleToInsertRatio semantics: a target of `samples_per_insert` samples (transitions drawn from
the replay for gradient steps; for AD, the steps of the windows of its batches) per transition
inserted after the first `min_inserts` (`--learning-starts`), within an error buffer, enforced
on both sides. The rules:

- The learner owes `samples_per_insert * (inserted - min_inserts) - samples`: counted from
  `--learning-starts` on, as `--mode both` counts, so the transitions learning starts with do
  not pay for a burst of samples at once. It may start an iteration while it owes more than
  `-buffer` (so a learner can always start one at the edge); ahead of that, it waits for data.
- Collectors pause before their next shard while the learner is behind (what it has inserted
  makes it owe more than `buffer`), or while more data is on its way to the learner's memory
  than `--max-data-lag` learner iterations' worth (written to the store and not yet read,
  being read, or queued for the replay: the in-flight data; at least MIN_IN_FLIGHT_SHARDS of
  the largest shard, so that one is read while the next is written). So the store never grows
  without bound, the learner never starves for long, and the data it inserts was acted with
  params at most about `--max-data-lag` of its iterations old: DQN learns much worse from
  data acted with stale params.
- Before any learner has published its progress, collectors fill the store up to what it will
  start learning with (`--learning-starts` transitions) plus START_SHARDS shards, and wait.
- The buffer is a fixed band, the larger of Acme's `tolerance * samples_per_insert *
  min_inserts` samples (`--samples-per-insert-tolerance` x the samples `--learning-starts`
  transitions pay for) and the samples of the data that may be on its way (`--max-data-lag`
  iterations'): collectors paused at the band's top resume only as the learner reaches its
  bottom, and their data then takes the pipeline's latency to arrive, so a band narrower than
  what is on its way meanwhile would starve the learner. The band bounds the counts'
  difference, not their ratio: over a long run the ratio is the target.
- The learner publishes its counts in `<run-dir>/learner_progress.json` (atomically, at most
  every PUBLISH_S); a paused collector reads it again every PAUSE_S.

The default target. DQN: the ratio of `--mode both` (each update steps every environment
`num_steps` times, `num_envs * num_steps` transitions, then does `num_steps * updates_per_step`
gradient steps of `replay_batch_size`, from `--learning-starts` transitions on):
`updates_per_step * replay_batch_size / num_envs`. AD: `--mode both` learns from a fixed
dataset, so it has no ratio of its own; the default is the one of the darkroom-ad preset's
recipe (20,000 updates of 256 windows of 160 steps over 2,048 histories of 4,000 steps: 100
samples per history step).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROGRESS = "learner_progress.json"
PUBLISH_S = 0.02       # the learner writes its progress at most this often (a small JSON file)
PAUSE_S = 0.01         # a paused collector looks at it again this often: well within a learner
                       # iteration, or a shallow pipeline runs dry before the collectors resume
START_SHARDS = 4       # before any learner, collectors fill the store to --learning-starts and this many shards
MIN_IN_FLIGHT_SHARDS = 2  # in-flight data allowed at least: so that one shard is read while the next is written


def samples_per_insert(cfg, default: float | None = None) -> float:
    """The target: --samples-per-insert, else the learner's `default` (AD's: the module
    docstring), else the ratio of DQN's --mode both (gradient steps x replay batch per
    transition of all environments)."""
    if cfg.samples_per_insert is not None:
        return cfg.samples_per_insert
    if default is not None:
        return default
    return cfg.updates_per_step * cfg.replay_batch_size / cfg.num_envs


def error_buffer(target: float, tolerance: float, min_inserts: int) -> float:
    """The band on either side of the target, in samples (Acme's sizing of Reverb's error buffer)."""
    return tolerance * target * min_inserts


def owed(target: float, min_inserts: int, samples: float, inserted: float) -> float:
    """Samples the inserted transitions pay for beyond those drawn (negative: the learner is ahead)."""
    return target * max(inserted - min_inserts, 0) - samples


class Limiter:
    """The learner's side: `samples_per_iteration` samples each iteration (a compiled update),
    none before the learner's memory holds `min_inserts` transitions."""

    def __init__(self, cfg, samples_per_iteration: int, min_inserts: int, min_in_flight: int = 0,
                 default_target: float | None = None):
        self.target = samples_per_insert(cfg, default_target)
        self.min_inserts = min_inserts
        self.per_iteration = samples_per_iteration
        # transitions on their way to the learner's memory that collectors keep below: at least
        # MIN_IN_FLIGHT_SHARDS of the largest shard so far, plus `min_in_flight` (what the
        # learner's ingest may hold back, e.g. a partial block), or collectors could wait forever
        self.max_in_flight = cfg.max_data_lag * samples_per_iteration / self.target
        self.min_in_flight = min_in_flight
        self.buffer = max(error_buffer(self.target, cfg.samples_per_insert_tolerance, min_inserts),
                          self.target * self.max_in_flight)

    def in_flight_bound(self, largest_shard: int) -> int:
        return int(max(self.max_in_flight, MIN_IN_FLIGHT_SHARDS * largest_shard + self.min_in_flight))

    def iterations(self, samples: int, inserted: int, in_replay: int) -> int:
        """How many learner iterations may run now (0: wait for data): `samples` and
        `inserted` over the whole run (a restarted learner goes on from its checkpoint's
        counts), `in_replay` what this learner's memory holds (nothing before `min_inserts`).
        Each may start while the learner owes more than -buffer."""
        if in_replay < self.min_inserts:
            return 0
        room = owed(self.target, self.min_inserts, samples, inserted) + self.buffer
        return max(int(room // self.per_iteration) + 1, 0)

    def achieved(self, samples: int, inserted: int) -> float | None:
        """Samples per transition inserted since learning could start (the target's terms)."""
        paying = inserted - self.min_inserts
        return samples / paying if paying > 0 else None


# Why a collector waits before its next shard (each logged apart, `async/collector_wait_s/<why>`):
START = "start"      # no learner has published progress, and the store holds what it will start with
READING = "reading"  # the learner has not yet taken in the data on its way (--max-data-lag)
SAMPLES = "samples"  # the learner has inserted more than its samples pay for (it is behind)
HOLD_REASONS = (START, READING, SAMPLES)


def no_waits() -> dict[str, float]:
    """A collector's back-pressure seconds since its last shard, by reason: none yet."""
    return dict.fromkeys(HOLD_REASONS, 0.0)


def hold_back(progress: dict | None, in_flight: int, shard_steps: int, learning_starts: int) -> str | None:
    """Why a collector should wait before rolling out its next shard (of about `shard_steps`
    transitions), one of HOLD_REASONS, or None to go on; from the learner's last progress and
    the data on its way to it: `in_flight`, the transitions written to the store that the
    learner has not taken up (and the collector's own shards being written), plus what the
    learner has taken up and not yet inserted (its progress's `pipeline`). Before a learner has
    published any progress, collectors fill the store up to what it will need to start learning
    (`learning_starts` transitions) plus a few shards, and wait there."""
    if progress is None:
        return START if in_flight > learning_starts + START_SHARDS * shard_steps else None
    if in_flight + progress["pipeline"] > progress["max_in_flight"]:
        return READING  # the learner has not yet taken in the data on its way (--max-data-lag)
    target = progress["samples_per_insert"]
    # (what it has inserted, as its own limiter counts: what waits before its memory, a partial
    # block of its ingest included, is bounded above and must not hold collectors back too)
    behind = owed(target, progress["learning_starts"], progress["samples"], progress["inserted"])
    return SAMPLES if behind > progress["error_buffer"] else None


class Progress:
    """The learner's side of the file: its counts, written atomically at most every PUBLISH_S."""

    def __init__(self, run_dir, limiter: Limiter):
        self.path = Path(run_dir) / PROGRESS
        self.fixed = {"samples_per_insert": limiter.target, "error_buffer": limiter.buffer,
                      "learning_starts": limiter.min_inserts}
        self.written_at = 0.0

    def publish(self, force: bool = False, **counts) -> None:
        now = time.monotonic()
        if not force and now - self.written_at < PUBLISH_S:
            return
        tmp = self.path.with_name(f".{PROGRESS}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**self.fixed, **counts, "time": time.time()}))
        tmp.replace(self.path)
        self.written_at = now


def read_progress(run_dir) -> dict | None:
    try:
        return json.loads((Path(run_dir) / PROGRESS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
