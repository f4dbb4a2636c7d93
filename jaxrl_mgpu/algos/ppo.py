"""PPO for ONE device's slice of the work.

`make(cfg, env, env_params, num_devices)` returns the two per-device functions the runner maps
over all devices:

    init(key)      -> PPOState      identical params everywhere (same key), own environments
    update(state)  -> state, (losses, EpisodeStats)

One update: roll out `num_steps` on this device's environments (`lax.scan`), compute GAE,
then `update_epochs` passes of `num_minibatches` minibatches. The only cross-device code is
`lax.pmean` / `lax.psum` on `AXIS`: gradients and losses are averaged, advantage statistics
are taken over the global minibatch, so one update on D devices equals one update on one
device with the same global batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxrl_mgpu.checkpoint import PER_ENV, REPLICATED
from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets.mlp import ActorCritic
from jaxrl_mgpu.parallel import AXIS, device_index, global_indices, split_evenly


class PPOState(NamedTuple):
    params: Any
    opt_state: Any
    envs: vec.EnvBatch
    key: jax.Array      # the same on every device; split once per update
    update: jax.Array   # updates done so far


class Rollout(NamedTuple):
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    bootstrap: jax.Array  # V(final observation) where the episode was truncated, else 0


# Options (besides config.STATE_KEYS) that shape this algorithm's state.
STATE_KEYS = ("anneal_lr",)  # the optimizer state holds a schedule count only when annealing

# How each state field is laid out over devices (see checkpoint.py).
STATE_LAYOUT = {"params": REPLICATED, "opt_state": REPLICATED, "envs": PER_ENV, "key": REPLICATED,
                "update": REPLICATED}


class Algo(NamedTuple):
    init: Any         # key -> PPOState
    update: Any       # PPOState -> PPOState, (losses, EpisodeStats)
    rollout: Any      # params, EnvBatch, key -> EnvBatch, Rollout, EpisodeStats
    init_params: Any  # key -> params (the same key gives the same params everywhere)
    act: Any          # params, obs [E, ...], keys [E], greedy -> actions [E]


def check(cfg, num_devices: int) -> dict:
    """The batch layout over `num_devices`, or a ConfigError naming the option that breaks it."""
    envs_per_device = split_evenly(cfg.num_envs, num_devices, "--num-envs")
    per_device_batch = envs_per_device * cfg.num_steps
    if per_device_batch % cfg.num_minibatches:
        raise ConfigError(
            f"--num-minibatches {cfg.num_minibatches} does not divide the per-device batch of {per_device_batch} "
            f"transitions (--num-envs {cfg.num_envs} / {num_devices} devices x --num-steps {cfg.num_steps})")
    return {"envs": (cfg.num_envs, envs_per_device),
            "minibatch": (cfg.batch_size // cfg.num_minibatches, per_device_batch // cfg.num_minibatches)}


def make_network(cfg, env, env_params) -> ActorCritic:
    obs_shape = env.observation_space(env_params).shape
    return ActorCritic(num_actions=env.num_actions, obs_ndim=len(obs_shape), hidden_size=cfg.hidden_size,
                       num_layers=cfg.num_layers, activation=cfg.activation)


def make_optimizer(cfg) -> optax.GradientTransformation:
    steps = cfg.num_updates * cfg.update_epochs * cfg.num_minibatches
    lr = optax.linear_schedule(cfg.lr, 0.0, steps) if cfg.anneal_lr else cfg.lr
    # eps=1e-5 (not 1e-8) keeps Adam's first steps stable on near-zero gradients.
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr, eps=1e-5))


def gae(cfg, traj: Rollout, last_value: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets. Terminated steps do not bootstrap; truncated ones
    bootstrap from the value of the observation before the auto-reset."""
    next_value = jnp.concatenate([traj.value[1:], last_value[None]], axis=0)
    next_value = jnp.where(traj.truncated, traj.bootstrap, next_value)
    delta = traj.reward + cfg.gamma * next_value * (1.0 - traj.terminated) - traj.value
    episode_ends = jnp.maximum(traj.terminated, traj.truncated)

    def backward(carry, x):
        delta_t, end_t = x
        carry = delta_t + cfg.gamma * cfg.gae_lambda * (1.0 - end_t) * carry
        return carry, carry

    _, adv = jax.lax.scan(backward, jnp.zeros_like(last_value), (delta, episode_ends), reverse=True)
    return adv, adv + traj.value


def global_normalize(x: jax.Array) -> jax.Array:
    """(x - mean) / std with both taken over the minibatch of ALL devices."""
    mean = jax.lax.pmean(x.mean(), AXIS)
    var = jax.lax.pmean(jnp.square(x - mean).mean(), AXIS)
    return (x - mean) / (jnp.sqrt(var) + 1e-8)


