"""The asynchronous side of the replay algorithms (DQN, SAC, TD3; `--mode learn|collect`):
collectors write segments of episodes to the run's store; one learner, the loop with
`ReplaySource` as its data source, decodes them into --mode both's n-step transitions, inserts
them into its on-device ring (between chunks, at most dqn_ingest.INSERT_BUDGET a device) and
trains as fast as `--samples-per-insert` allows. What is the algorithm's own comes in two
records: the learner's `LearnerFunctions` (its `Algorithm.parts`) and the collectors' `Acting`
(algos/dqn/asynchronous.py, algos/sac/asynchronous.py). How it works and the commands: docs/asynchronous.md.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Resolved
from jaxrl_mgpu.algos.ingest import BLOCK, Ingest
from jaxrl_mgpu.algos.replay import TransitionRing, Transitions, grad_steps_per_update, ring_insert, segment_transitions
from jaxrl_mgpu.asynchronous.checkpoints import learner_done
from jaxrl_mgpu.asynchronous.collector import COLLECTOR_LOG_S, Pacer, collector_name, collector_seed
from jaxrl_mgpu.asynchronous.policy import POLICY, ParamsFollower, ParamsPublisher
from jaxrl_mgpu.asynchronous.source import StoreSource
from jaxrl_mgpu.asynchronous.store import Segments, Shard, Store, read_segments, write_job
from jaxrl_mgpu.asynchronous.workers import Pool, default_workers
from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.algos.spec import Asynchronous
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.parallel import Parallel

COUNTS = ("env_steps", "episodes")  # what the learner counts of each shard it receives
WAITING_LOG_S = 60.0          # a collector waiting for the learner's first params says so this often
# The data's way from the learner's params to its replay, each stage's seconds logged as
# async/latency_s/<stage> (wall clocks: of several hosts where they are): params (published ->
# a collector's rollout with them began), rollout (-> a writer began the shard: acting, the copy
# to the host, cutting segments, a free writer), write (-> the learner's reader listed it:
# encoding, the rename, the reader's next listing), read (-> the learner took it: a free
# decoder, decoding, its turn), insert (-> in the replay, per transition: the ingest queue).
STAGES = ("params", "rollout", "write", "read", "insert")


def check(cfg, num_devices: int, layout: BatchSplit) -> BatchSplit:
    """The checks every replay learner and collector shares, on the algorithm's own `layout`."""
    if cfg.mode == "learn" and cfg.buffer_size // num_devices < BLOCK:
        raise ConfigError(f"--buffer-size {cfg.buffer_size} must hold at least {BLOCK} transitions per device")
    if cfg.store_max_episodes < 1 or cfg.shard_steps < 1:
        raise ConfigError("--store-max-episodes and --shard-steps must be at least 1")
    return layout


class LearnerFunctions(NamedTuple):
    """A replay learner's functions, mapped over the devices (its `Algorithm.parts`)."""
    init: Callable         # key -> the learner's state
    init_replay: Callable  # key -> TransitionRing (empty)
    insert: Callable       # TransitionRing, Transitions [devices, block] -> TransitionRing (donates the ring)
    learn: Callable        # state, TransitionRing -> state, mean losses (donates the state)
    obs_shape: tuple


def learner(par: Parallel, init: Callable, learn: Callable, init_replay: Callable, layout: dict, obs_shape: tuple,
            **fields) -> Algorithm[LearnerFunctions]:
    """A replay learner as the loop trains it in --mode learn: one update is one `learn(state,
    ring)` on the source's ring (no episodes: those are counted as they arrive in the store);
    its mapped functions are its `parts`. `fields`: the Algorithm's others (learned, ...)."""
    def update(state, ring: TransitionRing):
        state, losses = learn(state, ring)
        none = jnp.zeros((), jnp.float32)
        return state, (losses, vec.EpisodeStats(none, none, none))

    functions = LearnerFunctions(par.map(init), par.map(init_replay), par.map(ring_insert, donate=True),
                                 par.map(learn, donate=True), obs_shape)
    return Algorithm(init, update, layout, parts=functions, **fields)


class Acting(NamedTuple):
    """How an algorithm's collectors act (algos/dqn/asynchronous.py, sac_async.py)."""
    # (run, seed) -> (rollout(envs, params, key, explore) -> envs, trajectory
    # [shard_steps, envs, ...] of (obs, action, reward, terminated, truncated, final_obs,
    # done_return, done_length), the environments' states donated; the first environments)
    rollout: Callable
    template: Callable   # run -> the shapes of the params collectors act with (jax.eval_shape)
    explore: Callable    # (cfg, env steps the learner had received) -> the rollout's `explore`
    describe: Callable   # explore -> what the collector's progress line says of it
    # explore before any params (--collect-before-checkpoint random: any params, zeros, act
    # uniformly at random with it)
    at_random: float = 1.0


