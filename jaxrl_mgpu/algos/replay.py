"""The replay and its n-step targets: the one module DQN (algos/dqn/dqn.py, and its asynchronous
learner, algos/dqn/asynchronous.py) and SAC and TD3 (algos/sac/sac.py) take them from.

Two layouts of one device's transitions:
- `Replay` (--mode both): a ring buffer of fixed-size arrays inside the training state (so it
  is checkpointed with it and a resume is exact), laid out [envs, rows]: environment e's
  transitions are a time-ordered ring of rows, one per vectorised step, so the n steps after a
  sampled transition are the next rows of the same environment. Row `written % rows` is
  written next, where `written` counts the vector steps taken so far. Stacked over devices,
  the rings are exactly the buffer one device would hold, which is why the checkpoint treats
  the buffer like the environment states (PER_ENV) and restores it on any device count.
- `TransitionRing` (--mode learn): a flat ring of n-step transitions, filled from the store's
  segments of episodes (`segment_transitions`, in the learner's reader processes) and sampled
  uniformly. It is not checkpointed: a restarted learner refills it from the store.
Observations are stored as float32, or as bytes (`--replay-obs-dtype uint8`, for observations
of whole numbers in 0..255) and turned back into float32 where sampled (`as_input`).

Targets (n-step): for a transition (s_t, a_t), the discounted sum of the rewards of steps
t..t+k, where k < n is the first step whose episode ended (or n - 1); the bootstrap discount
gamma^(k+1), or 0 where step t+k terminated the episode (a time limit bootstraps); and s', the
observation after step t+k before any auto-reset (`vec.Step.final_obs`). `n_step_targets`
computes them from windows of n steps, for both layouts: the replay gathers its windows when
it samples, the learner's segments when they are decoded.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_mgpu.algos.base import BatchSplit, Share
from jaxrl_mgpu.cli import ConfigError, count
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.parallel import ParallelError, split_evenly


class Replay(NamedTuple):
    """One device's ring buffers: [envs per device, rows], one row per vectorised step."""
    obs: jax.Array         # [E, R, *obs_shape]  observation acted on
    action: jax.Array      # [E, R] int32 (DQN), or [E, R, D] float32 (SAC, TD3)
    reward: jax.Array      # [E, R] float32
    terminated: jax.Array  # [E, R] bool: true end, no bootstrap
    truncated: jax.Array   # [E, R] bool: time limit, bootstrap from next_obs
    next_obs: jax.Array    # [E, R, *obs_shape]  observation after the step, before any auto-reset


class Transitions(NamedTuple):
    """n-step transitions: what the learner's ring holds (host or device arrays), and a sampled
    batch ready for the loss (observations as float32)."""
    obs: jax.Array       # [B, *obs_shape]
    action: jax.Array    # [B]
    reward: jax.Array    # [B] discounted reward sum over the (at most n) steps
    discount: jax.Array  # [B] gamma^(k+1) where the target bootstraps, 0 where the episode terminated
    next_obs: jax.Array  # [B, *obs_shape] the observation to bootstrap from


class TransitionRing(NamedTuple):
    """One device's flat ring of n-step transitions [capacity, ...]; row `written % capacity`
    is written next, where `written` counts the transitions inserted so far."""
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    discount: jax.Array
    next_obs: jax.Array
    written: jax.Array


class Window(NamedTuple):
    """Tokens of consecutive steps of one environment, for a sequence model [B, W, ...]."""
    obs: jax.Array
    prev_action: jax.Array
    prev_reward: jax.Array
    is_first: jax.Array
    valid: jax.Array


class SeqBatch(NamedTuple):
    """n-step transitions with their histories: Q(s_t) is read at the last token of `online`,
    the bootstrap value at the last token of `target` (which ends with s', the observation
    after the last step used, before any reset)."""
    online: Window
    target: Window
    action: jax.Array
    reward: jax.Array
    discount: jax.Array


def as_input(obs: jax.Array) -> jax.Array:
    """Stored observations (float32 or uint8) as the network reads them."""
    return obs.astype(jnp.float32)


# -- the targets -------------------------------------------------------------------------

