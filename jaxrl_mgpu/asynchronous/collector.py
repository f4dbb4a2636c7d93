"""What every collector shares, DQN's and AD's: the run it may collect for, its name and the
seed drawn from it, how often it reports, and its side of the rate limiter (`Pacer`)."""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path

from jaxrl_mgpu.asynchronous import rate
from jaxrl_mgpu.asynchronous.checkpoints import DONE_MARKER, learner_done
from jaxrl_mgpu.asynchronous.store import Store
from jaxrl_mgpu.cli import ConfigError

COLLECTOR_LOG_S = 30.0        # a collector's progress line, at most this often
PAUSE_LOG_S = 60.0            # a collector paused for the learner says so this often
PAUSED_BECAUSE = {rate.START: "no learner yet; the store holds what it will start with",
                  rate.READING: "it has not taken in the data on its way (--max-data-lag)",
                  rate.SAMPLES: "behind its samples per insert"}


def check_run_dir(cfg) -> None:
    """A ConfigError where `--run-dir` holds a run no learner will ever read this collector's
    data for: a run of another algorithm, a `--mode both` run (it learns from its own rollouts,
    and a resume keeps its mode), or one whose learner is done. A collector would otherwise wait
    for params that never come, or fill a store nobody reads. No run there yet is fine: a
    learner may start after its collectors."""
    run_dir = Path(cfg.run_dir)
    try:
        saved = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):  # none yet (or a learner writing it this moment)
        saved = None
    if isinstance(saved, dict) and isinstance(saved.get("algo"), str):  # a run's (else no learner starts there)
        if saved.get("algo") != cfg.algo:
            raise ConfigError(f"--run-dir {run_dir} holds a run of --algo {saved.get('algo')} (its config.json): no "
                              f"--algo {cfg.algo} learner will read this collector's data there; collect for a "
                              f"--mode learn run of --algo {cfg.algo}")
        if saved.get("mode", "both") != "learn":
            raise ConfigError(f"--run-dir {run_dir} holds a --mode {saved.get('mode', 'both')} run, which learns "
                              f"from its own rollouts and never reads a store: collect for a --mode learn run")
    if learner_done(run_dir):
        raise ConfigError(f"--run-dir {run_dir}: its learner is done ({DONE_MARKER}); resume it with more to train "
                          f"(--mode learn --resume) before starting collectors, or collect for a new run")


def collector_name(cfg) -> str:
    """`--collector-id`, else unique to this host and process."""
    return cfg.collector_id or f"{os.uname().nodename}-{os.getpid()}"


def collector_seed(name: str) -> int:
    """The seed of a collector's random stream: collectors of other names explore, and draw
    tasks, apart from one another."""
    return zlib.crc32(name.encode())


class Pacer:
    """A collector's side of the rate limiter (rate.hold_back): before each shard, whether to
    pause for the learner, from its published progress and the shards in the store its reader has
    not taken up; the pauses since the last shard, by reason (a shard's metadata carries them to
    the learner's `async/collector_wait_s`); and a line every PAUSE_LOG_S while paused."""

    def __init__(self, run_dir: Path, store: Store, name: str, shard_steps: int, learning_starts: int, log):
        self.run_dir, self.store, self.name, self.log = run_dir, store, name, log
        self.shard_steps, self.learning_starts = shard_steps, learning_starts
        self.waited = rate.no_waits()
        self.paused_from: float | None = None  # since when the collector has been paused

    def held_back(self, since: float, in_flight: int = 0) -> bool:
        """Whether to wait before the next shard (of about `shard_steps` transitions). If so,
        waits a moment (rate.PAUSE_S) and counts the time from `since` (when the collector began
        this pass: a pass that ends paused counts whole) as waiting for its reason. `in_flight`:
        this collector's shards still being written, which the learner has not read either."""
        progress = rate.read_progress(self.run_dir)
        unread = self.store.unread_steps(progress and progress.get("last_read")) + in_flight
        why = rate.hold_back(progress, unread, self.shard_steps, self.learning_starts)
        if why is None:
            self.paused_from = None
            return False
        self.paused_from = self.paused_from or since
        if self.log.due("paused", PAUSE_LOG_S):
            self.log.print(f"collector {self.name}: paused {time.monotonic() - self.paused_from:.0f}s for the learner "
                           f"({PAUSED_BECAUSE[why]}); {unread:,} transitions unread in the store")
        time.sleep(rate.PAUSE_S)
        self.waited[why] += time.monotonic() - since
        return True

    def take_waits(self) -> dict[str, float]:
        """The pauses since the last call, by reason (for the shard about to be written)."""
        waited, self.waited = self.waited, rate.no_waits()
        return waited
