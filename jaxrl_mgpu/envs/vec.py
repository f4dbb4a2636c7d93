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

from jaxrl_mgpu.envs import is_multi_agent
from jaxrl_mgpu.parallel import all_sum


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


def env_keys(key: jax.Array, global_ids: jax.Array) -> jax.Array:
    """One key per environment, from its global index."""
    return jax.vmap(jax.random.fold_in, (None, 0))(key, global_ids)


def reset(env, env_params, key: jax.Array, global_ids: jax.Array) -> EnvBatch:
    obs, state = jax.vmap(env.reset, (0, None))(env_keys(key, global_ids), env_params)
    zeros = jnp.zeros(global_ids.shape, jnp.float32)
    returns = jnp.zeros(global_ids.shape + (env.num_agents,)) if is_multi_agent(env) else zeros
    return EnvBatch(state, obs.astype(jnp.float32), returns, zeros.astype(jnp.int32))


def step(env, env_params, batch: EnvBatch, action: jax.Array, keys: jax.Array) -> tuple[EnvBatch, Step]:
    obs, state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
        keys, batch.state, action, env_params)
    reward = reward.astype(jnp.float32)
    done = jnp.logical_or(terminated, truncated)
    agents_done = done.reshape(done.shape + (1,) * (reward.ndim - done.ndim))  # per agent, where there are agents
    ep_return = batch.episode_return + reward
    ep_length = batch.episode_length + 1
    new = EnvBatch(state, obs.astype(jnp.float32),
                   jnp.where(agents_done, 0.0, ep_return), jnp.where(done, 0, ep_length))
    # Envs that never truncate (the Tag games end at their time limit) give no final observation.
    final_obs = info.pop("final_observation", obs).astype(jnp.float32)
    return new, Step(reward, terminated, jnp.logical_and(truncated, jnp.logical_not(terminated)), final_obs,
                     jnp.where(agents_done, ep_return, 0.0), jnp.where(done, ep_length, 0), info)


class EpisodeStats(NamedTuple):
    """Sums over completed episodes (over all devices), so means stay exact when chunks and
    devices are combined."""
    return_sum: jax.Array
    length_sum: jax.Array
    count: jax.Array

    @staticmethod
    def of(done_return: jax.Array, done_length: jax.Array) -> "EpisodeStats":
        """Totals of the episodes that ended in some steps (`Step.done_return` and
        `Step.done_length`, any shape), summed over the device axis."""
        stats = EpisodeStats(done_return.sum(), done_length.sum().astype(jnp.float32),
                             (done_length > 0).sum().astype(jnp.float32))
        return all_sum(stats)