def read_transitions(shard: Shard, n_step: int = 1, gamma: float = 1.0) -> Transitions:
    """A shard's segments as --mode both's `n_step` transitions (replay.segment_transitions):
    from every step but a segment's lookahead steps, its window of at most n_step steps, cut
    where the segment ends. A collector with the learner's --n-step leaves n_step - 1 lookahead
    steps on a segment that does not end its episode, so only an episode's end cuts a window,
    as in --mode both; a learner with a larger --n-step than its collectors gets shorter windows
    there, which still bootstrap correctly. With the defaults, one-step transitions with
    discount 0 where the episode terminated, else 1. A function of the shard, so that a decoder
    process can run it (workers.py)."""
    s = read_segments(shard)
    return segment_transitions(s.observation, s.action, s.reward, s.terminal, s.length, s.lookahead,
                               s.final_observation, n_step, gamma)


class ReplaySource(StoreSource):
    """The learner's data source (sources.LearnerSource): episodes from the store's shards, decoded into
    n-step transitions by the reader's processes, inserted into the on-device replay; how many
    iterations may run, by --learning-starts and the samples per insert (rate.py); the log's
    data and rate counts; the params collectors act with; and the checkpoints."""

    memory, counts = "replay", COUNTS

    def __init__(self, run: Resolved, learner: Algorithm[LearnerFunctions], ckpts: Checkpoints, log,
                 resume_step: int | None, state):
        cfg, par = run.cfg, run.par
        self.functions = functions = learner.parts
        # decoded into --mode both's n-step transitions (cfg.n_step, cfg.gamma) by the reader's processes
        self.decode = functools.partial(read_transitions, n_step=cfg.n_step, gamma=cfg.gamma)
        self.replay = functions.init_replay(par.replicate(np.asarray(jax.random.PRNGKey(cfg.seed))))
        super().__init__(cfg, par, ckpts, learner.layout, log, resume_step, state)
        self.ingest = Ingest(par.num_devices, self._to_devices, self._insert)
        self.inserted = 0
        # What arrived since the last log point (beyond StoreSource's window).
        self.episodes_window = {"episodes": 0, "return_sum": 0.0, "length_sum": 0, "lag_sum": 0.0, "shards": 0,
                                "inserted_lag_sum": 0.0, "inserted_n": 0}
        self.latency_window = {stage: [0.0, 0] for stage in STAGES}  # seconds summed, and over how many
        # Counted on the host (every iteration does the same number), so the loop never waits
        # on the devices to decide what to do next.
        self.per_learn = grad_steps_per_update(cfg)
        self.grads = self.grads_logged = int(par.first(state.grad_steps))
        # the params collectors act with, fresh after every chunk (policy.py)
        self.update = resume_step or 0
        self.params_publisher = ParamsPublisher(cfg.run_dir, enabled=jax.process_index() == 0)
        self.params_publisher.offer(self.update, state.params, self.ledger.env_steps, force=True)
        # (its ingest inserts whole blocks: less than one waits for more)
        self.limit(self.per_learn * cfg.replay_batch_size, max(cfg.learning_starts, cfg.replay_batch_size),
                   min_in_flight=BLOCK * par.num_devices)
        # Data enters the replay, and new params reach the collectors, only between chunks: a
        # chunk runs at most half of --max-data-lag's iterations, so that neither waits longer
        # than the data may be old (DQN learns much worse from stale acting params, rate.py).
        self.max_chunk = max(int(cfg.max_data_lag // 2), 1)
        self.waiting_for = (f"waiting for data from the collectors (--learning-starts {cfg.learning_starts} "
                            f"transitions, then {self.limiter.target:g} samples per insert)")

    @property
    def data(self) -> tuple:
        return (self.replay,)

    def receive(self, update: int) -> None:
        w = self.episodes_window
        # 1. shards the reader has read, oldest first (while the ingest queue has room); after a
        # restart, consumed ones only refill
        for shard, new, transitions in self.arrived() if self.ingest.has_room else ():
            episodes, now = shard.meta, time.time()
            self.ingest.add(transitions, (episodes["policy_step"], now) if new else None)
            if new:
                w["episodes"] += episodes["episodes"]
                w["return_sum"] += episodes.get("return_sum", 0.0)
                w["length_sum"] += episodes["episode_steps"]  # of the episodes it ends
                w["lag_sum"] += update - episodes["policy_step"]
                w["shards"] += 1
                for stage, seconds in _latencies(shard, now).items():
                    self.latency_window[stage][0] += seconds
                    self.latency_window[stage][1] += 1
        # 2. towards the replay: whole blocks start their copies to the devices (on a thread of
        # their own), for the next poll to insert
        self.ingest.stage()

    def insert_ready(self, update: int) -> None:
        """The blocks whose copies have arrived, into the replay (between chunks)."""
        w = self.episodes_window
        self.inserted += self.ingest.insert_arrived()
        now = time.time()
        for n, stamp in self.ingest.landed:  # how old the params that collected them are now; their wait
            if stamp is not None:
                w["inserted_lag_sum"] += n * (update - stamp[0])
                w["inserted_n"] += n
                self.latency_window["insert"][0] += n * (now - stamp[1])
                self.latency_window["insert"][1] += n
        self.ingest.landed = []

    def _to_devices(self, block: Transitions) -> Transitions:
        """A block of transitions, [devices x rows, ...] on the host, as arrays split over the
        devices (on the copier thread, so that the copies do not take the learner's thread)."""
        per_device = len(block.reward) // self.par.num_devices
        shaped = Transitions(*(x.reshape((self.par.num_devices, per_device) + x.shape[1:]) for x in block))
        return self.par.shard(self.par.local_rows(shaped))

    def _insert(self, block: Transitions) -> None:
        self.replay = self.functions.insert(self.replay, block)

    @property
    def samples(self) -> int:
        """Transitions sampled from the replay so far (all devices)."""
        return self.grads * self.cfg.replay_batch_size

    @property
    def inserts(self) -> int:
        """Transitions received and inserted over the whole run (the ledger's count survives a
        restart; the replay's refill after one is not new data)."""
        return max(self.ledger.env_steps - self.queued, 0)

    @property
    def queued(self) -> int:
        return self.ingest.queued

    @property
    def in_memory(self) -> int:
        return self.inserted

    def close(self) -> None:
        self.ingest.close()
        try:
            self.params_publisher.close()
        except Exception as e:  # noqa: BLE001 - closing after another error
            self.log.print(f"  the last params publication failed: {type(e).__name__}: {e}")
        super().close()

    def ran(self, updates: int, state, between: tuple[float, float] | None = None) -> None:
        super().ran(updates, state, between)
        self.grads += updates * self.per_learn
        self.params_publisher.offer(self.update + updates, state.params, self.ledger.env_steps)

    def log_row(self, row: dict, updates: int) -> dict:
        w, elapsed = self.episodes_window, time.perf_counter() - self.logged_at
        out = {**{k: v for k, v in row.items() if not k.startswith("episode")},
               "episode_return": w["return_sum"] / w["episodes"] if w["episodes"] else None,
               "episode_length": w["length_sum"] / w["episodes"] if w["episodes"] else None,
               "episodes": w["episodes"], "grad_steps": self.grads,
               "grad_steps_per_s": (self.grads - self.grads_logged) / elapsed,
               "async/policy_lag": w["lag_sum"] / w["shards"] if w["shards"] else None,
               # the same when they enter the replay, per transition (after the ingest queue)
               "async/policy_lag_inserted": (w["inserted_lag_sum"] / w["inserted_n"]
                                             if w["inserted_n"] else None),
               # where the lag comes from: seconds each stage of the data's way took (STAGES)
               **{f"async/latency_s/{stage}": seconds / n if n else None
                  for stage, (seconds, n) in self.latency_window.items()},
               **self.rate_metrics(self.samples, self.inserts, self.queued, self.grads)}
        self.episodes_window = dict.fromkeys(w, 0)
        self.latency_window = {stage: [0.0, 0] for stage in STAGES}
        self.grads_logged = self.grads
        return out


def collect(run: Resolved, log, stop, acting: Acting) -> int:
    """A collector's loop: follow the learner's newest params, roll out, append the rollout's
    segments of episodes to the store, until the learner is done or a stop signal. Returns the
    env steps collected."""
    cfg, par = run.cfg, run.par
    run_dir = Path(cfg.run_dir)
    name = collector_name(cfg)
    base = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), collector_seed(name))
    rollout, envs = acting.rollout(run, base)
    params, on_devices, on_devices_step, policy_step, explore, published = None, None, None, None, 1.0, None
    follower = ParamsFollower(run_dir, acting.template(run))
    if cfg.collect_before_checkpoint == "wait":
        log.print(f"collector {name}: following the learner's params in {run_dir / POLICY} (waiting for the first"
                  + ("" if run_dir.is_dir() else f"; {run_dir} does not exist yet: a learner started with --mode learn "
                                                 f"--run-dir {run_dir} makes it") + ")")
    open_: dict[int, Open] = {}  # per environment, where the last rollout left its episode
    lookahead = cfg.n_step - 1  # steps the learner's n-step windows need past a segment's transitions
    total, shard_index, waited_from = 0, 0, time.monotonic()
    window = {"shards": 0, "episodes": 0, "return_sum": 0.0}
    store = Store(run_dir)
    pacer = Pacer(run_dir, store, name, cfg.num_envs * cfg.shard_steps, cfg.learning_starts, log)
    # Shards are encoded by writer processes while this loop rolls out the next ones (TFDS
    # encodes in Python, which would hold up the rollouts).
    writers = Pool(write_job, cfg.store_workers or default_workers())

    def held_back(looked_from: float) -> bool:
        # this collector's shards being written count as unread (counted twice for the moment
        # between a writer's rename and its receipt: a pause too early, never too late)
        return pacer.held_back(looked_from, in_flight=sum(writers.tags))

    def write(segments: Segments, rolled_with: int, acted: dict) -> None:
        """Hands the segments rolled out to a writer (waiting for the oldest shard if none is free)."""
        nonlocal total
        if writers.full:
            writers.receive()
        writers.submit((run_dir, segments, name, rolled_with, cfg.env, pacer.take_waits(), acted),
                       tag=segments.transitions)
        total += segments.transitions
        window["shards"] += 1
        window["episodes"] += int(segments.ended.sum())
        window["return_sum"] += float(segments.episode_return.sum())

    try:
        while not stop() and not learner_done(run_dir):
            looked_from = time.monotonic()  # a pass that ends paused counts whole as waiting
            # Paused before rolling out, never after: a rolled-out shard is written at once (its
            # data would age while it waited). Checked once a writer is free, its last shard in the
            # store where the other collectors see it: so each collector is at most one shard per
            # writer past the bound. Shards written are received at once: those in the writers
            # count as on their way, and finished ones left unreceived would count so for good,
            # holding the collector back.
            while writers.full or writers.oldest_answered:
                writers.receive()
            if held_back(looked_from):
                continue
            # The newest params last, just before the rollout: following them before waiting for
            # a writer would act with params that much older.
            params, policy_step, explore, published = _follow(cfg, acting, follower, params, policy_step, explore,
                                                              published)
            if params is None:
                _say_waiting(log, name, run_dir, waited_from)
                continue
            if on_devices is None or on_devices_step != policy_step:
                on_devices, on_devices_step = par.replicate(params), policy_step
            key = par.replicate(np.asarray(jax.random.fold_in(base, shard_index + 1)))
            # when the data's stages began, for the learner's async/latency_s metrics
            acted = {"acted": time.time(), **({"params_published": published} if published is not None else {})}
            envs, traj = rollout(envs, on_devices, key, par.replicate(np.float32(explore)))
            segments, shard_index = _segments(par, traj, open_, lookahead), shard_index + 1
            if segments is None:
                continue
            write(segments, policy_step, acted)
            window = _say_progress(log, name, window, policy_step, acting.describe(explore), total)
        while writers.in_flight:  # every shard handed to a writer is in the store before we return
            writers.receive()
    finally:
        writers.close()
    return total


