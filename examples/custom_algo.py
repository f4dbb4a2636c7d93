"""A user's own algorithm, trained, resumed, swept and evaluated through jaxrl_mgpu's command line.

A2C (synchronous advantage actor-critic): every update rolls out --num-steps steps of this
device's environments, computes n-step returns that bootstrap through truncation, and takes
ONE gradient step of the policy-gradient, value and entropy losses, averaged over every
device (algos.learner.step all-reduces the gradients). The file is what adding an algorithm
costs: its options, per-device functions, a `Spec` that tells the host how to run them, and
`algos.register`. Everything else (devices and hosts, --num-seeds and --sweep, checkpoints and
--resume, logs, evaluation) comes from the package. `--algo MODULE:NAME` imports the module,
which registers NAME; from the repository's root:

    python -m jaxrl_mgpu.train --algo examples.custom_algo:a2c --env CartPole-v1 --num-envs 32 --num-steps 16 \\
        --total-timesteps 100000 --run-dir runs/a2c           # all local devices
    python -m jaxrl_mgpu.train --run-dir runs/a2c --resume --total-timesteps 200000
    python -m jaxrl_mgpu.train --algo examples.custom_algo:a2c --sweep value_weight=0.25,0.5 --num-seeds 2
    python -m jaxrl_mgpu.evaluate --run-dir runs/a2c --episodes 32
    python -m jaxrl_mgpu.train --algo examples.custom_algo:a2c --help-all   # its options, with the common ones
"""
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_mgpu import algos
from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Resolved, Share
from jaxrl_mgpu.algos.option_groups import ActionDistribution, ActorCriticNets
from jaxrl_mgpu.checkpoint import PER_ENV, REPLICATED
from jaxrl_mgpu.config import AlgoOptions
from jaxrl_mgpu.config.declare import ENV_STEPPING, NON_NEGATIVE, option
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic, obs_norm
from jaxrl_mgpu.parallel import global_indices, split_evenly


@dataclasses.dataclass(frozen=True)
class A2cOptions(ActorCriticNets, ActionDistribution):
    """A2C's options: its loss weights, beside the actor-critic MLP's it shares with PPO (their
    widths, --normalize-obs, --action-dist). `--help a2c` lists them."""
    GROUPS = {"a2c": "A2C (examples/custom_algo.py): its loss weights"}
    value_weight: float = option(0.5, "weight of the value loss", "a2c", check=NON_NEGATIVE, sweep=True)
    entropy_weight: float = option(0.01, "weight of the entropy bonus", "a2c", check=NON_NEGATIVE, sweep=True)


# What the options layer knows of A2C: its options; the common options it reads beyond those
# every run reads (it steps environments; an MLP policy: no --policy); the common ones its
# --sweep may vary (besides its own, declared sweep=True).
OPTIONS = AlgoOptions(fields=A2cOptions, uses=ENV_STEPPING + ("hidden_size", "num_layers", "activation"),
                      sweep=("lr", "gamma", "max_grad_norm"))


class State(NamedTuple):
    params: Any
    opt_state: Any
    loss_scale: learner.LossScale
    envs: vec.EnvBatch   # this device's environments
    key: jax.Array


# How each field is checkpointed: identical on every device (saved once), or one row per
# environment (saved in global order, so a checkpoint restores on any device count).
LAYOUT = {"params": REPLICATED, "opt_state": REPLICATED, "loss_scale": REPLICATED, "envs": PER_ENV,
          "key": REPLICATED}


def check(run: Resolved, num_devices: int) -> BatchSplit:
    """How the batch splits over the devices, or a ConfigError naming the option that does not.
    (`run`: the resolved run, algos.base.Resolved: its config, its environment made once.)"""
    cfg = run.cfg
    envs = split_evenly(cfg.num_envs, num_devices, "--num-envs")
    return BatchSplit(num_devices, environments=Share(cfg.num_envs, envs),
                      minibatch=Share(cfg.num_envs * cfg.num_steps, envs * cfg.num_steps))


