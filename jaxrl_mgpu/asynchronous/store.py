"""The trajectory store of an asynchronous run: `<run-dir>/store/`, shared by any number of
collector processes (writers) and the learner (the only reader and the only one to delete).

Each shard is a TFDS array_record dataset of RLDS episodes (the layout of `data.rlds`: `steps`
with observation, action, reward, discount, is_first, is_last, is_terminal), of one of two kinds:
- `write` (DQN collectors): episodes of the collector's policy (observations in the dtype the
  learner's replay keeps them: bytes for MinAtar), plus each episode's
  `final_observation` (the observation after its last step, before any reset, which a learner
  needs to bootstrap truncated episodes); the metadata records the `policy_step` that acted.
- `write_histories` (AD history collectors): whole learning histories of a source learner, in
  exactly the layout `rlds.write` gives a `histories` dataset (so `rlds.read` reads a shard),
  with the source algorithm, its config and the goals' seed and split in the metadata.
Shards are built in a hidden staging directory and renamed into place (`rlds.build`), so no
reader ever sees a partial shard. Every shard's metadata records who wrote it: `collector`,
`episodes`, `env_steps`, `env`.

Shard names start with the writer's wall-clock time in nanoseconds, so sorting names is
first-in-first-out across collectors, which is the eviction order (a collector's writer
processes may finish its shards a little out of order).
"""

from __future__ import annotations

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


class Transitions(NamedTuple):
    """Transitions (one-step or n-step: read_transitions), ready for a replay buffer."""
    obs: np.ndarray        # [N, *obs_shape]
    action: np.ndarray     # [N]
    reward: np.ndarray     # [N] float32
    discount: np.ndarray   # [N] float32: the bootstrap's discount (0 where the episode terminated)
    next_obs: np.ndarray   # [N, *obs_shape] observation after the step, before any reset


class Episodes(NamedTuple):
    """Whole episodes laid end to end: one array per field, not one per episode, so that a
    collector cuts them from a rollout with a few slices per environment and sends them to a
    writer process in one piece."""
    observation: np.ndarray        # [N, *obs_shape]
    action: np.ndarray             # [N]
    reward: np.ndarray             # [N] float32
    length: np.ndarray             # [E] steps of each episode, in order (they add up to N)
    terminated: np.ndarray         # [E] bool: the episode ended for real, not by a time limit
    final_observation: np.ndarray  # [E, *obs_shape] the observation after its last step, before any reset

    @classmethod
    def join(cls, episodes: list[dict]) -> "Episodes":
        """From episodes as dicts of `observation` [n, ...], `action` [n], `reward` [n],
        `terminated` and `final_observation` [...]."""
        if not episodes:
            raise DatasetError("a shard needs at least one episode")
        cat = lambda k: np.concatenate([np.asarray(e[k]) for e in episodes])  # noqa: E731
        return cls(cat("observation"), cat("action").astype(np.int32), cat("reward").astype(np.float32),
                   np.array([len(e["reward"]) for e in episodes]), np.array([bool(e["terminated"]) for e in episodes]),
                   np.stack([np.asarray(e["final_observation"]) for e in episodes]))


class Shard(NamedTuple):
    path: Path
    meta: dict


def waited_meta(waited: dict[str, float]) -> dict:
    """A shard's record of its collector's back-pressure wait since its previous shard: in all,
    and by reason (rate.HOLD_REASONS), for the learner's `async/collector_wait_s` metrics."""
    return {"waited_s": float(sum(waited.values())), "waited_for_s": {k: float(v) for k, v in waited.items() if v}}


def _features(obs: np.ndarray, action: np.ndarray) -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict({
        "steps": rlds.steps_feature(obs, action),
        "final_observation": rlds.bytes_tensor(obs),
        "episode_index": np.int32,
    })