def _say_waiting(log, name: str, run_dir: Path, since: float) -> None:
    """Every WAITING_LOG_S, that the collector still waits for the learner's first params."""
    if time.monotonic() - since > WAITING_LOG_S and log.due("waiting", WAITING_LOG_S):
        log.print(f"collector {name}: still waiting for the learner's first params in {run_dir / POLICY} "
                  f"({time.monotonic() - since:.0f}s); start one with --mode learn --run-dir {run_dir}, or collect "
                  f"at random meanwhile with --collect-before-checkpoint random")


def _say_progress(log, name: str, window: dict, policy_step: int, exploring: str, total: int) -> dict:
    """At most every COLLECTOR_LOG_S, once episodes ended, the collector's progress line from
    `window` (what it wrote since the last line); returns the window to count on in."""
    if not (window["episodes"] and log.due("shards", COLLECTOR_LOG_S)):
        return window
    log.print(f"collector {name}: {window['shards']} shard(s), {window['episodes']} episodes since the last line, "
              f"mean return {window['return_sum'] / window['episodes']:.1f}, policy step {policy_step}, "
              f"{exploring}, {total:,} env steps in all")
    return dict.fromkeys(window, 0)


def _follow(cfg, acting: Acting, follower: ParamsFollower, params, policy_step, explore, published):
    """The newest published params (or the ones held, if none is newer), the learner's iteration
    that produced them, the exploration of the env steps it had received then (DQN's epsilon),
    and when they were published (wall clock). Before the first publication: wait (params None),
    or act uniformly at random (`--collect-before-checkpoint random`: policy step -1, published
    None)."""
    newer = follower.newer()
    if newer is not None:
        params, policy_step, received, published = newer
        return params, policy_step, float(acting.explore(cfg, received)), published
    if params is None:
        if cfg.collect_before_checkpoint == "random":
            return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), follower.template), -1, acting.at_random, None
        time.sleep(0.5)
    return params, policy_step, explore, published