def n_step_targets(reward: jax.Array, terminated: jax.Array, ended: jax.Array, gamma: float):
    """For windows [B, n] of n consecutive steps from each transition's own (`ended`: its
    episode, or the data, ends at that step; `terminated`: for real, no bootstrap): the
    discounted reward sum, the bootstrap discount and k, the index of the last step used."""
    n_step = reward.shape[1]
    ended = ended.astype(jnp.float32)
    # step i counts while no earlier step of the window ended its episode
    alive = jnp.concatenate([jnp.ones_like(ended[:, :1]), jnp.cumprod(1.0 - ended[:, :-1], axis=1)], axis=1)
    powers = gamma ** jnp.arange(n_step, dtype=jnp.float32)
    last = alive.sum(1).astype(jnp.int32) - 1
    last_term = jnp.take_along_axis(terminated, last[:, None], 1)[:, 0]
    discount = gamma ** (last + 1).astype(jnp.float32) * (1.0 - last_term.astype(jnp.float32))
    return (alive * powers * reward).sum(1), discount, last


def n_step_return(replay: Replay, env: jax.Array, row: jax.Array, n_step: int, gamma: float):
    """`n_step_targets` of the windows starting at (env, row) of the replay."""
    idx = (row[:, None] + jnp.arange(n_step)) % replay.reward.shape[1]     # [B, n]
    col = env[:, None]
    term = replay.terminated[col, idx]
    return n_step_targets(replay.reward[col, idx], term, term | replay.truncated[col, idx], gamma)


@functools.partial(jax.jit, static_argnames=("n_step", "gamma"))
def _steps_targets(reward: jax.Array, terminated: jax.Array, cut: jax.Array, n_step: int, gamma: float):
    """`n_step_targets` of the window from every step of steps laid end to end, where `cut`
    marks the last step of each segment (windows never reach past it)."""
    idx = jnp.minimum(jnp.arange(reward.shape[0])[:, None] + jnp.arange(n_step), reward.shape[0] - 1)
    return n_step_targets(reward[idx], terminated[idx], cut[idx], gamma)


def segment_transitions(obs: np.ndarray, action: np.ndarray, reward: np.ndarray, terminal: np.ndarray,
                        length: np.ndarray, lookahead: np.ndarray, final_obs: np.ndarray, n_step: int,
                        gamma: float) -> Transitions:
    """Segments of episodes laid end to end (host arrays: the steps' `obs`, `action`, `reward`
    and `terminal` flags; each segment's `length`, `lookahead` and `final_obs`, the observation
    after its last step) as the n-step transitions of their steps but each segment's last
    `lookahead` ones (those only complete the windows of the steps before them). A window ends
    at its segment's end, which bootstraps from `final_obs` unless the step terminated. The
    targets are computed on this host's CPU, with the number of steps padded to a power of two
    so that few shapes compile."""
    steps = len(reward)
    ends = np.cumsum(length) - 1
    cut = np.zeros(steps, bool)
    cut[ends] = True
    size = max(256, 1 << (steps - 1).bit_length())
    pad = lambda x, fill: np.concatenate([x, np.full(size - steps, fill, x.dtype)])  # noqa: E731
    cpu = jax.local_devices(backend="cpu")[0]
    padded = (pad(reward.astype(np.float32), 0), pad(terminal.astype(bool), False), pad(cut, True))
    total, discount, last = (np.asarray(x)[:steps] for x in _steps_targets(
        *jax.device_put(padded, cpu), n_step=n_step, gamma=float(gamma)))
    # The observation after each step: the next step's, or its segment's final one.
    next_obs = np.empty_like(obs)
    next_obs[:-1] = obs[1:]
    next_obs[ends] = final_obs
    index = np.arange(steps)
    keep = index <= np.repeat(ends - lookahead, length)
    return Transitions(obs[keep], action[keep], total[keep], discount[keep], next_obs[(index + last)[keep]])


# -- --mode both's replay: rings per environment -----------------------------------------

def replay_init(envs: int, rows: int, obs_shape: tuple, obs_dtype=jnp.float32, action_shape: tuple = (),
                action_dtype=jnp.int32) -> Replay:
    """Empty rings; actions are DQN's discrete ones by default (SAC's and TD3's: float vectors)."""
    z = lambda *shape, dtype=jnp.float32: jnp.zeros((envs, rows) + shape, dtype)  # noqa: E731
    return Replay(z(*obs_shape, dtype=obs_dtype), z(*action_shape, dtype=action_dtype), z(), z(dtype=bool),
                  z(dtype=bool), z(*obs_shape, dtype=obs_dtype))