def n_step_returns(reward, terminated, truncated, bootstrap, last_value, gamma):
    """Discounted returns of each step to the end of the rollout, [T, E]: they stop at a
    termination, and at a truncation take V(the final observation) (`bootstrap`) instead."""
    def back(next_return, x):
        r, term, trunc, boot = x
        ret = r + gamma * jnp.where(trunc, boot, next_return) * (1.0 - term)
        return ret, ret
    _, returns = jax.lax.scan(back, last_value, (reward, terminated, truncated, bootstrap), reverse=True)
    return returns


def policy_of(run: Resolved) -> actor_critic.Policy:
    """The MLP actor-critic of --actor-hidden etc. for the run's environment."""
    return actor_critic.make(run.cfg, run.env, run.env_params)


def algorithm(run: Resolved) -> Algorithm:
    cfg, env, env_params = run.cfg, run.env, run.env_params
    policy = policy_of(run)
    dist, n = policy.dist, run.split.environments.per_device
    tx = learner.adam(cfg, cfg.total_updates)

    def init(key):
        params_key, env_key, key = jax.random.split(key, 3)  # the same key on every device
        params = policy.init_params(params_key)
        return State(params, tx.init(params["params"]), learner.LossScale.init(cfg.precision),
                     vec.reset(env, env_params, env_key, global_indices(n)), key)

    def rollout(params, envs, key):
        def step(envs, t):
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t), global_indices(n)))
            pi, value, _, _ = policy.act(params, (), envs.obs, envs.obs)
            action = dist.sample(pi, dist.noise(keys[:, 0]))
            next_envs, out = vec.step(env, env_params, envs, dist.to_env(action), keys[:, 1])
            _, final_value, _, _ = policy.act(params, (), out.final_obs, out.final_obs)
            return next_envs, (envs.obs, action, out.reward, out.terminated.astype(jnp.float32), out.truncated,
                               final_value, out.done_return, out.done_length)
        return jax.lax.scan(step, envs, jnp.arange(cfg.num_steps))

    def loss(params, batch):
        obs, action, returns = batch
        pi, value = policy.evaluate(params, (), obs)
        advantage = jax.lax.stop_gradient(returns - value)
        policy_loss = -(dist.log_prob(pi, action) * advantage).mean()
        value_loss = 0.5 * jnp.square(returns - value).mean()
        entropy = dist.entropy(pi, ()).mean()
        total = policy_loss + cfg.value_weight * value_loss - cfg.entropy_weight * entropy
        return total, {"loss/total": total, "loss/policy": policy_loss, "loss/value": value_loss,
                       "loss/entropy": entropy}

    def update(state: State):
        key, rollout_key = jax.random.split(state.key)
        envs, (obs, action, reward, terminated, truncated, final_value, done_return, done_length) = rollout(
            state.params, state.envs, rollout_key)
        _, last_value, _, _ = policy.act(state.params, (), envs.obs, envs.obs)
        returns = n_step_returns(reward, terminated, truncated, final_value, last_value, cfg.gamma)
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (obs, action, returns))
        # The optimizer steps the weights, params["params"] (PPO's observation statistics sit beside them).
        weights_loss = lambda weights, batch: loss({**state.params, "params": weights}, batch)  # noqa: E731
        weights, opt_state, loss_scale, losses = learner.step(weights_loss, tx, state.params["params"], state.opt_state,
                                                              state.loss_scale, flat, precision=cfg.precision)
        params = {**state.params, "params": weights}
        if cfg.normalize_obs:  # the observation statistics the policy normalises with, all-reduced
            params = {**params, obs_norm.OBS_STATS: obs_norm.update(params[obs_norm.OBS_STATS], obs)}
        return State(params, opt_state, loss_scale, envs, key), (losses, vec.EpisodeStats.of(done_return, done_length))

    return Algorithm(init, update, LAYOUT, policy)


algos.register("a2c", algos.Spec(
    options=OPTIONS, check=check, algorithm=algorithm, policy=policy_of,
    steps_per_update=lambda cfg: cfg.num_envs * cfg.num_steps,
    console=(("policy", "loss/policy", ".3f"), ("value", "loss/value", ".3f"))))
