"""The trajectory store of an asynchronous run: `<run-dir>/store/`, shared by any number of
collector processes (writers) and the learner (the only reader and the only one to delete).

Each shard is a TFDS array_record dataset in the RLDS layout (that of `data.rlds`: `steps` with
observation, action, reward, discount, is_first, is_last, is_terminal), of one of two kinds:
- `write` (DQN collectors): segments of episodes acted by the collector's policy (observations
  in the dtype the learner's replay keeps them: bytes for MinAtar): whole episodes, or the
  steps of one environment's episode that a rollout got to. One record holds a shard's
  segments laid end to end: `steps` with the RLDS flags where episodes start and end
  (is_first, is_last, is_terminal), and `segments`, one item per segment: its `length`, its
  `final_observation` (the observation after its last step, before any reset, which the
  learner bootstraps from) and its `lookahead` (the trailing steps that only complete the
  n-step windows of the steps before them, and start the environment's next segment again).
  One record per shard, not per segment: TFDS encodes and decodes every record in Python, and a
  shard holds hundreds of segments. A learner reads them back with `read_segments`.
  The metadata records the `policy_step` that acted, the transitions the shard gives
  (`env_steps`) and the episodes it ends (`episodes`, `return_sum`, `episode_steps`: whole
  episodes' returns and lengths).
- `write_histories` (AD history collectors): whole learning histories of a source learner, in
  exactly the layout `rlds.write` gives a `histories` dataset (so `rlds.read` reads a shard),
  with the source algorithm, its config and the goals' seed and split in the metadata.
Shards are built in a hidden staging directory and renamed into place (`rlds.build`), so no
reader ever sees a partial shard. Every shard's metadata records who wrote it: `collector`,
`episodes`, `env_steps`, `env`.

Shard names start with the writer's wall-clock time in nanoseconds, so sorting names is
first-in-first-out across collectors, which is the eviction order (a collector's writer
processes may finish its shards a little out of order). Anything else in the store (a file, a
folder without a shard's metadata.json) is a stray: listed once, never read nor deleted, and
counted so that a learner can say so (`Store.strays`).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tensorflow_datasets as tfds

from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.data.rlds import DatasetError


class Segments(NamedTuple):
    """Segments of episodes laid end to end: one array per field, not one per segment, so that
    a collector cuts them from a rollout with a few slices per environment and sends them to a
    writer process in one piece. A segment is a whole episode or a piece of one: collectors
    write every environment's steps as soon as a rollout ends, since an episode written only
    once it ends reaches the learner a whole episode late (its first steps acted by a policy
    that much older, and the better the policy, the longer the episodes)."""
    observation: np.ndarray        # [N, *obs_shape]
    action: np.ndarray             # [N]
    reward: np.ndarray             # [N] float32
    length: np.ndarray             # [S] steps of each segment, in order (they add up to N)
    first: np.ndarray              # [S] bool: it starts its episode
    ended: np.ndarray              # [S] bool: it ends its episode
    terminated: np.ndarray         # [S] bool: ... for real, not by a time limit
    lookahead: np.ndarray          # [S] trailing steps that are not its transitions (0 where it ended)
    final_observation: np.ndarray  # [S, *obs_shape] the observation after its last step, before any reset
    episode_return: np.ndarray     # [S] float32 where it ended: its whole episode's return (else 0)
    episode_length: np.ndarray     # [S] where it ended: its whole episode's length (else 0)

    @property
    def transitions(self) -> int:
        """The transitions the segments give a learner (their steps but the lookahead ones)."""
        return int(self.length.sum() - self.lookahead.sum())

    @classmethod
    def whole(cls, episodes: list[dict]) -> "Segments":
        """Whole episodes, from dicts of `observation` [n, ...], `action` [n], `reward` [n],
        `terminated` and `final_observation` [...]."""
        if not episodes:
            raise DatasetError("a shard needs at least one segment")
        cat = lambda k: np.concatenate([np.asarray(e[k]) for e in episodes])  # noqa: E731
        length = np.array([len(e["reward"]) for e in episodes])
        ones = np.ones(len(episodes), bool)
        return cls(cat("observation"), cat("action").astype(np.int32), cat("reward").astype(np.float32), length,
                   ones, ones, np.array([bool(e["terminated"]) for e in episodes]), np.zeros(len(episodes), np.int64),
                   np.stack([np.asarray(e["final_observation"]) for e in episodes]),
                   np.array([np.sum(e["reward"], dtype=np.float32) for e in episodes], np.float32), length)


class Shard(NamedTuple):
    path: Path
    meta: dict
    listed: float | None = None  # wall-clock time this process's Store first listed it


def waited_meta(waited: dict[str, float]) -> dict:
    """A shard's record of its collector's back-pressure wait since its previous shard: in all,
    and by reason (rate.HOLD_REASONS), for the learner's `async/collector_wait_s` metrics."""
    return {"waited_s": float(sum(waited.values())), "waited_for_s": {k: float(v) for k, v in waited.items() if v}}