def replay_add(replay: Replay, written: jax.Array, obs, action, out: vec.Step) -> Replay:
    """Writes one vector step (all of this device's envs) as row `written % rows`."""
    row = written % replay.reward.shape[1]
    put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), row, 1)  # noqa: E731
    return Replay(put(replay.obs, obs), put(replay.action, action), put(replay.reward, out.reward),
                  put(replay.terminated, out.terminated), put(replay.truncated, out.truncated),
                  put(replay.next_obs, out.final_obs))


def replay_gather(replay: Replay, env: jax.Array, row: jax.Array, n_step: int, gamma: float) -> Transitions:
    """n-step transitions starting at (env, row); rows row..row+n-1 (mod rows) must be filled."""
    reward, discount, last = n_step_return(replay, env, row, n_step, gamma)
    last_row = (row + last) % replay.reward.shape[1]
    return Transitions(as_input(replay.obs[env, row]), replay.action[env, row], reward, discount,
                       as_input(replay.next_obs[env, last_row]))


def replay_window(replay: Replay, written: jax.Array, env: jax.Array, end: jax.Array, length: int) -> Window:
    """The `length` steps of `env` ending at absolute vector step `end` (inclusive). A step is
    valid while the ring still holds it; the previous action and reward come from the step
    before, and a step starts an episode where the one before ended (or is not held)."""
    rows = replay.reward.shape[1]
    oldest = written - jnp.minimum(written, rows)
    steps = end[:, None] - (length - 1) + jnp.arange(length)      # [B, length] absolute steps
    row, prev = steps % rows, (steps - 1) % rows
    col = env[:, None]
    prev_done = replay.terminated[col, prev] | replay.truncated[col, prev]
    return Window(as_input(replay.obs[col, row]), replay.action[col, prev], replay.reward[col, prev],
                  (steps - 1 < oldest) | prev_done, steps >= oldest)


def replay_sample(replay: Replay, written: jax.Array, key: jax.Array, batch_size: int, n_step: int,
                  gamma: float, context: int = 0) -> Transitions | SeqBatch:
    """Uniform over the stored transitions whose n-step window is complete (needs
    `written >= n_step`): the oldest `min(written, rows) - n_step + 1` rows of every env. With
    `context` > 0 (a sequence model), each comes with the `context` steps up to s_t and up to s'."""
    envs, rows = replay.reward.shape
    filled = jnp.minimum(written, rows)
    env_key, row_key = jax.random.split(key)
    env = jax.random.randint(env_key, (batch_size,), 0, envs)
    age = jax.random.randint(row_key, (batch_size,), 0, filled - n_step + 1)  # 0 = the oldest row
    start = written - filled + age                                            # absolute step of s_t
    if not context:
        return replay_gather(replay, env, start % rows, n_step, gamma)
    reward, discount, last = n_step_return(replay, env, start % rows, n_step, gamma)
    end = start + last                                   # the last step used; s' follows it
    col, end_row = env[:, None], (end % rows)[:, None]
    final = Window(as_input(replay.next_obs[col, end_row]), replay.action[col, end_row], replay.reward[col, end_row],
                   jnp.zeros((batch_size, 1), bool), jnp.ones((batch_size, 1), bool))
    history = replay_window(replay, written, env, end, context - 1)
    target = jax.tree.map(lambda h, f: jnp.concatenate([h, f], axis=1), history, final)
    return SeqBatch(replay_window(replay, written, env, start, context), target,
                    replay.action[env, start % rows], reward, discount)


# -- the asynchronous learner's replay: one flat ring of n-step transitions ----------------

def ring_init(capacity: int, obs_shape: tuple, obs_dtype=jnp.float32, action_shape: tuple = (),
              action_dtype=jnp.int32) -> TransitionRing:
    """An empty ring; actions as replay_init's (DQN's discrete ones by default)."""
    z = lambda *shape, dtype=jnp.float32: jnp.zeros((capacity,) + shape, dtype)  # noqa: E731
    return TransitionRing(z(*obs_shape, dtype=obs_dtype), z(*action_shape, dtype=action_dtype), z(), z(),
                          z(*obs_shape, dtype=obs_dtype), jnp.zeros((), jnp.int32))


def ring_insert(ring: TransitionRing, block: Transitions) -> TransitionRing:
    """Writes a block of transitions over the oldest rows (each block size compiles once)."""
    rows = (ring.written + jnp.arange(block.reward.shape[0])) % ring.reward.shape[0]
    put = lambda buf, x: buf.at[rows].set(x.astype(buf.dtype))  # noqa: E731
    return TransitionRing(*(put(b, x) for b, x in zip(ring[:5], block)), ring.written + block.reward.shape[0])


