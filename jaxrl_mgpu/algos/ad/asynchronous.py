"""Algorithm Distillation on a growing store of learning histories (`--mode collect|learn --algo ad`).

    python -m jaxrl_mgpu.train --config darkroom-ad --mode learn --run-dir R                        # one learner
    CUDA_VISIBLE_DEVICES=1 python -m jaxrl_mgpu.train --config darkroom-ad --mode collect --run-dir R  # any number,
    CUDA_VISIBLE_DEVICES=2 python -m jaxrl_mgpu.train --config darkroom-ad --mode collect --run-dir R  # any time

A history collector runs the tabular source learner of `algos/ad/histories.py` on `--ad-history-tasks`
new training tasks at once (goals of the train split, drawn from the collector's own stream),
for `--ad-history-steps` steps each, and appends their whole learning histories to the run's
store (`store.py`) as one atomically written shard; then the next batch, until the learner
is done. It does not follow the learner's checkpoints: the source learns every task from
scratch, whatever AD has learned.

The learner keeps a FIXED-capacity buffer of learning histories on every device (as many as
`--store-max-episodes` holds, split over the devices), so shapes never change and nothing is
recompiled as data arrives. The learner is the loop (loop.py) with this module's
`HistorySource` as its data source, asked between compiled chunks how many may run:
  1. take the shards a background thread (`reader.ShardReader`) has read since, oldest
     first, as AD's inputs (`ad.prepare`);
  2. insert them, at most one history per device per compiled insert, round robin over the
     devices so they fill evenly; a full buffer overwrites its oldest history (FIFO, like the
     store's eviction); at most INSERT_BUDGET compiled inserts between two chunks, so ingest
     never crowds out learning;
  3. once every device holds a history, allow the updates the rate limiter (rate.py:
     `--samples-per-insert`, window steps sampled per history step received) leaves room for;
     the loop runs them (up to `--log-every` at a time) in one compiled chunk (`ad.update`,
     windows sampled from the filled slots only). The learner publishes its counts and history
     collectors pause while it is behind;
  4. the loop logs, publishes a checkpoint every `--checkpoint-every` updates (what
     in-context evaluation reads) and evicts the oldest shards beyond `--store-max-episodes`.
The buffer is not checkpointed: a restarted learner refills it from the store.

There is no `async/policy_lag`: the source learners never act with the learner's params, so
the data's age in learner steps says nothing about it; the FIFO buffer bounds its age instead.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu.algos.ad import histories
from jaxrl_mgpu.algos.ad import ad
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Share, Resolved
from jaxrl_mgpu.algos.spec import Asynchronous
from jaxrl_mgpu.asynchronous.checkpoints import learner_done
from jaxrl_mgpu.asynchronous.collector import COLLECTOR_LOG_S, Pacer, collector_name, collector_seed
from jaxrl_mgpu.asynchronous.source import StoreSource
from jaxrl_mgpu.asynchronous.store import Store, waited_meta
from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.envs import darkroom
from jaxrl_mgpu.cli import count

COUNTS = ("env_steps", "episodes", "tasks")  # what the learner counts of each shard it receives
INSERT_BUDGET = 8  # compiled inserts (one history per device each) per poll at most
# The default --samples-per-insert: the darkroom-ad recipe's ratio, 20,000 updates of 256 x 160
# window steps over 2,048 histories of 4,000 steps.
SAMPLES_PER_INSERT = 100.0
# Options a collector's histories must share with the run's learner to be usable by it.
SHARED_WITH_LEARNER = ("algo", "env", "ad_history_steps")


def check(run: Resolved, num_devices: int) -> BatchSplit:
    cfg = run.cfg
    if cfg.env not in darkroom.ROOMS:
        raise ConfigError(f"--mode {cfg.mode} --algo ad runs the tabular source learner of the Dark Rooms: use "
                          f"--env {' or '.join(darkroom.ROOMS)} (not {cfg.env})")
    if cfg.dataset:
        raise ConfigError(f"--dataset is for --mode both; with --mode {cfg.mode} the learning histories are the "
                          f"run's store (--run-dir)")
    episode_len = darkroom.ROOMS[cfg.env].episode_len
    if cfg.ad_history_steps < 1 or cfg.ad_history_steps % episode_len:
        raise ConfigError(f"--ad-history-steps {cfg.ad_history_steps} must be a positive multiple of the {cfg.env} "
                          f"episode length {episode_len}")
    if cfg.store_max_episodes < 1:
        raise ConfigError("--store-max-episodes must be at least 1")
    if cfg.mode == "collect":
        if cfg.ad_history_tasks < 1:
            raise ConfigError(f"--ad-history-tasks must be at least 1, got {cfg.ad_history_tasks}")
        if jax.process_count() > 1:
            raise ConfigError("a history collector runs in one process; start one per host instead")
        saved = Path(cfg.run_dir or "") / "config.json"
        if cfg.run_dir and saved.is_file():
            differ = config_lib.incompatible(json.loads(saved.read_text()), cfg, SHARED_WITH_LEARNER)
            if differ:
                raise ConfigError(f"--run-dir {cfg.run_dir}: its learner has a different {', '.join(differ)} and "
                                  f"could not use these histories")
        return BatchSplit(num_devices, tasks_per_shard=Share(cfg.ad_history_tasks, -(-cfg.ad_history_tasks // num_devices)))
    layout = ad.check_batch(run, num_devices)
    length = _slot(run).action.shape[0]
    if cfg.n_transit > length:
        raise ConfigError(f"--n-transit {cfg.n_transit} is longer than the learning histories ({length} steps of "
                          f"--ad-history-steps {cfg.ad_history_steps}, every {cfg.ad_episode_stride}-th episode kept)")
    per_device = capacity(cfg, num_devices)
    if per_device < 1:
        per_history = cfg.ad_history_steps // episode_len
        raise ConfigError(f"--store-max-episodes {cfg.store_max_episodes} holds {cfg.store_max_episodes // per_history} "
                          f"learning histories of {per_history} episodes, fewer than the {count(num_devices, 'device')}: "
                          f"every device needs room for one")
    return dataclasses.replace(layout, history_buffer=Share(per_device * num_devices, per_device))


def per_update(cfg) -> str:
    return f"1 gradient step, {ad.steps_per_update(cfg):,} tokens"


def capacity(cfg, num_devices: int) -> int:
    """Learning histories in each device's buffer: as many as `--store-max-episodes` holds,
    split over the devices (so the buffer and the store keep about the same histories)."""
    return cfg.store_max_episodes // (cfg.ad_history_steps // darkroom.ROOMS[cfg.env].episode_len) // num_devices


def _slot(run: Resolved) -> ad.Steps:
    """One buffer slot (zeros): what `ad.prepare` makes of one learning history of
    `--ad-history-steps` steps, so the buffer's shapes follow AD's inputs exactly."""
    cfg, env, env_params = run.cfg, run.env, run.env_params
    n, shape = cfg.ad_history_steps, env.observation_space(env_params).shape
    done = (np.arange(n) % env.episode_len == env.episode_len - 1)[None]
    empty = rlds.Histories(observation=np.zeros((1, n) + shape, np.float32), action=np.zeros((1, n), np.int32),
                           reward=np.zeros((1, n), np.float32), done=done, terminated=np.zeros_like(done),
                           task=np.zeros((1, 2), np.int32))
    return jax.tree.map(lambda x: x[0], ad.prepare(empty, cfg.ad_episode_stride))


def _fits(cfg, shard_meta: dict) -> bool:
    """Whether a shard holds learning histories this learner can use (a store may hold shards
    of collectors started with other options)."""
    return shard_meta.get("env") == cfg.env and shard_meta.get("steps_per_task") == cfg.ad_history_steps


# -- the buffer (per device) -------------------------------------------------------------

class Buffer(NamedTuple):
    """One device's learning histories: a ring of `capacity` slots of AD's inputs
    (`ad.Steps` [capacity, steps, ...]); `written` counts the histories inserted so far."""
    steps: ad.Steps
    written: jax.Array


def new_buffer(slot: ad.Steps, capacity: int) -> Buffer:
    return Buffer(jax.tree.map(lambda x: jnp.zeros((capacity,) + x.shape, x.dtype), slot), jnp.zeros((), jnp.int32))


def insert(buffer: Buffer, history: ad.Steps, valid: jax.Array) -> Buffer:
    """Writes `history` over the oldest slot, if `valid` (an insert call need not have a
    history for every device)."""
    slot = buffer.written % buffer.steps.action.shape[0]
    steps = jax.tree.map(lambda b, x: b.at[slot].set(jnp.where(valid, x.astype(b.dtype), b[slot])),
                         buffer.steps, history)
    return Buffer(steps, buffer.written + valid.astype(jnp.int32))


def filled(buffer: Buffer) -> jax.Array:
    return jnp.minimum(buffer.written, buffer.steps.action.shape[0])


# -- the learner -----------------------------------------------------------------------------

def algorithm(run: Resolved) -> Algorithm[ad.Algo]:
    """What the loop trains in --mode learn: AD's update on the windows of the source's buffer
    (its filled slots only); one optimizer step per update."""
    algo = ad.make(run.cfg, run.env, run.env_params, run.split)
    return Algorithm(algo.init, lambda state, buf: algo.update(state, buf.steps, filled(buf)), ad.STATE_LAYOUT,
                     parts=algo, episodic=False)


class HistorySource(StoreSource):
    """The learner's data source (sources.LearnerSource): learning histories from the store, read by a
    background thread, inserted into the fixed-capacity on-device buffer round robin over the
    devices; how many updates may run (every device needs a history; then the samples per
    insert, rate.py); the log's data and rate counts; and the checkpoints in-context evaluation
    reads."""

    memory, counts = "buffer", COUNTS

    def __init__(self, run: Resolved, learner: Algorithm, ckpts: Checkpoints, log, resume_step: int | None, state):
        # (the learner's own functions are not needed: the buffer's are this module's)
        cfg, par, split = run.cfg, run.par, run.split
        self.slot, self.per_device, self.devices = _slot(run), split.history_buffer.per_device, par.num_devices
        key = par.replicate(np.asarray(jax.random.PRNGKey(cfg.seed)))
        self.buffer = par.map(lambda _: new_buffer(self.slot, self.per_device))(key)
        self.insert = par.map(insert, donate=True)
        super().__init__(cfg, par, ckpts, ad.STATE_LAYOUT, log, resume_step, state)
        self.pending: list[ad.Steps] = []  # histories read, waiting for a slot, oldest first
        self.inserted = 0  # history i went to device i % devices
        self.dropped = 0   # histories overwritten before they reached a slot (more arrived than the buffer holds)
        self.update = 0
        self.limit(ad.steps_per_update(cfg), self.devices * cfg.ad_history_steps,
                   default_target=SAMPLES_PER_INSERT)
        self.waiting_for = (f"waiting for learning histories in {self.store.root}: each of the {count(self.devices, 'device')} needs one "
                            f"(start a collector: --mode collect --algo ad --run-dir {cfg.run_dir})")
        # Said once, at the start or when the first poll finds none (the chunk compiles between).
        self._said_waiting = not any(_fits(cfg, shard.meta) for shard in self.store.shards())
        if self._said_waiting:
            log.print(f"  {self.waiting_for}")

    def read(self, shard):
        """A shard's histories as AD's inputs, one per task (None: not this run's kind)."""
        if not _fits(self.cfg, shard.meta):
            self.log.print(f"  skipping store shard {shard.path.name}: not {self.cfg.env} histories of "
                           f"--ad-history-steps {self.cfg.ad_history_steps}")
            return None
        h = rlds.read(shard.path, env=self.cfg.env)  # checksums verified first
        return [ad.Steps(*task) for task in zip(*ad.prepare(h, self.cfg.ad_episode_stride))]

    @property
    def data(self) -> tuple:
        return (self.buffer,)

    def receive(self, update: int) -> None:
        # shards the reader has read, oldest first; after a restart, consumed ones only refill;
        # histories beyond the buffer's capacity would be overwritten unused
        for _, _, tasks in self.arrived():
            self.pending.extend(tasks)
        capacity = self.per_device * self.devices
        self.dropped += max(len(self.pending) - capacity, 0)
        self.pending = self.pending[-capacity:]

    def insert_ready(self, update: int) -> None:
        """Into the buffers (between chunks), at most INSERT_BUDGET inserts; then, once every
        device has a history, poll allows as many updates as the rate limiter does."""
        for _ in range(INSERT_BUDGET):
            if not self.pending:
                break
            take, self.pending = self.pending[:self.devices], self.pending[self.devices:]
            block = jax.tree.map(lambda x: np.zeros((self.devices,) + x.shape, x.dtype), self.slot)
            valid = np.zeros(self.devices, bool)
            for j, history in enumerate(take):
                d = (self.inserted + j) % self.devices
                for rows, x in zip(block, history):
                    rows[d] = x
                valid[d] = True
            self.buffer = self.insert(self.buffer, self.par.shard(self.par.local_rows(block)),
                                      self.par.shard(self.par.local_rows(valid)))
            self.inserted += len(take)
        if self.inserted < self.devices and not self._said_waiting:
            self.log.print(f"  {self.waiting_for}")
            self._said_waiting = True

    @property
    def samples(self) -> int:
        """Window steps sampled so far: one update samples --ad-batch-size windows of --n-transit."""
        return self.update * ad.steps_per_update(self.cfg)

    @property
    def inserts(self) -> int:
        """History steps received and taken in over the whole run (those still queued excepted)."""
        return max(self.ledger.env_steps - self.queued, 0)

    @property
    def queued(self) -> int:
        """History steps received, not yet in the buffer."""
        return len(self.pending) * self.cfg.ad_history_steps

    @property
    def in_memory(self) -> int:
        """History steps in the buffer (once every device has a history, the limiter's terms)."""
        return self.inserted * self.cfg.ad_history_steps

    def ran(self, updates: int, state, between: tuple[float, float] | None = None) -> None:
        super().ran(updates, state, between)
        self.update += updates  # one gradient step per update: the update count is the gradient step count

    def log_row(self, row: dict, updates: int) -> dict:
        update, elapsed = row["update"], time.perf_counter() - self.logged_at
        sampled = update * ad.steps_per_update(self.cfg)  # AD's step unit is its samples
        return {"update": update, ad.STEP_UNIT: sampled, "grad_steps": update,
                **{k: v for k, v in row.items() if k.startswith("loss/")},
                "grad_steps_per_s": updates / elapsed, "time": row["time"],
                "async/buffer_histories": min(self.inserted, self.per_device * self.devices),
                "async/dropped_histories": self.dropped,
                **self.rate_metrics(sampled, self.inserts, self.queued, update)}


# -- the history collector -----------------------------------------------------------------

def collect(run: Resolved, log, stop) -> int:
    """A history collector's loop: batches of source learning histories into the store, until
    the learner is done or a stop signal. Returns the env steps collected."""
    cfg, par, env = run.cfg, run.par, run.env
    run_dir = Path(cfg.run_dir)
    name = collector_name(cfg)
    source = histories.LearnerConfig(algo=cfg.ad_source)
    pool = darkroom.goals(cfg.env, "train", cfg.seed)  # the split in-context evaluation holds out
    store = Store(run_dir)
    # A restarted collector continues after its last batch still in the store, so it does new work.
    batch = 1 + max((s.meta.get("batch", -1) for s in store.shards() if s.meta.get("collector") == name), default=-1)
    log.print(f"collector {name}: tabular-q-{cfg.ad_source} source learners on {cfg.ad_history_tasks} {cfg.env} "
              f"train goals x {cfg.ad_history_steps} steps per shard, into {store.root}")
    total, shards, since = 0, 0, 0
    shard_steps = cfg.ad_history_tasks * cfg.ad_history_steps
    # (the learner starts with one shard: its learning starts with a history per device)
    pacer = Pacer(run_dir, store, name, shard_steps, shard_steps, log)
    while not stop() and not learner_done(run_dir):
        if pacer.held_back(time.monotonic()):
            continue
        # Each (collector, batch) draws its own goals and learner keys: collectors with other
        # ids, and later batches, learn new tasks rather than repeating one another.
        stream = np.random.default_rng([cfg.seed, collector_seed(name), batch])
        goals = pool[stream.integers(len(pool), size=cfg.ad_history_tasks)]
        key_seed = int(stream.integers(2 ** 31))
        h = histories.run(cfg.env, goals, cfg.ad_history_steps, key_seed, source, par)
        # "seed" is the goal split's (what evaluation reads); the learners' keys come from key_seed.
        meta = {**histories.source_metadata(cfg.env, source, len(goals), cfg.ad_history_steps, cfg.seed, "train"),
                "batch": batch, "key_seed": key_seed, **waited_meta(pacer.take_waits())}
        store.write_histories(dataclasses.replace(h, metadata=meta), name)
        total, shards, since = total + h.reward.size, shards + 1, since + 1
        if log.due("shards", COLLECTOR_LOG_S):
            returns = histories.episode_returns(h, env.episode_len).mean(0)
            log.print(f"collector {name}: {shards} shard(s) so far ({since} since the last line), {total:,} env steps "
                      f"in all; latest source return first episode {returns[0]:.2f}, last {returns[-1]:.2f}")
            since = 0
        batch += 1
    return total


def store_histories(cfg, run_dir) -> tuple[dict, rlds.Histories]:
    """The learning histories now in an asynchronous AD run's store, oldest first, with the
    first shard's metadata (the goals' split and seed, the source): what `evaluate
    --in-context` compares the model with."""
    shards = [s for s in Store(run_dir).shards() if _fits(cfg, s.meta)]
    if not shards:
        raise ConfigError(f"--run-dir {run_dir}: its store holds no {cfg.env} learning histories")
    parts = [rlds.read(s.path, env=cfg.env) for s in shards]
    fields = ("observation", "action", "reward", "done", "terminated", "task")
    joined = {f: np.concatenate([getattr(p, f) for p in parts]) for f in fields}
    return shards[0].meta, rlds.Histories(**joined, metadata=shards[0].meta)


# --mode learn|collect of AD (algos/__init__.py puts it in AD's spec)
ASYNCHRONOUS = Asynchronous(check, per_update, algorithm, HistorySource, collect,
                            lambda cfg: f"{cfg.ad_history_tasks} tasks")