def make(cfg, env, env_params, num_devices: int) -> Algo:
    net = make_network(cfg, env, env_params)
    tx = make_optimizer(cfg)
    envs_per_device = cfg.num_envs // num_devices
    obs_shape = env.observation_space(env_params).shape

    def init_params(key: jax.Array):
        return net.init(key, jnp.zeros((1,) + obs_shape))

    def act(params, obs, keys, greedy: bool):
        logits, _ = net.apply(params, obs)
        return jnp.argmax(logits, -1) if greedy else jax.vmap(jax.random.categorical)(keys, logits)

    def init(key: jax.Array) -> PPOState:
        params_key, env_key, key = jax.random.split(key, 3)
        params = init_params(params_key)
        envs = vec.reset(env, env_params, env_key, global_indices(envs_per_device))
        return PPOState(params, tx.init(params), envs, key, jnp.zeros((), jnp.int32))

    def rollout(params, envs: vec.EnvBatch, key: jax.Array):
        ids = global_indices(envs_per_device)

        def step(envs, t):
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t), ids))
            logits, value = net.apply(params, envs.obs)
            action = jax.vmap(jax.random.categorical)(keys[:, 0], logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
            next_envs, out = vec.step(env, env_params, envs, action, keys[:, 1])
            # The critic on the pre-reset observation is only needed where a time limit hit.
            bootstrap = jax.lax.cond(out.truncated.any(),
                                     lambda: net.apply(params, out.final_obs, method=net.value),
                                     lambda: jnp.zeros_like(value))
            bootstrap = jnp.where(out.truncated, bootstrap, 0.0)
            traj = Rollout(envs.obs, action, log_prob, value, out.reward,
                           out.terminated.astype(jnp.float32), out.truncated.astype(jnp.float32), bootstrap)
            return next_envs, (traj, out)

        envs, (traj, steps) = jax.lax.scan(step, envs, jnp.arange(cfg.num_steps))
        return envs, traj, vec.EpisodeStats.of(steps)

    def loss_fn(params, batch: Rollout, advantages, targets):
        logits, value = net.apply(params, batch.obs)
        log_probs = jax.nn.log_softmax(logits)
        log_prob = jnp.take_along_axis(log_probs, batch.action[:, None], -1)[:, 0]
        ratio = jnp.exp(log_prob - batch.log_prob)
        policy_loss = -jnp.minimum(ratio * advantages,
                                   jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * advantages).mean()
        value_clipped = batch.value + jnp.clip(value - batch.value, -cfg.clip_eps, cfg.clip_eps)
        value_loss = 0.5 * jnp.maximum(jnp.square(value - targets), jnp.square(value_clipped - targets)).mean()
        entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
        total = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
        stats = {"loss/total": total, "loss/policy": policy_loss, "loss/value": value_loss,
                 "loss/entropy": entropy, "loss/approx_kl": ((ratio - 1) - jnp.log(ratio)).mean(),
                 "loss/clip_frac": (jnp.abs(ratio - 1) > cfg.clip_eps).mean()}
        return total, stats

    def learn(params, opt_state, traj: Rollout, advantages, targets, key):
        """`update_epochs` passes over the rollout in `num_minibatches` shuffled minibatches."""
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (traj, advantages, targets))
        batch_size = flat[1].shape[0]

        def epoch(carry, epoch_key):
            # Each device shuffles its own data: fold in the device index.
            perm = jax.random.permutation(jax.random.fold_in(epoch_key, device_index()), batch_size)
            minibatches = jax.tree.map(
                lambda x: x[perm].reshape((cfg.num_minibatches, -1) + x.shape[1:]), flat)

            def minibatch(carry, mb):
                params, opt_state = carry
                batch, adv, target = mb
                grads, stats = jax.grad(loss_fn, has_aux=True)(params, batch, global_normalize(adv), target)
                grads, stats = jax.lax.pmean((grads, stats), AXIS)  # the all-reduce
                updates, opt_state = tx.update(grads, opt_state, params)
                return (optax.apply_updates(params, updates), opt_state), stats

            return jax.lax.scan(minibatch, carry, minibatches)

        (params, opt_state), stats = jax.lax.scan(epoch, (params, opt_state),
                                                  jax.random.split(key, cfg.update_epochs))
        return params, opt_state, jax.tree.map(jnp.mean, stats)

    def update(state: PPOState):
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        envs, traj, episodes = rollout(state.params, state.envs, rollout_key)
        last_value = net.apply(state.params, envs.obs, method=net.value)
        advantages, targets = gae(cfg, traj, last_value)
        params, opt_state, losses = learn(state.params, state.opt_state, traj, advantages, targets, learn_key)
        return PPOState(params, opt_state, envs, key, state.update + 1), (losses, episodes)

    return Algo(init, update, rollout, init_params, act)
