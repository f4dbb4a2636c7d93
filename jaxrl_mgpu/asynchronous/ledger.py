"""What every asynchronous learner keeps of the run directory it shares with the collectors:
the ledger of what it received (saved in every checkpoint it publishes, so a restarted learner
counts on where it stopped), its published checkpoints, the store's eviction, and the marker
that tells collectors it is done. Also what collectors share (their names and seeds)."""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from pathlib import Path

from jaxrl_mgpu.asynchronous.reader import ShardReader
from jaxrl_mgpu.asynchronous.store import Store

DONE_MARKER = "learner_done"  # written by the learner at the end: collectors then stop
COLLECTOR_LOG_S = 30.0        # a collector's progress line, at most this often


@dataclasses.dataclass
class Ledger:
    """What a learner received from the collectors. `counts` names what it counts of each shard
    (env steps and episodes; AD also tasks), `received` the totals, `per_collector` the same
    by collector, `consumed` the shards in its on-device memory, `iteration` where it started."""
    counts: tuple[str, ...]
    received: dict[str, int]
    per_collector: dict[str, dict[str, int]]
    consumed: set[str]
    iteration: int = 0

    @classmethod
    def fresh(cls, counts: tuple[str, ...]) -> "Ledger":
        return cls(counts, dict.fromkeys(counts, 0), {}, set())

    @classmethod
    def from_meta(cls, meta: dict, counts: tuple[str, ...]) -> "Ledger":
        """From a published checkpoint's `async` metadata (`to_meta`)."""
        return cls(counts, {k: meta[f"{k}_received"] for k in counts}, meta["per_collector"], set(meta["consumed"]),
                   meta["iteration"])

    def to_meta(self, iteration: int) -> dict:
        return {"iteration": iteration, **{f"{k}_received": v for k, v in self.received.items()},
                "per_collector": self.per_collector, "consumed": sorted(self.consumed)}

    @property
    def env_steps(self) -> int:
        return self.received["env_steps"]

    def receive(self, shard_meta: dict) -> None:
        """Adds a new shard's counts to the totals and to its collector's."""
        who = self.per_collector.setdefault(shard_meta["collector"], {})
        for k in self.counts:
            self.received[k] += shard_meta[k]
            who[k] = who.get(k, 0) + shard_meta[k]

    def metrics(self, grad_steps: int) -> dict:
        """The `async/*` log keys: totals received, also per collector, and the replay ratio
        (gradient steps per env step received)."""
        return {**{f"async/{k}_received": v for k, v in self.received.items()},
                "async/replay_ratio": grad_steps / max(self.env_steps, 1),
                **{f"async/{k}_received/{c}": v.get(k, 0) for k in self.counts for c, v in self.per_collector.items()}}


class Publisher:
    """A learner's checkpoints, which collectors follow and a restarted learner resumes from,
    each with the ledger; and the store, which only the learner evicts from."""

    def __init__(self, cfg, par, ckpts, layout: dict, store: Store):
        self.cfg, self.par, self.ckpts, self.layout, self.store = cfg, par, ckpts, layout, store

    def start(self, state, resume_step: int | None, counts: tuple[str, ...], log, memory: str) -> Ledger:
        """The ledger: read from the checkpoint at `resume_step` (whose state the caller has
        restored into `state`); or fresh, with `state` published at iteration 0 so that
        waiting collectors can start."""
        if resume_step is not None:
            ledger = Ledger.from_meta(self.ckpts.meta(resume_step)["async"], counts)
            log.print(f"  resumed the learner at iteration {resume_step}; refilling the {memory} from the store")
        else:
            ledger = Ledger.fresh(counts)
            self.publish(0, state, ledger)
        (Path(self.cfg.run_dir) / DONE_MARKER).unlink(missing_ok=True)
        return ledger

    def publish(self, iteration: int, state, ledger: Ledger) -> None:
        self.ckpts.save(iteration, state, self.layout, self.par,
                        {"update": iteration, "async": ledger.to_meta(iteration), "config": self.cfg.to_dict()})

    def publish_and_evict(self, iteration: int, state, ledger: Ledger) -> None:
        """Publishes, then deletes the oldest shards beyond `--store-max-episodes`; the ledger
        keeps the consumed shards still in the store."""
        self.publish(iteration, state, ledger)
        kept = self.store.evict(self.store.shards(), self.cfg.store_max_episodes)
        self.store.clean_staging()
        ledger.consumed &= {s.path.name for s in kept}

    def finish(self, iteration: int, state, ledger: Ledger, stopped: bool) -> None:
        """The last checkpoint; then, unless stopped by a signal (a restart will follow), the
        marker that tells collectors the learner is done."""
        if self.ckpts.latest_step() != iteration:
            self.publish(iteration, state, ledger)
        self.ckpts.wait()
        if not stopped:
            (Path(self.cfg.run_dir) / DONE_MARKER).write_text(json.dumps({"iteration": iteration}))


class StoreFeed:
    """What the learners' feeds (runner.Feed) share: the store, read on a background thread;
    the ledger; the checkpoints. A subclass gives `memory` (what it refills on a restart),
    `counts` and `read(shard)` (a shard as what it inserts; None skips it)."""

    memory: str
    counts: tuple[str, ...]

    def __init__(self, cfg, par, ckpts, layout: dict, log, resume_step: int | None, state):
        self.cfg, self.par, self.log = cfg, par, log
        self.store = Store(cfg.run_dir)
        self.publisher = Publisher(cfg, par, ckpts, layout, self.store)
        self.ledger = self.publisher.start(state, resume_step, self.counts, log, self.memory)
        self.reader = ShardReader(self.store, self.ledger.consumed, refill=resume_step is not None, read=self.read)

    def read(self, shard):
        raise NotImplementedError

    def arrived(self):
        """(shard, is it new, read(shard)) of the shards read since the last call, oldest
        first; each is counted in the ledger (a new one) and marked consumed."""
        for shard, new, data in self.reader.ready():
            self.ledger.consumed.add(shard.path.name)
            if new:
                self.ledger.receive(shard.meta)
            yield shard, new, data

    def checkpoint(self, update: int, state) -> None:
        self.publisher.publish_and_evict(update, state, self.ledger)

    def finish(self, update: int, state, stopped: bool) -> None:
        self.reader.close()
        self.publisher.finish(update, state, self.ledger, stopped)

    def close(self) -> None:
        self.reader.close()


def collector_name(cfg) -> str:
    return cfg.collector_id or f"{os.uname().nodename}-{os.getpid()}"


def collector_seed(name: str) -> int:
    return zlib.crc32(name.encode())