class Store:
    def __init__(self, run_dir: str | os.PathLike):
        self.root = Path(run_dir).absolute() / "store"
        self._meta: dict[str, dict] = {}  # shard name -> metadata, read once per shard

    def write(self, episodes: Episodes, collector: str, policy_step: int, env: str,
              waited: dict[str, float] | None = None) -> Path:
        """Writes complete episodes as one new shard, one RLDS episode record each."""
        if len(episodes.length) == 0:
            raise DatasetError("a shard needs at least one episode")
        self.root.mkdir(parents=True, exist_ok=True)
        meta = {"env": env, "collector": collector, "policy_step": int(policy_step), "episodes": len(episodes.length),
                "env_steps": int(episodes.length.sum()), "return_sum": float(np.sum(episodes.reward, dtype=np.float64)),
                "created": time.time(), **waited_meta(waited or {})}
        features = _features(episodes.final_observation[0], episodes.action[0])
        starts = np.concatenate([[0], np.cumsum(episodes.length)])

        def examples():
            for i, (start, stop) in enumerate(zip(starts[:-1], starts[1:])):
                n = stop - start
                last = np.arange(n) == n - 1
                terminal = last & bool(episodes.terminated[i])
                yield i, {"steps": {"observation": episodes.observation[start:stop],
                                    "action": episodes.action[start:stop], "reward": episodes.reward[start:stop],
                                    "discount": (~terminal).astype(np.float32), "is_first": np.arange(n) == 0,
                                    "is_last": last, "is_terminal": terminal},
                          "final_observation": episodes.final_observation[i], "episode_index": i}

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
        shard's metadata is read once (TFDS keeps it in the shard's metadata.json)."""
        if not self.root.is_dir():
            return []
        known = {}
        for n in sorted(n for n in os.listdir(self.root) if not n.startswith(".")):
            try:
                known[n] = self._meta.get(n) or json.loads((self.root / n / "metadata.json").read_text())
            except FileNotFoundError:  # evicted by the learner since the listing
                continue
        self._meta = known
        return [Shard(self.root / n, m) for n, m in known.items()]

    def unread_steps(self, after: str | None) -> int:
        """Transitions in the shards named after `after` (the newest shard a reader has taken;
        None: all of them)."""
        return sum(s.meta["env_steps"] for s in self.shards() if after is None or s.path.name > after)

    def episodes(self) -> int:
        """Episodes in the store now."""
        return sum(s.meta["episodes"] for s in self.shards())

    def read(self, shard: Shard) -> Transitions:
        """The shard's episodes as one-step transitions (checksums verified first)."""
        return read_transitions(shard)

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
        """Deletes the oldest of `shards` until at most `max_episodes` episodes remain; returns
        the survivors. Only the learner calls this. A shard is renamed to a hidden name first,
        so a listing never shows a half-deleted shard."""
        total = sum(s.meta["episodes"] for s in shards)
        kept = list(shards)
        while kept and total > max_episodes:
            victim = kept.pop(0)
            total -= victim.meta["episodes"]
            trash = victim.path.parent / f".evicted-{victim.path.name}"
            os.rename(victim.path, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return kept


def write_job(job: tuple) -> str:
    """`Store(run_dir).write(episodes, collector, policy_step, env, waited)` for the `job` tuple
    (run_dir, episodes, ...): what a collector's writer processes run (workers.Pool)."""
    run_dir, *args = job
    return str(Store(run_dir).write(*args))


def read_transitions(shard: Shard, n_step: int = 1, gamma: float = 1.0) -> Transitions:
    """A shard's episodes as `n_step` transitions (checksums verified first), as --mode both's
    replay samples them (dqn.n_step_return): from each step t, the steps t..t+k of its episode,
    k = n_step - 1 or fewer where the episode ends first; reward = sum of gamma^i r_{t+i};
    discount = gamma^(k+1), 0 where step t+k terminated the episode; next_obs = the observation
    after step t+k (the final one where the episode ended there, a time limit included). With
    the defaults, one-step transitions with discount 0 where the episode terminated, else 1.
    A function of the shard, so that a decoder process can run it (workers.py)."""
    rlds.verify(shard.path)
    builder = tfds.builder_from_directory(shard.path)
    try:
        source = builder.as_data_source(rlds.SPLIT, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
        parser = rlds.episode_parser(builder)
        episodes = [parser(r) for r in source.__getitems__(range(len(source)))]
    except Exception as e:  # array_record raises RuntimeError on a damaged file
        raise DatasetError(f"cannot read shard {shard.path}: {type(e).__name__}: {e}".splitlines()[0]) from e
    steps = {k: np.concatenate([e["steps"][k] for e in episodes]) for k in ("observation", "action", "reward",
                                                                              "is_terminal")}
    # The observation after each step: the next step's, or the episode's final one. Written
    # into one array with a mask, not concatenated per episode.
    next_obs = np.empty_like(steps["observation"])
    next_obs[:-1] = steps["observation"][1:]
    lengths = np.array([len(e["steps"]["reward"]) for e in episodes])
    ends = np.cumsum(lengths) - 1
    next_obs[ends] = np.stack([e["final_observation"] for e in episodes])
    # n-step windows on whole arrays: each step's last usable step is n_step - 1 ahead or its
    # episode's last step, whichever comes first.
    reward = steps["reward"].astype(np.float32)
    step = np.arange(len(reward))
    last = np.minimum(step + n_step - 1, np.repeat(ends, lengths))
    total = np.zeros_like(reward)
    for i in range(n_step):
        total += np.where(step + i <= last, np.float32(gamma) ** i * reward[np.minimum(step + i, last)], 0).astype(
            np.float32)
    used = last - step + 1
    discount = (np.float32(gamma) ** used * ~steps["is_terminal"][last]).astype(np.float32)
    return Transitions(steps["observation"], steps["action"], total, discount, next_obs[last])
