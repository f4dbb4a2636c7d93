"""Algorithm Distillation (Laskin et al. 2022) for ONE device's slice of the work.

AD distills a reinforcement-learning ALGORITHM, not a policy: a causal transformer is trained
by plain supervised learning to predict a source learner's actions from the last `n_transit`
transitions of its learning history, ACROSS episode boundaries. Its context then shows the
source improving, and the model learns to improve within its context: on a new task, with
frozen weights, it explores and then exploits (`jaxrl_mgpu.incontext` measures that).

    load_data(cfg, par)   -> this device's learning histories, put on the device once
    init(key)             -> ADState       (params, optimizer state, key, counter: all replicated)
    update(state, data)   -> state, (losses, EpisodeStats of zeros: AD plays no episodes)

One update: every device samples `ad_batch_size / D` windows of `n_transit` consecutive steps
from ITS OWN tasks (`lax.dynamic_slice` into the device-resident histories, so no host input
pipeline in the hot loop; per-device randomness from `fold_in(key, device_index())`), and all
devices take one optimizer step on the cross-entropy between the model's action logits and the
source's actions at every position of every window (`learner.step`: gradients `pmean`-ed over
devices, `--grad-accum`, `--precision`). The critic head of the transformer is left untrained.

Tokens. `TransformerActorCritic` builds the token of step t from (o_t, a_{t-1}, r_{t-1}) and an
is-first flag, and zeroes a_{t-1}, r_{t-1} where is_first is set. AD sets the module's is_first
only at the first step of a whole learning history, where nothing precedes it. Were it set at
every episode start, the first token of each episode would drop the previous episode's last
action and reward, and that reward is part of what the model must learn from (in DarkRoomHard
the goal may be reached on an episode's last step, and pays only then). Episode starts are
marked in the observation instead, as one extra feature, so the model still knows where the
source's episodes begin: input observation = [o_t, episode_start_t].
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Share, Resolved
from jaxrl_mgpu.checkpoint import REPLICATED
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic, factory
from jaxrl_mgpu.nets.transformer import KVCache, TransformerActorCritic
from jaxrl_mgpu.parallel import device_index
from jaxrl_mgpu.cli import count

# Every field is identical on every device (see checkpoint.py); the dataset is not state.
STATE_LAYOUT = {"params": REPLICATED, "opt_state": REPLICATED, "loss_scale": REPLICATED, "key": REPLICATED,
                "update": REPLICATED}


def steps_per_update(cfg) -> int:
    return cfg.ad_batch_size * cfg.n_transit


class ADState(NamedTuple):
    params: Any
    opt_state: Any
    loss_scale: learner.LossScale
    key: jax.Array      # the same on every device; split once per update
    update: jax.Array   # updates done so far


class Steps(NamedTuple):
    """Learning histories as the model's inputs and targets, [tasks, steps] (one device's data)
    or [windows, n_transit] (a batch); steps are contiguous across episode boundaries."""
    obs: jax.Array          # [..., *obs_shape + 1] float32: the observation, then episode_start
    prev_action: jax.Array  # [...] int32: the previous step's action (0 at a history's start)
    prev_reward: jax.Array  # [...] float32: the previous step's reward (0 at a history's start)
    is_first: jax.Array     # [...] bool: the first step of a learning history (see the docstring)
    action: jax.Array       # [...] int32: the source's action, the target


class Memory(NamedTuple):
    """What the AD policy carries between steps, per environment: the rolling context."""
    cache: KVCache
    prev_action: jax.Array    # [n] int32
    prev_reward: jax.Array    # [n] float32
    is_first: jax.Array       # [n] bool: nothing acted yet (the start of the in-context history)
    episode_start: jax.Array  # [n] bool: the next observation starts an episode


class Algo(NamedTuple):
    init: Any         # key -> ADState
    update: Any       # ADState, Steps [tasks, steps] (, filled rows) -> ADState, (losses, EpisodeStats)
    init_params: Any  # key -> params (the same key gives the same params everywhere)
    policy: Any       # nets.actor_critic.Policy: the model acting with its KV cache as context
    sample: Any       # Steps [tasks, steps], key, windows -> Steps [windows, n_transit]
    learn: Any        # params, opt_state, loss_scale, Steps batch -> params, opt_state, loss_scale, stats


# -- the dataset ---------------------------------------------------------------------------

def open_dataset(cfg) -> dict:
    """The dataset's metadata, after checking that it exists, holds `--env`'s histories and that
    its shard files match their checksums; a one-line ConfigError otherwise. Runs before the
    run directory is created, so bad input writes nothing."""
    if not cfg.dataset:
        raise ConfigError("--algo ad needs --dataset DIR: learning histories written by "
                          "python -m jaxrl_mgpu.histories")
    try:
        meta = rlds.info(cfg.dataset)
        if meta.get("env") != cfg.env:
            raise ConfigError(f"--dataset {cfg.dataset} holds learning histories of {meta.get('env')!r}, "
                              f"not of --env {cfg.env!r}")
        if any(k not in meta for k in rlds.LAYOUT_KEYS):
            raise ConfigError(f"--dataset {cfg.dataset} has no layout metadata: not written by jaxrl_mgpu")
        rlds.verify(cfg.dataset)
    except rlds.DatasetError as e:  # train.py reports ConfigErrors as one line, exit code 2
        raise ConfigError(f"--dataset: {e}") from None
    return meta


def prepare(h: rlds.Histories, stride: int = 1) -> Steps:
    """Host arrays [tasks, steps] of the model's inputs and targets from whole learning
    histories. `stride` k > 1 keeps every k-th episode (the kept episodes become consecutive,
    so the context shows k times faster learning); tasks are cut to the shortest result."""
    obs, action, reward = h.observation.astype(np.float32), h.action.astype(np.int32), h.reward.astype(np.float32)
    start = np.concatenate([np.ones_like(h.done[:, :1]), h.done[:, :-1]], axis=1)  # episode starts
    if stride > 1:
        keep = (np.cumsum(start, axis=1) - 1) % stride == 0
        length = int(keep.sum(1).min())
        obs, action, reward, start = (np.stack([row[k][:length] for row, k in zip(x, keep)])
                                      for x in (obs, action, reward, start))
    previous = lambda x: np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)  # noqa: E731
    is_first = np.zeros(action.shape, bool)
    is_first[:, 0] = True
    return Steps(obs=np.concatenate([obs.reshape(obs.shape[:2] + (-1,)), start[..., None].astype(np.float32)], -1),
                 prev_action=previous(action), prev_reward=previous(reward), is_first=is_first, action=action)


def load_data(cfg, par) -> Steps:
    """This process's devices' shares of the tasks ([devices, tasks per device, steps, ...],
    global arrays, one slice per device), read once and kept on the devices. Device i of the
    axis trains on task block `data.shard(num_tasks, D, i)`: each process reads only its own."""
    mine = [i for i, d in enumerate(par.devices) if d.process_index == jax.process_index()]
    try:
        blocks = [rlds.shard(rlds.info(cfg.dataset)["num_tasks"], par.num_devices, i) for i in mine]
        h = rlds.read(cfg.dataset, env=cfg.env, tasks=[t for block in blocks for t in block])
    except rlds.DatasetError as e:
        raise ConfigError(f"--dataset: {e}") from None
    steps = prepare(h, cfg.ad_episode_stride)
    if steps.action.shape[1] < cfg.n_transit:
        raise ConfigError(f"--n-transit {cfg.n_transit} is longer than the {steps.action.shape[1]} steps of the "
                          f"learning histories (after --ad-episode-stride {cfg.ad_episode_stride})")
    by_device = lambda x: x.reshape((len(mine), len(blocks[0])) + x.shape[1:])  # noqa: E731
    return par.shard(jax.tree.map(by_device, steps))


# -- checks --------------------------------------------------------------------------------

def check_batch(run: Resolved, num_devices: int) -> BatchSplit:
    """The checks of the model and its batch over `num_devices` (no dataset: `--mode learn`
    fills its histories from the run's store, algos/ad/asynchronous.py); the batch layout, or a ConfigError."""
    cfg, env, env_params = run.cfg, run.env, run.env_params
    if cfg.num_updates is None:
        raise ConfigError("--algo ad trains for --num-updates gradient steps: give --num-updates")
    if cfg.n_transit > 2 ** 14:
        raise ConfigError(f"--n-transit {cfg.n_transit} is above the transformer's limit of {2 ** 14}")
    if not isinstance(actor_critic.distribution(env, env_params), actor_critic.Categorical):
        raise ConfigError(f"--algo ad predicts discrete actions (a softmax over them); --env {cfg.env} has "
                          f"continuous (Box) actions: use --algo ppo")
    if len(env.observation_space(env_params).shape) != 1:
        raise ConfigError(f"--algo ad needs vector observations; --env {cfg.env} has shape "
                          f"{env.observation_space(env_params).shape}")
    if cfg.ad_batch_size % num_devices:
        raise ConfigError(f"--ad-batch-size {cfg.ad_batch_size} is not divisible by {count(num_devices, 'device')}; "
                          f"use a multiple of {num_devices}")
    per_device = cfg.ad_batch_size // num_devices
    if per_device % cfg.grad_accum:
        raise ConfigError(f"--grad-accum {cfg.grad_accum} does not divide the {per_device} windows per device")
    return BatchSplit(num_devices, windows=Share(cfg.ad_batch_size, per_device))


def check(run: Resolved, num_devices: int) -> BatchSplit:
    """The batch layout over `num_devices` and, for --mode both, a checked dataset; or a
    ConfigError. (A --mode learn run's histories are its store's: asynchronous.py.)"""
    cfg = run.cfg
    layout = check_batch(run, num_devices)
    if cfg.mode != "both":
        return layout
    meta = open_dataset(cfg)
    tasks, steps = meta["num_tasks"], meta["steps_per_task"]
    if tasks < num_devices:
        raise ConfigError(f"--dataset {cfg.dataset} has {tasks} learning histories, fewer than the {num_devices} "
                          f"devices: every device trains on tasks of its own")
    if cfg.n_transit > steps // cfg.ad_episode_stride:
        raise ConfigError(f"--n-transit {cfg.n_transit} is longer than the learning histories ({steps} steps, "
                          f"every {cfg.ad_episode_stride}-th episode kept: --ad-episode-stride)")
    return dataclasses.replace(layout, tasks=Share(tasks // num_devices * num_devices, tasks // num_devices))


# -- the algorithm ---------------------------------------------------------------------------

def sample(data: Steps, key: jax.Array, windows: int, length: int, filled: jax.Array | None = None) -> Steps:
    """`windows` windows of `length` consecutive steps, each from a uniformly drawn task and
    start (a window may span several episodes, and starts at the history's beginning with the
    same chance as anywhere else). `filled` (traced; default: all rows): draw tasks only from
    the first `filled` rows, the filled slots of a fixed-capacity buffer that grows
    (`--mode learn`, algos/ad/asynchronous.py), so its shape, hence the compiled update, never changes."""
    tasks, steps = data.action.shape
    task_key, start_key = jax.random.split(key)
    task = jax.random.randint(task_key, (windows,), 0, tasks if filled is None else filled)
    start = jax.random.randint(start_key, (windows,), 0, steps - length + 1)

    def window(t, s):
        return jax.tree.map(lambda x: jax.lax.dynamic_slice(x, (t, s) + (0,) * (x.ndim - 2),
                                                            (1, length) + x.shape[2:])[0], data)
    return jax.vmap(window)(task, start)


def make_net(cfg, env, env_params) -> TransformerActorCritic:
    return factory.transformer(cfg, env.num_actions, 1, context_len=cfg.n_transit, across_episodes=True)


def make_policy(net: TransformerActorCritic, obs_size: int) -> actor_critic.Policy:
    """The model as an actor-critic Policy: it acts one step at a time on its KV cache (the last
    n_transit steps of every layer), the rolling context of in-context learning. `final_obs` is
    not used (bootstrap values are zeros: AD is never trained on values)."""
    def with_flag(obs, episode_start):
        return jnp.concatenate([obs.reshape(obs.shape[0], -1), episode_start[:, None].astype(obs.dtype)], -1)

    def init_params(key):
        one = lambda shape, dt: jnp.zeros((1, 1) + shape, dt)  # noqa: E731
        return net.init(key, None, one((obs_size + 1,), jnp.float32), one((), jnp.int32), one((), jnp.float32),
                        jnp.ones((1, 1), bool))

    def init_memory(n):
        return Memory(net.init_cache(n), jnp.zeros(n, jnp.int32), jnp.zeros(n), jnp.ones(n, bool), jnp.ones(n, bool))

    def act(params, memory, obs, final_obs):
        logits, value, cache = net.apply(params, memory.cache, *inputs(memory, obs), method=net.step)
        return logits, value, jnp.zeros_like(value), memory._replace(cache=cache)

    def remember(memory, action, reward, done):
        return Memory(memory.cache, action.astype(jnp.int32), reward.astype(jnp.float32),
                      jnp.zeros_like(memory.is_first), done)

    def inputs(memory, obs):
        return (with_flag(obs, memory.episode_start), memory.prev_action, memory.prev_reward, memory.is_first)

    def evaluate(params, memory0, inputs):
        logits, values, _ = net.apply(params, memory0.cache, *inputs)
        return logits, values

    return actor_critic.Policy(init_params, init_memory, act, remember, inputs, evaluate, sequences=True)


def in_context_policy(cfg, env, env_params) -> actor_critic.Policy:
    """The transformer that acts in context (the spec's `policy`)."""
    return make_policy(make_net(cfg, env, env_params), int(np.prod(env.observation_space(env_params).shape)))


def make(cfg, env, env_params, split: BatchSplit) -> Algo:
    net = make_net(cfg, env, env_params)
    policy = make_policy(net, int(np.prod(env.observation_space(env_params).shape)))
    tx = learner.adam(cfg, cfg.total_updates)  # one optimizer step per update
    windows = split.windows.per_device

    def init(key: jax.Array) -> ADState:
        params_key, key = jax.random.split(key)
        params = policy.init_params(params_key)
        return ADState(params, tx.init(params), learner.LossScale.init(cfg.precision), key, jnp.zeros((), jnp.int32))

    def loss_fn(params, batch: Steps):
        # cache=None: each window is its own context (causal within the window).
        logits, _, _ = net.apply(params, None, batch.obs, batch.prev_action, batch.prev_reward, batch.is_first)
        log_probs = jax.nn.log_softmax(logits)
        cross_entropy = -actor_critic.log_prob(logits, batch.action).mean()
        stats = {"loss/total": cross_entropy, "loss/cross_entropy": cross_entropy,
                 "loss/accuracy": (jnp.argmax(logits, -1) == batch.action).mean(),
                 "loss/entropy": -(jnp.exp(log_probs) * log_probs).sum(-1).mean()}
        return cross_entropy, stats

    def learn(params, opt_state, loss_scale, batch: Steps):
        """One optimizer step on this device's windows; with the all-reduce in learner.step it is
        the step of the global batch (every device's share has the same size)."""
        return learner.step(loss_fn, tx, params, opt_state, loss_scale, batch, cfg.grad_accum, cfg.precision)

    def update(state: ADState, data: Steps, filled: jax.Array | None = None):
        key, sample_key = jax.random.split(state.key)
        batch = sample(data, jax.random.fold_in(sample_key, device_index()), windows, cfg.n_transit, filled)
        params, opt_state, loss_scale, losses = learn(state.params, state.opt_state, state.loss_scale, batch)
        no_episodes = vec.EpisodeStats(*(jnp.zeros((), jnp.float32),) * 3)
        return ADState(params, opt_state, loss_scale, key, state.update + 1), (losses, no_episodes)

    return Algo(init, update, policy.init_params, policy,
                lambda data, key, n: sample(data, key, n, cfg.n_transit), learn)


def algorithm(run: Resolved) -> Algorithm[Algo]:
    """AD trains from a dataset of learning histories, loaded once onto the devices (this
    device's share of the tasks) and read by every update."""
    algo = make(run.cfg, run.env, run.env_params, run.split)
    return Algorithm(algo.init, algo.update, STATE_LAYOUT, algo.policy,
                     data=(load_data(run.cfg, run.par),), parts=algo, episodic=False)


def policy(run: Resolved) -> actor_critic.Policy:
    return in_context_policy(run.cfg, run.env, run.env_params)


STEP_UNIT = "tokens"  # AD's progress: the transitions the model is trained on, not env steps