def ring_sample(ring: TransitionRing, key: jax.Array, batch_size: int) -> Transitions:
    """Uniform over the transitions the ring holds."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.minimum(ring.written, ring.reward.shape[0]))
    return Transitions(as_input(ring.obs[idx]), ring.action[idx], ring.reward[idx], ring.discount[idx],
                       as_input(ring.next_obs[idx]))

# -- the schedule of a learner that samples per-environment replays (DQN, SAC, TD3) ----------

def steady_state(cfg):
    """`cfg` as a throughput probe times it (auto-scale, bench): learning from its first update,
    since before --learning-starts an update only collects and is several times faster."""
    return dataclasses.replace(cfg, learning_starts=0)


def steps_per_update(cfg) -> int:
    return cfg.batch_size  # num_envs x num_steps


def _divide(total: int, parts: int, what: str) -> int:
    try:
        return split_evenly(total, parts, what)
    except ParallelError as e:
        raise ConfigError(str(e)) from None


def grad_steps_per_update(cfg) -> int:
    return int(round(cfg.num_steps * cfg.updates_per_step))


def replay_split(cfg, num_devices: int, who: str = "--algo dqn") -> BatchSplit:
    """The batch over `num_devices` of an algorithm that learns from per-environment replays
    (DQN, SAC, TD3), or a ConfigError naming the option that breaks it."""
    grads = cfg.num_steps * cfg.updates_per_step
    if abs(grads - round(grads)) > 1e-6:
        raise ConfigError(f"--updates-per-step {cfg.updates_per_step} x --num-steps {cfg.num_steps} must be a "
                          f"positive whole number of gradient steps per update")
    envs_per_device = _divide(cfg.num_envs, num_devices, "--num-envs")
    _divide(cfg.buffer_size, num_devices, "--buffer-size")
    batch_per_device = _divide(cfg.replay_batch_size, num_devices, "--replay-batch-size")
    if batch_per_device % cfg.grad_accum:
        raise ConfigError(f"--grad-accum {cfg.grad_accum} does not divide the per-device replay batch of "
                          f"{batch_per_device} (--replay-batch-size {cfg.replay_batch_size} / {count(num_devices, 'device')})")
    if cfg.buffer_size % cfg.num_envs:
        raise ConfigError(f"--buffer-size {cfg.buffer_size} is not a multiple of --num-envs {cfg.num_envs} "
                          f"(the buffer holds buffer-size / num-envs steps of every environment)")
    if cfg.buffer_size // cfg.num_envs < cfg.n_step:
        raise ConfigError(f"--buffer-size {cfg.buffer_size} holds fewer than --n-step {cfg.n_step} steps of each "
                          f"of the {cfg.num_envs} environments")
    if cfg.learning_starts >= cfg.total_timesteps:
        raise ConfigError(f"--learning-starts {cfg.learning_starts} is not below --total-timesteps "
                          f"{cfg.total_timesteps}: no gradient step of {who} would run")
    return BatchSplit(num_devices, environments=Share(cfg.num_envs, envs_per_device),
                      minibatch=Share(cfg.replay_batch_size, batch_per_device),
                      replay=Share(cfg.buffer_size, cfg.buffer_size // num_devices))


def first_learning_update(cfg) -> int:
    """Index of the first update that does gradient steps (its data reaches learning_starts)."""
    return max(math.ceil(cfg.learning_starts / cfg.batch_size) - 1, 0)


def gradient_steps(cfg) -> int:
    """Gradient steps over the whole run (the learning-rate schedule's length)."""
    return max((cfg.total_updates - first_learning_update(cfg)) * grad_steps_per_update(cfg), 1)


def target_update(cfg, params, target_params, step):
    """The target network after gradient step `step`: with --tau < 1 Polyak-averaged towards
    `params`, with --tau 1 a copy of them every --target-update-every steps (DQN, SAC, TD3)."""
    if cfg.tau < 1.0:
        return optax.incremental_update(params, target_params, cfg.tau)
    return optax.periodic_update(params, target_params, step, cfg.target_update_every)


# What --auto-scale leaves of the replay algorithms (DQN, SAC, TD3): an update's gradient steps
# are --num-steps x --updates-per-step whatever the environments, so more of them learn less
# per env step (docs/auto-scale.md).
AUTO_SCALE_KEEPS = ("--replay-batch-size and gradient steps per update as configured, so gradient steps per env "
                    "step fall as environments grow")


# -- a frame-stack-aware replay (Atari): each frame stored once ----------------------------

class FrameReplay(NamedTuple):
    """One device's rings of stacked-frame observations ([S, H, W], the newest frame last, a new
    game's stack padded with zero frames: ale-py's) stored a frame per row: row t keeps the
    newest frame of the observation acted on, and how many of its stack's frames come before the
    zero padding (`valid`); the stack is rebuilt from rows t-S+1..t when sampled. It holds what
    `Replay` holds, in 1 / (2 S) of its frame bytes, for environments whose observation after a
    step is the next one acted on (envs/atari.py: `final_obs` is the observation stepped to), so
    s' is rebuilt from the next row too."""
    frames: jax.Array      # [E, R, H, W] the newest frame of the observation acted on
    valid: jax.Array       # [E, R] int32: frames of that stack before its zero padding (1..S)
    action: jax.Array      # [E, R] int32
    reward: jax.Array      # [E, R] float32
    terminated: jax.Array  # [E, R] bool
    truncated: jax.Array   # [E, R] bool


def frame_replay_init(envs: int, rows: int, obs_shape: tuple) -> FrameReplay:
    z = lambda *shape, dtype=jnp.float32: jnp.zeros((envs, rows) + shape, dtype)  # noqa: E731
    return FrameReplay(z(*obs_shape[1:], dtype=jnp.uint8), z(dtype=jnp.int32), z(dtype=jnp.int32), z(),
                       z(dtype=bool), z(dtype=bool))


def frame_replay_add(replay: FrameReplay, written: jax.Array, obs, action, out: vec.Step) -> FrameReplay:
    """Writes one vector step as row `written % rows`. The stack's valid frames are those its
    frames below the newest continue from the rows before (a shifted stack), up to the first
    that does not (a new game's zero padding): where a padding frame equals the frame before it
    (both black), the rebuilt stack is the same either way."""
    rows = replay.reward.shape[1]
    row = written % rows
    stack = obs.shape[1]
    valid = jnp.ones(obs.shape[0], jnp.int32)
    going = jnp.ones(obs.shape[0], bool)
    for j in range(1, stack):   # does frame S-1-j of the stack equal the newest frame of row t-j?
        before = jax.lax.dynamic_index_in_dim(replay.frames, (written - j) % rows, 1, keepdims=False)
        going = going & (written - j >= 0) & (obs[:, stack - 1 - j] == before).all((-2, -1))
        valid = valid + going
    put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x.astype(buf.dtype), row, 1)  # noqa: E731
    return FrameReplay(put(replay.frames, obs[:, -1]), put(replay.valid, valid), put(replay.action, action),
                       put(replay.reward, out.reward), put(replay.terminated, out.terminated),
                       put(replay.truncated, out.truncated))


