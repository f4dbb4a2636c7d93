"""Rate limiting between the asynchronous learner and its collectors, with Reverb's
SampleToInsertRatio semantics: a target of `samples_per_insert` samples (transitions drawn from
the replay for gradient steps; for AD, the steps of the windows of its batches) per transition
inserted after the first `min_inserts` (`--learning-starts`), within an error buffer, enforced
on both sides.

- The learner owes `samples_per_insert * (inserted - min_inserts) - samples`. It may start an
  iteration while it owes more than `-buffer` (so a learner can always start one at the edge):
  it waits for data when it is ahead.
- Collectors are back-pressured when the learner is behind: while what it has received would
  make it owe more than `buffer` plus a slack of a few shards' samples, or while it has more
  than that slack of written shards unread, collectors pause before their next shard. The
  learner publishes its counts in `<run-dir>/learner_progress.json` (atomically) for them; so
  the store never grows without bound and the learner never starves for long.
- The buffer is Acme's: `tolerance * samples_per_insert * min_inserts` samples
  (`--samples-per-insert-tolerance` x the samples `--learning-starts` transitions pay for), a
  fixed band. (A band relative to the whole run's counts, as before, let the learner run at the
  top of it, 8.8 samples per insert for a target of 8 over a 3M-step run, and with no offset it
  drew the samples of all of --learning-starts' transitions at once: ~1,700 DQN gradient steps
  on the random start, which `--mode both` never does.)

The default target. DQN: the ratio of `--mode both` (each update steps every environment
`num_steps` times, `num_envs * num_steps` transitions, then does `num_steps * updates_per_step`
gradient steps of `replay_batch_size`, from `--learning-starts` transitions on):
`updates_per_step * replay_batch_size / num_envs`. AD: `--mode both` learns from a fixed
dataset, so it has no ratio of its own; the default is the one of the darkroom-ad preset's
recipe, which matched the paper (20,000 updates of 256 windows of 160 steps over 2,048
histories of 4,000 steps: 100 samples per history step).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PROGRESS = "learner_progress.json"
PUBLISH_S = 0.2        # the learner writes its progress at most this often
SLACK_SHARDS = 4       # shards' worth of transitions collectors may run ahead of the learner
AD_SAMPLES_PER_INSERT = 100.0  # AD's default target (the module docstring)


def samples_per_insert(cfg) -> float:
    """The target: --samples-per-insert, else the default of the algorithm (module docstring)."""
    if cfg.samples_per_insert is not None:
        return cfg.samples_per_insert
    if cfg.algo == "ad":
        return AD_SAMPLES_PER_INSERT
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

    def __init__(self, cfg, samples_per_iteration: int, min_inserts: int):
        self.target = samples_per_insert(cfg)
        self.min_inserts = min_inserts
        self.per_iteration = samples_per_iteration
        self.buffer = error_buffer(self.target, cfg.samples_per_insert_tolerance, min_inserts)

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
READING = "reading"  # the learner has not yet read the slack of shards written to the store
SAMPLES = "samples"  # the learner has received more than its samples pay for (it is behind)
HOLD_REASONS = (START, READING, SAMPLES)


def no_waits() -> dict[str, float]:
    """A collector's back-pressure seconds since its last shard, by reason: none yet."""
    return dict.fromkeys(HOLD_REASONS, 0.0)


def hold_back(progress: dict | None, unread_steps: int, shard_steps: int, learning_starts: int) -> str | None:
    """Why a collector should wait before writing its next shard (of about `shard_steps`
    transitions), one of HOLD_REASONS, or None to write it; from the learner's last progress and
    the transitions written to the store it has not read yet. Before a learner has published any
    progress, collectors fill the store up to what it will need to start learning
    (`learning_starts` transitions) plus the slack, and wait there."""
    if progress is None:
        return START if unread_steps > learning_starts + SLACK_SHARDS * shard_steps else None
    slack = SLACK_SHARDS * max(shard_steps, progress.get("largest_shard", 0))
    if unread_steps > slack:
        return READING  # the learner is not even reading as fast as collectors write
    target = progress["samples_per_insert"]
    behind = owed(target, progress["learning_starts"], progress["samples"], progress["received"])
    return SAMPLES if behind > progress["error_buffer"] + target * slack else None


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
