"""Asynchronous SAC and TD3 (`--mode learn|collect`): the learner runs --mode both's gradient
steps (sac.make's `learn_steps`) on batches of its ring of n-step transitions, and the
collectors act as --mode both does (`act`: SAC's sampled actions, TD3's per-environment noise,
uniform until the learner has received --learning-starts env steps). The learner's data source
and the collectors' loop are the replay algorithms' (algos/replay_async.py); docs/asynchronous.md.

With --normalize-obs the learner's statistics follow the observations it learns from: each
iteration merges one batch sampled from its ring (it never sees the collectors' rollouts whole,
which --mode both's statistics follow); the collectors act with the statistics published with
the actor.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.algos import replay_async
from jaxrl_mgpu.algos.sac import sac
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Resolved
from jaxrl_mgpu.algos.replay import TransitionRing, grad_steps_per_update, ring_init, ring_sample
from jaxrl_mgpu.algos.replay_async import Acting
from jaxrl_mgpu.checkpoint import REPLICATED
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import obs_norm
from jaxrl_mgpu.parallel import device_index, global_indices


def check(run: Resolved, num_devices: int) -> BatchSplit:
    return replay_async.check(run.cfg, num_devices, sac.check(run, num_devices))


def per_update(cfg) -> str:
    grads = grad_steps_per_update(cfg)
    return (f"{grads} critic steps and {grads // cfg.policy_delay} actor steps of {cfg.replay_batch_size} "
            f"transitions")


def _parts(run: Resolved) -> sac.Parts:
    return sac.make(run.cfg, run.env, run.env_params, run.split)


# -- the learner ---------------------------------------------------------------------------

class LearnerState(NamedTuple):
    """--mode both's sac.State without the environments and the replay (the ring is the source's)."""
    params: Any
    critic: Any
    target_critic: Any
    target_actor: Any
    log_alpha: jax.Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    loss_scale: Any
    key: jax.Array
    grad_steps: jax.Array


STATE_LAYOUT = {name: REPLICATED for name in LearnerState._fields}


def algorithm(run: Resolved) -> Algorithm[replay_async.LearnerFunctions]:
    """What the loop trains in --mode learn: one update is one learner iteration, --mode both's
    num_steps x updates_per_step gradient steps, on samples of the ring (the source's data)."""
    cfg, par, split, parts = run.cfg, run.par, run.split, _parts(run)
    obs_shape = run.env.observation_space(run.env_params).shape
    num_dims = parts.policy.dist.num_dims
    capacity, batch = split.replay.per_device, split.minibatch.per_device

    def init(key):  # (the environments and replay sac.init makes are unused: XLA drops them)
        state = parts.init(key)
        return LearnerState(*(getattr(state, name) for name in LearnerState._fields))

    def learn(state: LearnerState, ring: TransitionRing):
        key, learn_key, stats_key = jax.random.split(state.key, 3)
        params = state.params
        if cfg.normalize_obs:
            seen = ring_sample(ring, jax.random.fold_in(stats_key, device_index()), batch).obs
            params = {**params, obs_norm.OBS_STATS: obs_norm.update(params[obs_norm.OBS_STATS], seen)}
        full = sac.State(**state._replace(params=params, key=key)._asdict(), envs=(), replay=(),
                         update=jnp.zeros((), jnp.int32))
        full, losses = parts.learn_steps(full, lambda k: ring_sample(ring, k, batch), learn_key)
        return LearnerState(*(getattr(full, name) for name in LearnerState._fields)), losses

    def init_replay(_):
        return ring_init(capacity, obs_shape, jnp.float32, (num_dims,), jnp.float32)

    return replay_async.learner(par, init, learn, init_replay, STATE_LAYOUT, obs_shape, learned=sac.LEARNED,
                                optimizers=sac.OPTIMIZERS)


# -- the collectors ------------------------------------------------------------------------

def _rollout(run: Resolved, seed: jax.Array):
    """A collector's rollout over its devices, `rollout(envs, params, key, uniform) -> envs,
    trajectory [shard_steps, envs, ...]` (--mode both's acting; actions stored in [-1, 1], as
    its replay keeps them), and its environments' first states, from `seed`."""
    cfg, par, env, env_params, parts = run.cfg, run.par, run.env, run.env_params, _parts(run)
    envs_per_device = run.split.environments.per_device

    def reset(key):
        return vec.reset(env, env_params, key, global_indices(envs_per_device))

    def rollout(envs: vec.EnvBatch, params, key, uniform):
        ids = global_indices(envs_per_device)

        def step(envs, t):
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t), ids))
            action = parts.act(params, envs.obs, keys[:, 0], ids, uniform > 0)
            next_envs, out = vec.step(env, env_params, envs, parts.to_env(action), keys[:, 1])
            return next_envs, (envs.obs, action, out.reward, out.terminated, out.truncated, out.final_obs,
                               out.done_return, out.done_length)

        return jax.lax.scan(step, envs, jnp.arange(cfg.shard_steps))

    return par.map(rollout, donate=True), par.map(reset)(par.replicate(np.asarray(seed)))


def _template(run: Resolved):
    return jax.eval_shape(sac.policy(run).init_params, jax.random.PRNGKey(0))


ACTING = Acting(_rollout, _template, explore=lambda cfg, received: float(received < cfg.learning_starts),
                describe=lambda uniform: "uniform random actions" if uniform else "the policy's actions")


ASYNCHRONOUS = replay_async.asynchronous(check, per_update, algorithm, ACTING)