def frame_stack(replay: FrameReplay, env: jax.Array, step: jax.Array, stack: int) -> jax.Array:
    """The stacked observations [B, S, H, W] of absolute vector steps `step` of `env`."""
    rows = replay.reward.shape[1]
    back = jnp.arange(stack - 1, -1, -1)                                # S-1 .. 0 rows back
    frames = replay.frames[env[:, None], (step[:, None] - back) % rows]    # [B, S, H, W]
    kept = back[None] < replay.valid[env, step % rows][:, None]          # the zero padding before the valid ones
    return jnp.where(kept[..., None, None], frames, 0)


def frame_replay_sample(replay: FrameReplay, written: jax.Array, key: jax.Array, batch_size: int, n_step: int,
                        gamma: float, stack: int) -> Transitions:
    """Uniform over the transitions whose stack, n-step window and s' the rings hold: s_t's
    S - 1 rows before it still held, and s' (the observation after the window's last step) the
    next row's. Needs `written >= n_step + stack`."""
    envs, rows = replay.reward.shape
    filled = jnp.minimum(written, rows)
    env_key, row_key = jax.random.split(key)
    env = jax.random.randint(env_key, (batch_size,), 0, envs)
    age = jax.random.randint(row_key, (batch_size,), 0, filled - n_step - stack + 1)
    start = written - filled + stack - 1 + age                           # absolute step of s_t
    reward, discount, last = n_step_return(replay, env, start % rows, n_step, gamma)
    return Transitions(as_input(frame_stack(replay, env, start, stack)), replay.action[env, start % rows], reward,
                       discount, as_input(frame_stack(replay, env, start + last + 1, stack)))
