"""Batches of environments on one device, with per-environment random streams and episode
statistics.

Multi-agent environments (envs.is_multi_agent: an agent axis inside one environment) have
rewards and episode returns `[E, agents]` and one episode end (and length) per environment.

Each environment's randomness at every step is `fold_in(step_key, global_env_index)`, where
`step_key` is the same on every device. So a rollout depends only on the seed and the global
number of environments, never on how many devices share them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from gymnax.environments import environment
from jax import lax

from jaxrl_mgpu.envs.registry import EnvError, check_episode_metrics, episode_metrics, is_multi_agent, traits
from jaxrl_mgpu.parallel import all_sum


# An environment with `heavy_reset = True` resets its ended episodes in batches of this fraction
# of its environments (step_resetting_ended): 1/16, as the Craftax baselines' optimistic resets.
RESET_BATCH_FRACTION = 16


class EnvBatch(NamedTuple):
    """The carried state of this device's environments."""
    state: Any                   # gymnax env states, leading axis E
    obs: jax.Array               # [E, *obs_shape] observation to act on
    episode_return: jax.Array    # [E] (multi-agent: [E, agents]) return so far of the running episode
    episode_length: jax.Array    # [E] steps so far of the running episode


class Step(NamedTuple):
    """What one step of all environments produced."""
    reward: jax.Array            # [E] (multi-agent: [E, agents])
    terminated: jax.Array        # [E] bool: true end, no bootstrap
    truncated: jax.Array         # [E] bool: time limit, bootstrap from final_obs
    final_obs: jax.Array         # [E, ...] observation before the auto-reset
    done_return: jax.Array       # [E] ([E, agents]) return of the episode that ended here (0 where none)
    done_length: jax.Array       # [E] its length
    info: dict                   # the env's info, minus the final observation
    episode_metrics: dict        # name -> [E]: the env's episode metrics where an episode ended here, else 0