def _latencies(shard, taken: float) -> dict[str, float]:
    """A new shard's seconds in each stage of STAGES up to `taken` (the learner's wall clock
    when it took the shard), those its metadata records (no params: random collection)."""
    meta, out = shard.meta, {}
    if "params_published" in meta and "acted" in meta:
        out["params"] = meta["acted"] - meta["params_published"]
    if "acted" in meta:
        out["rollout"] = meta["created"] - meta["acted"]
    if shard.listed is not None:
        out["write"], out["read"] = shard.listed - meta["created"], taken - shard.listed
    return out


class Open(NamedTuple):
    """Where a rollout left an environment's episode: its steps not yet given as transitions
    (the lookahead, which starts the environment's next segment), and whether they start it."""
    steps: tuple  # (obs [k, ...], action [k], reward [k]), k <= the lookahead; () for none
    first: bool


FRESH = Open((), True)  # an environment whose next step starts an episode


def _segments(par: Parallel, traj, open_: dict[int, Open], lookahead: int) -> Segments | None:
    """This host's [T, envs] rollout as segments of episodes (None: no step is a transition
    yet): per environment, every episode that ended in it, whole from where the previous
    rollout left it, then the steps of its unfinished one, whose last `lookahead` steps (the
    learner's n-step windows need them: --n-step - 1) start its next segment again. Those, or
    all of an unfinished episode's steps if it has no more, carry over in `open_`. A few slices
    per environment, not per episode: a shard of random play holds thousands of episodes."""
    obs, action, reward, terminated, truncated, final_obs, done_return, done_length = (
        np.concatenate(list(x), axis=1) for x in par.local(traj))  # [T, envs on this host, ...]
    done = terminated | truncated
    T = obs.shape[0]
    steps, heads = [], []  # per segment: its steps (obs, action, reward); the rest of its fields

    def segment(column, start, stop, first, t, e, ended, ahead=0):
        """Steps start..stop of `column`, the last one rollout step t."""
        steps.append(tuple(x[start:stop] for x in column))
        heads.append((stop - start, first, ended, ended and bool(terminated[t, e]), ahead, final_obs[t, e],
                      done_return[t, e] if ended else 0.0, done_length[t, e] if ended else 0))

    for e in range(obs.shape[1]):
        was = open_.pop(e, FRESH)
        column = tuple(x[:, e] for x in (obs, action, reward))
        if was.steps:  # the steps it left come first
            column = tuple(np.concatenate(p) for p in zip(was.steps, column))
        before = len(column[0]) - T
        start, first = 0, was.first
        for t in np.flatnonzero(done[:, e]):
            segment(column, start, before + t + 1, first, t, e, ended=True)
            start, first = before + t + 1, True
        rest = len(column[0]) - start  # steps of its unfinished episode
        if rest > lookahead:
            segment(column, start, len(column[0]), first, T - 1, e, ended=False, ahead=lookahead)
            start, first = len(column[0]) - lookahead, False
        if start < len(column[0]):
            open_[e] = Open(tuple(np.array(x[start:]) for x in column), first)  # copies: the rollout is not kept
        elif not first:
            open_[e] = Open((), False)
    if not steps:
        return None
    obs, action, reward = (np.concatenate(x) for x in zip(*steps))
    length, first, ended, terminal, ahead, final, ret, ep_length = (np.array(x) for x in zip(*heads))
    # DQN's actions as int32, SAC's and TD3's vectors as float32
    action = action.astype(np.float32 if np.issubdtype(action.dtype, np.floating) else np.int32)
    return Segments(obs, action, reward.astype(np.float32), length, first, ended, terminal, ahead,
                    final, ret.astype(np.float32), ep_length)


def asynchronous(check: Callable, per_update: Callable, algorithm: Callable, acting: Acting) -> Asynchronous:
    """A replay algorithm's --mode learn|collect: its learner over `ReplaySource`, its collectors
    running `collect` with its `acting`."""
    return Asynchronous(check, per_update, algorithm, ReplaySource, functools.partial(collect, acting=acting),
                        lambda cfg: f"{cfg.num_envs} envs")
