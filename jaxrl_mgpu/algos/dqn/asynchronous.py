"""Asynchronous DQN (`--mode learn|collect`): the learner's double-DQN steps on its ring of
n-step transitions, and the collectors' epsilon-greedy rollouts, both built from DQN's own parts
(algos/dqn/dqn.py); the learner's data source and the collectors' loop are the replay algorithms'
(algos/replay_async.py). How it works and the commands: docs/asynchronous.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.algos import replay_async
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Resolved
from jaxrl_mgpu.algos.learner import LossScale, adam
from jaxrl_mgpu.algos.replay import TransitionRing, grad_steps_per_update, ring_init, ring_sample
from jaxrl_mgpu.algos.replay_async import Acting
from jaxrl_mgpu.checkpoint import REPLICATED
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.parallel import device_index, global_indices


def check(run: Resolved, num_devices: int) -> BatchSplit:
    cfg = run.cfg
    if cfg.policy != "mlp":
        raise ConfigError(f"--mode {cfg.mode} trains a feedforward Q-network: use --policy mlp (the store holds "
                          f"episodes, not the windows a --policy {cfg.policy} learner would need)")
    return replay_async.check(cfg, num_devices, dqn.check(run, num_devices))


def per_update(cfg) -> str:
    return f"{grad_steps_per_update(cfg)} gradient steps of {cfg.replay_batch_size} transitions"


# -- the learner ---------------------------------------------------------------------------

class LearnerState(NamedTuple):
    params: Any
    target_params: Any
    opt_state: Any
    loss_scale: Any
    key: jax.Array
    grad_steps: jax.Array


STATE_LAYOUT = {name: REPLICATED for name in LearnerState._fields}


def algorithm(run: Resolved) -> Algorithm[replay_async.LearnerFunctions]:
    """What the loop trains in --mode learn: one update is one learner iteration of
    num_steps x updates_per_step gradient steps on the replay (the source's data), --mode
    both's double-DQN step on samples of the ring."""
    cfg, par, split, env, env_params = run.cfg, run.par, run.split, run.env, run.env_params
    obs_shape = env.observation_space(env_params).shape
    qf = dqn.q_functions(cfg, dqn.make_network(cfg, env, env_params), env, obs_shape)
    grad_steps = grad_steps_per_update(cfg)
    tx = adam(cfg, max(cfg.total_updates * grad_steps, 1))
    _, train_step = dqn.make_train_step(cfg, qf.learner, tx)
    capacity, batch = split.replay.per_device, split.minibatch.per_device

    def init(key):
        params = qf.init_params(key)
        return LearnerState(params, params, tx.init(params), LossScale.init(cfg.precision), key,
                            jnp.zeros((), jnp.int32))

    def learn(state: LearnerState, ring: TransitionRing):
        key, sample_key = jax.random.split(state.key)
        sample_key = jax.random.fold_in(sample_key, device_index())  # each device its own share
        carry = (state.params, state.target_params, state.opt_state, state.loss_scale, state.grad_steps)
        carry, losses = dqn.sampled_steps(train_step, lambda k: ring_sample(ring, k, batch), carry,
                                          jax.random.split(sample_key, grad_steps))
        return LearnerState(*carry[:4], key, carry[4]), losses

    def init_replay(_):
        return ring_init(capacity, obs_shape, dqn.stored_obs_dtype(cfg))

    return replay_async.learner(par, init, learn, init_replay, STATE_LAYOUT, obs_shape)


# -- the collectors -------------------------------------------------------------------------

def _rollout(run: Resolved, seed: jax.Array):
    """A collector's rollout over its devices, `rollout(envs, params, key, eps) -> envs,
    trajectory [shard_steps, envs, ...]` (--mode both's epsilon-greedy step, the environments'
    states donated), and its environments' first states, from `seed`."""
    cfg, par, split, env, env_params = run.cfg, run.par, run.split, run.env, run.env_params
    envs_per_device = split.environments.per_device
    qf = dqn.q_functions(cfg, dqn.make_network(cfg, env, env_params), env, env.observation_space(env_params).shape)
    act = dqn.make_actor(env, env_params, qf, envs_per_device)
    obs_dtype = dqn.stored_obs_dtype(cfg)

    def reset(key):
        return vec.reset(env, env_params, key, global_indices(envs_per_device))

    def rollout(envs: vec.EnvBatch, params, key, eps):
        memory = qf.init_memory(envs_per_device)  # none: a feedforward Q-network (check)

        def step(envs, t):
            next_envs, _, action, out = act(params, envs, memory, jax.random.fold_in(key, t), eps)
            # as the learner's replay keeps them (bytes for MinAtar: a quarter of the copy to the
            # host, of the shard and of the learner's decoding; dqn.check saw that bytes hold them)
            return next_envs, (envs.obs.astype(obs_dtype), action, out.reward, out.terminated, out.truncated,
                               out.final_obs.astype(obs_dtype), out.done_return, out.done_length)

        return jax.lax.scan(step, envs, jnp.arange(cfg.shard_steps))

    return par.map(rollout, donate=True), par.map(reset)(par.replicate(np.asarray(seed)))


def _template(run: Resolved):
    return jax.eval_shape(dqn.policy(run).init_params, jax.random.PRNGKey(0))


ACTING = Acting(_rollout, _template, explore=lambda cfg, received: dqn.epsilon(cfg, received),
                describe=lambda eps: f"epsilon {eps:.3f}")


ASYNCHRONOUS = replay_async.asynchronous(check, per_update, algorithm, ACTING)