def env_keys(key: jax.Array, global_ids: jax.Array) -> jax.Array:
    """One key per environment, from its global index."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, global_ids)


def as_obs(x: jax.Array) -> jax.Array:
    """Observations as the policy reads them: float32, except frames of bytes (Atari's), kept
    so: a quarter of the memory, and the network scales them."""
    return x if x.dtype == jnp.uint8 else x.astype(jnp.float32)


def reset(env, env_params, key: jax.Array, global_ids: jax.Array) -> EnvBatch:
    if traits(env).host_batched:
        obs, state = env.reset_batch(key, env_keys(key, global_ids), global_ids, env_params)
    else:
        obs, state = jax.vmap(env.reset, (0, None))(env_keys(key, global_ids), env_params)
    zeros = jnp.zeros(global_ids.shape, jnp.float32)
    returns = jnp.zeros(global_ids.shape + (env.num_agents,)) if is_multi_agent(env) else zeros
    return EnvBatch(state, as_obs(obs), returns, zeros.astype(jnp.int32))


def step(env, env_params, batch: EnvBatch, action: jax.Array, keys: jax.Array) -> tuple[EnvBatch, Step]:
    """One step of the batch. A host-batched environment (Traits.host_batched: envs/atari.py)
    steps the whole batch with `step_batch(keys, state, action, params)` (and resets it with
    `reset_batch(key, keys, ids, params)`); its info may hold `game_score` (what the logged
    return sums, where learning sees another reward), `episode_end` (where the logged episode
    ends, where that is not every termination) and `restarted` (games begun anew)."""
    if traits(env).host_batched:
        obs, state, reward, terminated, truncated, info = env.step_batch(keys, batch.state, action, env_params)
    elif traits(env).heavy_reset:
        obs, state, reward, terminated, truncated, info = step_resetting_ended(env, env_params, batch.state, action,
                                                                               keys)
    else:
        obs, state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
            keys, batch.state, action, env_params)
    return stepped(env, batch, obs, state, reward, terminated, truncated, info)


def stepped(env, batch: EnvBatch, obs, state, reward, terminated, truncated, info: dict) -> tuple[EnvBatch, Step]:
    """The batch after a step of its environments, and what the step produced, from what the
    environments returned (gymnax's step, batched)."""
    reward = reward.astype(jnp.float32)
    # the logged episode: the learners' (every termination or truncation), unless a host-batched
    # env says otherwise (Atari's: the whole game and its score, not the clipped reward); other
    # envs' info keeps whatever it holds (Craftax's episode metric "score")
    done, logged = jnp.logical_or(terminated, truncated), reward
    so_far, length_so_far = batch.episode_return, batch.episode_length
    if traits(env).host_batched:
        done, restarted = info.pop("episode_end", done), info.pop("restarted", None)
        logged = info.get("game_score", reward).astype(jnp.float32)
        if restarted is not None:  # games begun anew (a resumed run): their episodes start again
            so_far, length_so_far = jnp.where(restarted, 0.0, so_far), jnp.where(restarted, 0, length_so_far)
    agents_done = done.reshape(done.shape + (1,) * (reward.ndim - done.ndim))  # per agent, where there are agents
    ep_return = so_far + logged
    ep_length = length_so_far + 1
    new = EnvBatch(state, as_obs(obs), jnp.where(agents_done, 0.0, ep_return), jnp.where(done, 0, ep_length))
    # Envs that never truncate (the Tag games end at their time limit) give no final observation.
    final_obs = as_obs(info.pop("final_observation", obs))
    return new, Step(reward, terminated, jnp.logical_and(truncated, jnp.logical_not(terminated)), final_obs,
                     jnp.where(agents_done, ep_return, 0.0), jnp.where(done, ep_length, 0), info,
                     ended_metrics(env, info, done))


def half(tree, part: slice):
    """The environments of `part` (a slice of the leading axis) in every leaf of `tree`."""
    return jax.tree.map(lambda x: x[part], tree)


def joined(*parts):
    """The parts' trees as one, along the environment axis (every leaf's first)."""
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def halves(n: int) -> tuple[slice, slice]:
    """The two halves of a batch of n environments that `scan_halves` steps in turns (and a
    pipelined environment keeps as two parts: envs/atari.py)."""
    return slice(0, n // 2), slice(n // 2, n)


def pipelined(env, envs_per_device: int, memoryless: bool) -> bool:
    """Whether a rollout steps a device's games as two halves in turns (`scan_halves`): where
    the environment offers it (Traits.pipelined: Atari's `pipeline`, on by default), a device
    has at least 2 of them, and the policy is memoryless (a half acts without the other)."""
    return traits(env).pipelined and envs_per_device >= 2 and memoryless


def scan_halves(env, env_params, batch: EnvBatch, final_obs, act, act_xs, keys: jax.Array):
    """What `lax.scan` of "act, then step" over a rollout's T steps returns, for a pipelined
    host-batched environment (Traits.pipelined: envs/atari.py), so that the host simulates
    while the device infers. The batch steps as two halves in turns: a half's actions are
    inferred and sent to its games (`send_batch`), then the other half's step is received
    (`recv_batch`) and its actions inferred and sent, while the first half's games step on the
    host. A half's receive takes the other half's last ticket, so the device infers and sends
    one half before it waits on the other's games. Each environment gets the actions and keys
    of the plain loop: the same games.

    `act(obs, final_obs, x) -> (env_action, record)` acts on one half (`final_obs` is the
    observation its previous step ended on, x its part of one step's `act_xs`); the policy
    must be memoryless, as a half acts without the other. Returns the batch after the last
    step, its final observations, the records [T, E, ...] and the steps (Step) [T, E, ...]."""
    cut = halves(batch.obs.shape[0])
    step_x = lambda tree, t: jax.tree.map(lambda x: x[t], tree)  # noqa: E731

    def act_and_send(h, part: EnvBatch, part_final_obs, x, part_keys):
        env_action, record = act(part.obs, part_final_obs, half(x, cut[h]))
        return record, env.send_batch(half(part_keys, cut[h]), part.state, env_action, env_params)

    def recv(h, part: EnvBatch, ticket, other_ticket):
        return stepped(env, part, *env.recv_batch(part.state, ticket, env_params, other_ticket))

    # step 0: both halves act on the batch's observations and their games begin to step
    parts = [half(batch, s) for s in cut]
    finals = [half(final_obs, s) for s in cut]
    record0, ticket0 = act_and_send(0, parts[0], finals[0], step_x(act_xs, 0), keys[0])
    record1, ticket1 = act_and_send(1, parts[1], finals[1], step_x(act_xs, 0), keys[0])

    def body(carry, xs):
        (part0, part1), (ticket0, ticket1) = carry
        x, step_keys = xs
        part0, out0 = recv(0, part0, ticket0, ticket1)
        record0, ticket0 = act_and_send(0, part0, out0.final_obs, x, step_keys)
        part1, out1 = recv(1, part1, ticket1, ticket0)
        record1, ticket1 = act_and_send(1, part1, out1.final_obs, x, step_keys)
        return ((part0, part1), (ticket0, ticket1)), (joined(record0, record1), joined(out0, out1))

    tail = lambda tree: jax.tree.map(lambda x: x[1:], tree)  # noqa: E731
    ((part0, part1), (ticket0, ticket1)), (records, outs) = jax.lax.scan(
        body, (tuple(parts), (ticket0, ticket1)), (tail(act_xs), tail(keys)))
    # the last step's results
    part0, out0 = recv(0, part0, ticket0, ticket1)
    part1, out1 = recv(1, part1, ticket1, ticket0)
    first, last = joined(record0, record1), joined(out0, out1)
    records = jax.tree.map(lambda r0, rs: jnp.concatenate([r0[None], rs]), first, records)
    outs = jax.tree.map(lambda os, o: jnp.concatenate([os, o[None]]), outs, last)
    return joined(part0, part1), last.final_obs, records, outs


def ended_metrics(env, info: dict, done: jax.Array) -> dict:
    """The env's episode metrics (envs.episode_metrics) at the steps that ended an episode, 0
    elsewhere: `{name: [E] float32}`."""
    check_episode_metrics(env, info, done.shape)
    return {name: jnp.where(done, info[name], 0).astype(jnp.float32) for name in episode_metrics(env)}


def step_resetting_ended(env, env_params, states, action: jax.Array, keys: jax.Array) -> tuple:
    """What `vmap(env.step)` returns for an environment that uses gymnax's own `step` (the same
    keys, so the same values up to the rounding of a differently compiled program), with each
    reset computed only for the environments whose episode ended. Under vmap gymnax computes a
    reset in every step of every environment and keeps the ones where an episode ended: for
    Craftax, whose reset draws a whole world, that reset costs tens of steps. Here the ended
    environments are reset in batches of `E // RESET_BATCH_FRACTION` (one batch in most steps,
    none where no episode ended, more where many ended at once). An environment whose reset is
    sensitive to that rounding (Craftax's world generation) gets here the reset it computes
    alone, which vmap of gymnax's step inside a larger program need not give."""
    if type(env).step is not environment.Environment.step:
        raise EnvError(f"{env.name}: heavy_reset needs gymnax's own Environment.step, which this environment "
                       f"overrides")
    split = jax.vmap(jax.random.split)(keys)  # as gymnax's step: (key_step, key_reset)
    step_keys, reset_keys = split[:, 0], split[:, 1]
    obs_st, state_st, reward, terminated, info = jax.vmap(env.step_env, (0, 0, 0, None))(
        step_keys, states, action, env_params)
    truncated = jax.vmap(env.is_truncated, (0, None))(state_st, env_params)
    done = jnp.logical_or(terminated, truncated)
    num_envs = done.shape[0]
    batch = max(1, num_envs // RESET_BATCH_FRACTION)

    def reset_next_batch(carry):
        obs, state, pending = carry
        ids = jnp.nonzero(pending, size=batch, fill_value=num_envs)[0]  # past the end: no environment
        obs_re, state_re = jax.vmap(env.reset_env, (0, None))(reset_keys[jnp.minimum(ids, num_envs - 1)], env_params)
        put = lambda full, part: full.at[ids].set(part, mode="drop")  # noqa: E731
        return jax.tree.map(put, obs, obs_re), jax.tree.map(put, state, state_re), put(pending, False)

    obs, state, _ = lax.while_loop(lambda carry: carry[2].any(), reset_next_batch, (obs_st, state_st, done))
    info = {**info, "terminated": terminated, "truncated": truncated, "final_observation": obs_st}
    return obs, state, reward, terminated, truncated, info


class EpisodeStats(NamedTuple):
    """Sums over completed episodes (over all devices), so means stay exact when chunks and
    devices are combined."""
    return_sum: jax.Array
    length_sum: jax.Array
    count: jax.Array
    metric_sums: dict = {}  # name -> sum of the env's episode metrics over these episodes (never mutated)

    @staticmethod
    def of(done_return: jax.Array, done_length: jax.Array, ended_metrics: dict | None = None) -> "EpisodeStats":
        """Totals of the episodes that ended in some steps (`Step.done_return`,
        `Step.done_length` and `Step.episode_metrics`, any shape), summed over the device axis."""
        stats = EpisodeStats(done_return.sum(), done_length.sum().astype(jnp.float32),
                             (done_length > 0).sum().astype(jnp.float32),
                             {name: x.sum() for name, x in (ended_metrics or {}).items()})
        return all_sum(stats)
