"""An asynchronous learner's published checkpoints, in its run directory: the state with the
ledger (ledger.py), which a restarted learner resumes from and evaluation reads; the store's
eviction, which only the learner does, after a publication; and the marker that tells the
collectors it is done."""

from __future__ import annotations

import json
from pathlib import Path

from jaxrl_mgpu.asynchronous.ledger import Ledger
from jaxrl_mgpu.asynchronous.store import Store, episodes_held

DONE_MARKER = "learner_done"  # written by the learner at the end: collectors then stop


def learner_done(run_dir: Path) -> bool:
    """Whether the run's learner has finished (collectors stop then)."""
    return (run_dir / DONE_MARKER).exists()


class CheckpointPublisher:
    """Publishes a learner's checkpoints, each with its ledger, and evicts from the store after
    a publication; its last checkpoint leaves the done marker."""

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

    def publish_and_evict(self, iteration: int, state, ledger: Ledger) -> set[str]:
        """Publishes, then deletes the oldest shards beyond `--store-max-episodes`, only ones
        already consumed (a shard is never deleted unread: the rate limiter bounds how many wait).
        Returns the names of the shards deleted (for the caller to drop from its ledger)."""
        self.publish(iteration, state, ledger)
        shards = self.store.shards()
        consumed = [s for s in shards if s.path.name in ledger.consumed]
        unread = sum(episodes_held(s) for s in shards if s.path.name not in ledger.consumed)
        kept = self.store.evict(consumed, max(self.cfg.store_max_episodes - unread, 0))
        self.store.clean_staging()
        return {s.path.name for s in consumed} - {s.path.name for s in kept}

    def finish(self, iteration: int, state, ledger: Ledger, stopped: bool) -> None:
        """The last checkpoint; then, unless stopped by a signal (a restart will follow), the
        marker that tells collectors the learner is done."""
        if self.ckpts.latest_step() != iteration:
            self.publish(iteration, state, ledger)
        self.ckpts.wait()
        if not stopped:
            (Path(self.cfg.run_dir) / DONE_MARKER).write_text(json.dumps({"iteration": iteration}))