def _features(obs: np.ndarray, action: np.ndarray) -> tfds.features.FeaturesDict:
    segments = tfds.features.Dataset({"length": np.int32, "lookahead": np.int32,
                                      "final_observation": rlds.bytes_tensor(obs)})

    def encode_segments(items: dict) -> dict:  # whole arrays at once, as rlds.steps_feature
        return {"length": np.asarray(items["length"], np.int32), "lookahead": np.asarray(items["lookahead"], np.int32),
                "final_observation": rlds.byte_rows(np.asarray(items["final_observation"], obs.dtype))}

    segments.encode_example = encode_segments  # this instance only; the spec stays TFDS's
    return tfds.features.FeaturesDict({"steps": rlds.steps_feature(obs, action), "segments": segments})


class Listing(NamedTuple):
    """What a Store listed last: replaced whole, so that threads sharing the Store see one
    listing or the next."""
    shards: dict[str, Shard]   # {name: Shard}, oldest first
    names: list[str]           # their names ...
    in_order: list[Shard]      # ... and the shards, oldest first
    strays: dict[str, float]   # {name: wall-clock time first listed} of the entries that are not shards


class Store:
    def __init__(self, run_dir: str | os.PathLike):
        self.root = Path(run_dir).absolute() / "store"
        self._listing = Listing({}, [], [], {})  # the last listing (_list)

    def write(self, segments: Segments, collector: str, policy_step: int, env: str,
              waited: dict[str, float] | None = None, acted: dict[str, float] | None = None) -> Path:
        """Writes segments of episodes as one new shard (one record: the module docstring).
        `acted`: wall-clock times of the rollout, recorded in the metadata (`acted`: when it
        began, `params_published`: when the params it acted with were), with `created` (now)."""
        if len(segments.length) == 0:
            raise DatasetError("a shard needs at least one segment")
        self.root.mkdir(parents=True, exist_ok=True)
        ended = segments.ended.astype(bool)
        meta = {"env": env, "collector": collector, "policy_step": int(policy_step), "episodes": int(ended.sum()),
                "env_steps": segments.transitions,
                "return_sum": float(np.sum(segments.episode_return[ended], dtype=np.float64)),
                "episode_steps": int(segments.episode_length[ended].sum()), "created": time.time(),
                **(acted or {}), **waited_meta(waited or {})}
        features = _features(segments.final_observation[0], segments.action[0])
        # each step's segment, and its place in it
        segment = np.repeat(np.arange(len(segments.length)), segments.length)
        place = np.arange(len(segment)) - np.concatenate([[0], np.cumsum(segments.length)[:-1]])[segment]
        last = ended[segment] & (place == segments.length[segment] - 1)  # the last step of an episode
        terminal = last & segments.terminated.astype(bool)[segment]
        record = {"steps": {"observation": segments.observation, "action": segments.action,
                            "reward": segments.reward, "discount": (~terminal).astype(np.float32),
                            "is_first": (place == 0) & segments.first.astype(bool)[segment],
                            "is_last": last, "is_terminal": terminal},
                  "segments": {"length": segments.length, "lookahead": segments.lookahead,
                               "final_observation": segments.final_observation}}

        def examples():
            yield 0, record

        return rlds.build(self._new_path(collector), features, meta, examples)

    def write_histories(self, histories: rlds.Histories, collector: str) -> Path:
        """Writes whole learning histories (each task's history ending on a done step) as one
        new shard, with `histories.metadata` (the source's) plus the store's own keys."""
        meta = {**histories.metadata, "collector": collector, "episodes": int(histories.done.sum()),
                "env_steps": int(histories.reward.size), "return_sum": float(histories.reward.sum()),
                "created": time.time()}
        return rlds.write(self._new_path(collector), dataclasses.replace(histories, metadata=meta))

    def _new_path(self, collector: str) -> Path:
        # Wall-clock nanoseconds first: sorted names are first-in-first-out (the module docstring).
        return self.root / f"{time.time_ns():020d}-{collector}-{uuid.uuid4().hex[:6]}"

    def shards(self) -> list[Shard]:
        """Complete shards, oldest first (staging directories are hidden, hence skipped). Each
        shard's metadata is read once (TFDS keeps it in the shard's metadata.json), when this
        Store first lists it (`Shard.listed`). A listing where nothing changed costs the
        directory's names only: the learner's reader and paused collectors list every few ms,
        and rebuilding every shard's entry each time would hold the GIL the learner's thread
        needs."""
        return list(self._list().in_order)

    def strays(self) -> dict[str, float]:
        """The entries of the last listing that are not shards, with the wall-clock time each was
        first listed, oldest first (no listing of its own: a learner's reader lists every few ms)."""
        return self._listing.strays

    def _list(self) -> Listing:
        listing = self._listing
        if not self.root.is_dir():
            return listing
        names = {n for n in os.listdir(self.root) if not n.startswith(".")}
        # A stray is not looked at again while it stays: a shard appears whole, by a rename.
        gone = listing.strays.keys() - names
        names -= listing.strays.keys()
        if names == listing.shards.keys() and not gone:
            return listing
        known = {n: shard for n, shard in listing.shards.items() if n in names}
        strays = {n: t for n, t in listing.strays.items() if n not in gone}
        new = sorted(names - known.keys())
        in_order = not (new and known and new[0] < next(reversed(known)))
        for n in new:
            try:
                known[n] = Shard(self.root / n, json.loads((self.root / n / "metadata.json").read_text()), time.time())
            except (FileNotFoundError, NotADirectoryError):
                # a stray, or a shard evicted by the learner since the listing (gone at the next one)
                strays[n] = time.time()
        if not in_order:  # a writer finished after a later-started one
            known = dict(sorted(known.items()))
        self._listing = Listing(known, list(known), list(known.values()), strays)
        return self._listing

    def unread_steps(self, after: str | None) -> int:
        """Transitions in the shards named after `after` (the newest shard a reader has taken;
        None: all of them)."""
        listing = self._list()
        start = 0 if after is None else bisect.bisect_right(listing.names, after)
        return sum(s.meta["env_steps"] for s in listing.in_order[start:])

    def episodes(self) -> int:
        """Episodes ended in the store's shards now."""
        return sum(s.meta["episodes"] for s in self.shards())

    def read(self, shard: Shard) -> SegmentSteps:
        """The shard's segments (checksums verified first)."""
        return read_segments(shard)

    def clean_staging(self, older_than_s: float = 600.0) -> None:
        """Deletes staging directories of writers that died mid-shard (nobody renames them)."""
        if not self.root.is_dir():
            return
        for p in self.root.iterdir():
            if not (p.name.startswith(".") and ".partial-" in p.name):
                continue
            try:
                stale = time.time() - p.stat().st_mtime > older_than_s
            except FileNotFoundError:  # its writer just finished and renamed it into place
                continue
            if stale:
                shutil.rmtree(p, ignore_errors=True)

    def evict(self, shards: list[Shard], max_episodes: int) -> list[Shard]:
        """Deletes the oldest of `shards` until at most `max_episodes` episodes remain (each
        shard counting `episodes_held`); returns the survivors. Only the learner calls this. A
        shard is renamed to a hidden name first, so a listing never shows a half-deleted shard."""
        total = sum(episodes_held(s) for s in shards)
        kept = list(shards)
        while kept and total > max_episodes:
            victim = kept.pop(0)
            total -= episodes_held(victim)
            trash = victim.path.parent / f".evicted-{victim.path.name}"
            os.rename(victim.path, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return kept


def episodes_held(shard: Shard) -> int:
    """What a shard counts against --store-max-episodes: the episodes it ends, at least one (a
    shard of unfinished episodes' segments ends none, and episodes that rarely end would
    otherwise let the store grow without bound)."""
    return max(shard.meta["episodes"], 1)


def write_job(job: tuple) -> str:
    """`Store(run_dir).write(segments, collector, policy_step, env, waited)` for the `job` tuple
    (run_dir, segments, ...): what a collector's writer processes run (workers.Pool)."""
    run_dir, *args = job
    return str(Store(run_dir).write(*args))


class SegmentSteps(NamedTuple):
    """A shard's segments as a learner reads them back: their steps laid end to end, and where
    each segment ends."""
    observation: np.ndarray        # [N, *obs_shape]
    action: np.ndarray             # [N]
    reward: np.ndarray             # [N]
    terminal: np.ndarray           # [N] bool: the step terminated its episode (a time limit does not)
    length: np.ndarray             # [S] steps of each segment, in order (they add up to N)
    lookahead: np.ndarray          # [S] its trailing steps that are not its transitions
    final_observation: np.ndarray  # [S, *obs_shape] the observation after its last step, before any reset


def read_segments(shard: Shard) -> SegmentSteps:
    """A shard's segments of episodes (checksums verified first). A function of the shard, so
    that a decoder process can run it (workers.py)."""
    records = rlds.records(shard.path)
    if not records or any("segments" not in r for r in records):
        raise DatasetError(f"shard {shard.path} is not a shard of episode segments (written by another version?)")
    steps = {k: np.concatenate([r["steps"][k] for r in records]) for k in ("observation", "action", "reward",
                                                                             "is_terminal")}
    lengths, lookahead = (np.concatenate([r["segments"][k] for r in records]).astype(np.int64)
                          for k in ("length", "lookahead"))
    if lengths.sum() != len(steps["reward"]) or np.any(lengths < 1) or np.any(lookahead >= lengths):
        raise DatasetError(f"shard {shard.path}: its segments' lengths do not add up to its steps")
    return SegmentSteps(steps["observation"], steps["action"], steps["reward"], steps["is_terminal"], lengths,
                        lookahead, np.concatenate([r["segments"]["final_observation"] for r in records]))
