"""The ledger of what an asynchronous learner received from the collectors: saved in every
checkpoint it publishes (checkpoints.py), so that a restarted learner counts on where it
stopped and never counts a shard twice."""

from __future__ import annotations

import dataclasses


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
