"""SAC and TD3 for continuous actions (Box), over shared parts, for ONE device's slice of the work.

One update (as DQN's, algos/dqn/dqn.py): `num_steps` vector steps of this device's environments go
into its replay (algos/replay.py: per-environment rings, checkpointed with the state, so a
resume is exact and restores on any device count); then, once `--learning-starts` env steps
(global) are in, `num_steps x --updates-per-step` gradient steps, each on this device's share of
`--replay-batch-size` transitions from its own replay, with gradients all-reduced over every
device and process (learner.step): the step of the whole global batch. Before learning starts
the actions are uniform in the action space.

The parts, shared by both (the names of their options):
- n-step targets that bootstrap through time limits and stop at terminations (replay.py, as
  DQN's): r_t + ... + gamma^k r_{t+k} + gamma^(k+1) V(s') (--n-step, --gamma);
- two critics Q_i(s, a) with layer normalisation (--critic-layer-norm), plain (mean squared
  error) or categorical (--critic categorical: cross-entropy to the target distribution
  projected on --num-atoms values in [--v-min, --v-max]); V(s') from the target critics at the
  next action, the smaller of the two (--clipped-double-q) or their mean;
- the actor, a tanh-squashed normal over actions scaled to [-1, 1] (nets/actor_critic.TanhNormal:
  what evaluation and videos act with), stepped every --policy-delay critic steps to raise the
  critics' mean value of its action (SAC: minus alpha x its log-probability);
- target critics (and TD3's target actor) follow with --tau (DQN's rule: < 1 Polyak averaging
  every step, 1 a hard copy every --target-update-every);
- --normalize-obs (PPO's running statistics, all-reduced, kept with the actor's params: the
  replay keeps raw observations, normalised with the current statistics when sampled).
SAC samples actions from the actor and learns the temperature alpha (--init-alpha) towards an
entropy of -(action dimensions); TD3 acts with the actor's mean plus Gaussian noise of a std of
each environment's own (--noise-std-min .. --noise-std-max, spread by global index, FastTD3's)
and smooths the target action (--target-noise, --noise-clip).

Random numbers come from global indices (environment i's, sample i's of the global batch), so
1 device and 8 take the same steps on the same global batch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Resolved
from jaxrl_mgpu.algos.replay import (Replay, Transitions, first_learning_update, grad_steps_per_update, gradient_steps,
                                     replay_add, replay_init, replay_sample, replay_split, target_update)
from jaxrl_mgpu.checkpoint import PER_ENV, REPLICATED
from jaxrl_mgpu.cli import ConfigError, count
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic, factory, obs_norm
from jaxrl_mgpu.nets.actor_critic import Policy
from jaxrl_mgpu.parallel import device_index, global_indices, memory_limit, this_device, zeros

TD3_RAW_SCALE = -30.0  # TD3's policy as a tanh-normal: a raw scale whose std is TanhNormal.MIN_STD


class State(NamedTuple):
    params: Any            # the actor's {"params": weights[, obs_stats]}: what evaluation reads
    critic: Any            # the two critics' weights (a leading axis of 2)
    target_critic: Any
    target_actor: Any      # TD3's target actor's weights (SAC: the empty tuple)
    log_alpha: jax.Array   # SAC's temperature (TD3: 0, unused)
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any
    loss_scale: learner.LossScale
    envs: vec.EnvBatch
    replay: Replay
    key: jax.Array         # the same on every device; split once per update
    update: jax.Array      # updates done so far (x num_steps = vector steps written to the replay)
    grad_steps: jax.Array


STATE_LAYOUT = {name: REPLICATED for name in State._fields} | {"envs": PER_ENV, "replay": PER_ENV}


# -- checks --------------------------------------------------------------------------------

def replay_bytes(cfg, obs_size: int, num_dims: int, num_devices: int) -> int:
    """One device's replay in bytes: observation and next observation, action, reward, flags."""
    return cfg.buffer_size // num_devices * (2 * 4 * obs_size + 4 * num_dims + 4 + 2)


def check(run: Resolved, num_devices: int) -> BatchSplit:
    cfg, env, env_params = run.cfg, run.env, run.env_params
    dist = actor_critic.distribution(env, env_params)
    if not isinstance(dist, actor_critic.DiagGaussian):
        raise ConfigError(f"--algo {cfg.algo} takes continuous (Box) actions; --env {cfg.env} has discrete actions: "
                          f"use --algo dqn")
    if not np.isfinite([*dist.low, *dist.high]).all():
        raise ConfigError(f"--algo {cfg.algo} squashes actions into the action space's bounds; --env {cfg.env} has "
                          f"unbounded actions")
    if cfg.policy != "mlp":
        raise ConfigError(f"--algo {cfg.algo} has MLP actors and critics: use --policy mlp")
    if len(env.observation_space(env_params).shape) != 1:
        raise ConfigError(f"--algo {cfg.algo} takes vector observations; --env {cfg.env}'s are of shape "
                          f"{env.observation_space(env_params).shape}")
    if cfg.precision == "fp16":
        raise ConfigError(f"--precision fp16: --algo {cfg.algo} computes in fp32 or bf16 (its three optimizers "
                          f"have no loss scaling)")
    if cfg.critic == "categorical" and not cfg.v_min < cfg.v_max:
        raise ConfigError(f"--v-min {cfg.v_min:g} must be below --v-max {cfg.v_max:g} (the categorical critic's "
                          f"support)")
    if cfg.critic == "categorical" and cfg.num_atoms < 2:
        raise ConfigError(f"--num-atoms {cfg.num_atoms}: a categorical critic needs at least 2 values")
    if cfg.algo == "td3" and cfg.noise_std_min > cfg.noise_std_max:
        raise ConfigError(f"--noise-std-min {cfg.noise_std_min:g} is above --noise-std-max {cfg.noise_std_max:g}")
    if cfg.replay_batch_size > cfg.buffer_size:
        raise ConfigError(f"--replay-batch-size {cfg.replay_batch_size} is larger than the replay (--buffer-size "
                          f"{cfg.buffer_size})")
    split = replay_split(cfg, num_devices, f"--algo {cfg.algo}")
    if grad_steps_per_update(cfg) % cfg.policy_delay:
        raise ConfigError(f"--policy-delay {cfg.policy_delay} does not divide the {grad_steps_per_update(cfg)} "
                          f"gradient steps of an update (--num-steps {cfg.num_steps} x --updates-per-step "
                          f"{cfg.updates_per_step:g})")
    device = this_device().devices[0]
    limit, source = memory_limit(device)
    need = replay_bytes(cfg, int(np.prod(env.observation_space(env_params).shape)), dist.num_dims, num_devices)
    if need > limit:
        raise ConfigError(f"--buffer-size {cfg.buffer_size}: the replay takes {need / 2**30:.1f} GiB on each of "
                          f"{count(num_devices, 'device')}, more than the {limit / 2**30:.1f} GiB of a "
                          f"{device.platform} device ({source}); use a smaller --buffer-size")
    return split


# -- the networks and the policy -----------------------------------------------------------

def networks(cfg, env, env_params):
    """The actor, the critics, the action distribution (env bounds) and the critics' atoms (a
    categorical critic's support; None for a plain one)."""
    dist = actor_critic.distribution(env, env_params, "tanh_normal")
    atoms = jnp.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms) if cfg.critic == "categorical" else None
    actor, critics = factory.off_policy_nets(cfg, dist.num_dims, 1 if atoms is None else cfg.num_atoms)
    return actor, critics, dist, atoms


def pi_of(cfg, actor, params, obs) -> jax.Array:
    """The tanh-normal's [n, 2D] location and raw scale of (normalised) observations; TD3's
    scale is TanhNormal's least, its policy being the location."""
    weights = {"params": params["params"]}
    if cfg.normalize_obs:
        obs = obs_norm.normalize(params[obs_norm.OBS_STATS], obs)
    out = actor.apply(weights, obs).astype(jnp.float32)
    if cfg.algo == "td3":
        loc = out[..., : out.shape[-1] // 2]
        out = jnp.concatenate([loc, jnp.full_like(loc, TD3_RAW_SCALE)], -1)
    return out


def sac_policy(cfg, env, env_params) -> Policy:
    """The actor as the actor-critic interface evaluation and videos act with (the spec's
    `policy`): no memory, no value."""
    actor, _, dist, _ = networks(cfg, env, env_params)
    obs_shape = env.observation_space(env_params).shape

    def init_params(key):
        params = dict(actor.init(key, jnp.zeros((1,) + obs_shape)))
        return {**params, obs_norm.OBS_STATS: obs_norm.RunningStats.init(obs_shape)} if cfg.normalize_obs else params

    def act(params, memory, obs, final_obs):
        none = jnp.zeros(obs.shape[:1])
        return pi_of(cfg, actor, params, obs), none, none, memory

    return Policy(init_params=init_params, init_memory=lambda n: (), act=act,
                  remember=lambda memory, action, reward, done: memory, inputs=lambda memory, obs: obs,
                  evaluate=lambda params, memory0, obs: (pi_of(cfg, actor, params, obs), jnp.zeros(obs.shape[:1])),
                  sequences=False, dist=dist)


# -- the critics' loss ---------------------------------------------------------------------

def project(probs: jax.Array, reward: jax.Array, discount: jax.Array, atoms: jax.Array) -> jax.Array:
    """The distribution [B, K] of reward + discount x Z, Z ~ `probs` over `atoms`, projected back
    onto `atoms` (C51's projection: each shifted atom's mass split between its two neighbours)."""
    v_min, v_max, k = atoms[0], atoms[-1], atoms.shape[0]
    shifted = jnp.clip(reward[:, None] + discount[:, None] * atoms[None], v_min, v_max)
    b = (shifted - v_min) / ((v_max - v_min) / (k - 1))
    lower, upper = jnp.floor(b), jnp.ceil(b)
    to_lower = probs * (upper - b + (lower == upper))  # an atom landing exactly on one goes there whole
    to_upper = probs * (b - lower)
    rows = jnp.arange(probs.shape[0])[:, None]
    out = jnp.zeros_like(probs).at[rows, lower.astype(jnp.int32)].add(to_lower)
    return out.at[rows, jnp.minimum(upper, k - 1).astype(jnp.int32)].add(to_upper)


def critic_loss(cfg, critics, atoms, critic, target_critic, batch: Transitions, next_action, next_entropy_bonus):
    """The two critics' loss on a batch whose n-step target bootstraps from the target critics at
    `next_action` (SAC adds `next_entropy_bonus`, -alpha x its log-probability; TD3: 0)."""
    both = critics.apply(target_critic, batch.next_obs, next_action)          # [2, B, 1 or K]
    now = critics.apply(critic, batch.obs, batch.action)
    if atoms is None:
        next_q = both[..., 0]
        next_v = next_q.min(0) if cfg.clipped_double_q else next_q.mean(0)
        target = jax.lax.stop_gradient(batch.reward + batch.discount * (next_v + next_entropy_bonus))
        q = now[..., 0]
        loss = 0.5 * jnp.square(q - target[None]).mean(1).sum()
        return loss, {"loss/critic": loss, "loss/q_mean": q.mean(), "loss/target_mean": target.mean()}
    probs = jax.nn.softmax(both, -1)
    means = (probs * atoms).sum(-1)                                            # [2, B]
    if cfg.clipped_double_q:   # the distribution of the critic whose mean is the smaller
        next_probs = jnp.where((means[0] <= means[1])[:, None], probs[0], probs[1])
    else:
        next_probs = probs.mean(0)
    reward = batch.reward + batch.discount * next_entropy_bonus
    target = jax.lax.stop_gradient(project(next_probs, reward, batch.discount, atoms))
    log_probs = jax.nn.log_softmax(now, -1)
    loss = -(target[None] * log_probs).sum(-1).mean(1).sum()
    q = (jnp.exp(log_probs) * atoms).sum(-1)
    # The share of targets whose mean the support cannot hold (projected onto its end): near 1,
    # the critics' values are clipped and the actor learns little (--v-min / --v-max too narrow).
    unclipped = reward + batch.discount * (next_probs * atoms).sum(-1)
    outside = ((unclipped > atoms[-1]) | (unclipped < atoms[0])).mean()
    return loss, {"loss/critic": loss, "loss/q_mean": q.mean(), "loss/target_mean": (target * atoms).sum(-1).mean(),
                  "loss/target_outside_support": outside}


def q_value(critics, atoms, critic, obs, action):
    """The two critics' values [2, B] (a categorical critic's: its mean)."""
    out = critics.apply(critic, obs, action)
    return out[..., 0] if atoms is None else (jax.nn.softmax(out, -1) * atoms).sum(-1)


# -- the algorithm -------------------------------------------------------------------------

class Batch(NamedTuple):
    """A gradient step's sample with its random numbers, drawn by global sample index (so that
    `--grad-accum` and the device count leave the step unchanged)."""
    transitions: Transitions
    next_noise: jax.Array   # [B, D] the target action's (SAC: sampling; TD3: smoothing)
    noise: jax.Array        # [B, D] the actor step's action (SAC)


def make(cfg, env, env_params, split: BatchSplit) -> "Parts":
    actor, critics, dist, atoms = networks(cfg, env, env_params)
    policy = sac_policy(cfg, env, env_params)
    sac = cfg.algo == "sac"
    obs_shape, num_dims = env.observation_space(env_params).shape, dist.num_dims
    envs_per_device, batch_per_device = split.environments.per_device, split.minibatch.per_device
    rows = cfg.buffer_size // cfg.num_envs
    grad_steps = grad_steps_per_update(cfg)
    learn_from = first_learning_update(cfg)
    tx = learner.adam(cfg, gradient_steps(cfg))
    actor_tx = learner.adam(cfg, max(gradient_steps(cfg) // cfg.policy_delay, 1))
    alpha_tx = optax.adam(cfg.lr)
    target_entropy = -float(num_dims)
    low, high = np.asarray(dist.low, np.float32), np.asarray(dist.high, np.float32)
    to_env = lambda a: (high + low) / 2 + (high - low) / 2 * a  # noqa: E731  [-1, 1] -> the bounds

    def noise_std(ids):
        """TD3's exploration std of the environments of global indices `ids`: spread evenly from
        --noise-std-min (environment 0) to --noise-std-max (the last), whatever the device count."""
        return cfg.noise_std_min + (cfg.noise_std_max - cfg.noise_std_min) * ids / max(cfg.num_envs - 1, 1)

    def init(key):
        actor_key, critic_key, env_key, key = jax.random.split(key, 4)
        params = policy.init_params(actor_key)
        critic = critics.init(critic_key, jnp.zeros((1,) + obs_shape), jnp.zeros((1, num_dims)))
        log_alpha = jnp.log(jnp.float32(cfg.init_alpha)) if sac else jnp.float32(0.0)
        envs = vec.reset(env, env_params, env_key, global_indices(envs_per_device))
        replay = replay_init(envs_per_device, rows, obs_shape, jnp.float32, (num_dims,), jnp.float32)
        zero = jnp.zeros((), jnp.int32)
        return State(params, critic, critic, () if sac else params["params"], log_alpha,
                     actor_tx.init(params["params"]), tx.init(critic), alpha_tx.init(log_alpha),
                     learner.LossScale.init(cfg.precision), envs, replay, key, zero, zero)

    def act(params, obs, keys, ids, uniform):
        """Actions in [-1, 1] of this device's environments; `uniform` before learning starts."""
        pi = pi_of(cfg, actor, params, obs)
        loc, scale = dist.loc_scale(pi)
        noise = actor_critic.standard_normal(keys, num_dims)
        action = jnp.tanh(loc + scale * noise) if sac else \
            jnp.clip(jnp.tanh(loc) + noise_std(ids)[:, None] * noise, -1.0, 1.0)
        random = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, 1), (num_dims,), minval=-1.0,
                                                       maxval=1.0))(keys)
        return jnp.where(uniform, random, action)

    def rollout(params, envs, replay, key, written):
        ids = global_indices(envs_per_device)

        def step(carry, t):
            envs, replay = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t), ids))
            uniform = (written + t) * cfg.num_envs < cfg.learning_starts
            action = act(params, envs.obs, keys[:, 0], ids, uniform)
            next_envs, out = vec.step(env, env_params, envs, to_env(action), keys[:, 1])
            return (next_envs, replay_add(replay, written + t, envs.obs, action, out)), (envs.obs, out)

        (envs, replay), (obs, steps) = jax.lax.scan(step, (envs, replay), jnp.arange(cfg.num_steps))
        return envs, replay, obs, steps

    def seen(params, obs):
        return obs_norm.normalize(params[obs_norm.OBS_STATS], obs) if cfg.normalize_obs else obs

    def next_action(params, target_actor, obs, noise):
        """The action the target bootstraps at, and SAC's entropy bonus -alpha x log pi of it."""
        if sac:
            pi = pi_of(cfg, actor, params, obs)
            loc, scale = dist.loc_scale(pi)
            u = loc + scale * noise
            return jnp.tanh(u), dist.log_prob(pi, u)
        loc = actor.apply({"params": target_actor}, seen(params, obs))[..., :num_dims].astype(jnp.float32)
        smoothing = jnp.clip(cfg.target_noise * noise, -cfg.noise_clip, cfg.noise_clip)
        return jnp.clip(jnp.tanh(loc) + smoothing, -1.0, 1.0), jnp.zeros(obs.shape[:1])

    def critic_step(carry, batch: Batch):
        state = carry
        alpha = jnp.exp(state.log_alpha)

        def loss(critic, b: Batch):
            t = b.transitions
            action, log_prob = next_action(state.params, state.target_actor, t.next_obs, b.next_noise)
            normalised = t._replace(obs=seen(state.params, t.obs), next_obs=seen(state.params, t.next_obs))
            return critic_loss(cfg, critics, atoms, critic, state.target_critic, normalised, action,
                               -alpha * log_prob if sac else 0.0)

        critic, critic_opt, _, stats = learner.step(loss, tx, state.critic, state.critic_opt, state.loss_scale,
                                                    batch, cfg.grad_accum, cfg.precision)
        return state._replace(critic=critic, critic_opt=critic_opt), stats

    def actor_step(state: State, batch: Batch):
        alpha = jnp.exp(state.log_alpha)

        def loss(weights, b: Batch):
            obs = seen(state.params, b.transitions.obs)
            out = actor.apply({"params": weights}, obs).astype(jnp.float32)
            if sac:
                pi = out
                loc, scale = dist.loc_scale(pi)
                u = loc + scale * b.noise
                action, log_prob = jnp.tanh(u), dist.log_prob(pi, u)
            else:
                action, log_prob = jnp.tanh(out[..., :num_dims]), jnp.zeros(obs.shape[:1])
            q = q_value(critics, atoms, state.critic, obs, action)
            q = q.min(0) if (sac and cfg.clipped_double_q) else q.mean(0)
            total = (alpha * log_prob - q).mean()
            return total, {"loss/actor": total, "entropy": -log_prob.mean()}

        weights, actor_opt, _, stats = learner.step(loss, actor_tx, state.params["params"], state.actor_opt,
                                                    state.loss_scale, batch, cfg.grad_accum, cfg.precision)
        params = {**state.params, "params": weights}
        log_alpha, alpha_opt = state.log_alpha, state.alpha_opt
        if sac:  # alpha down while the actor's entropy (all-reduced) is above the target, up while below
            gap = jax.lax.stop_gradient(stats["entropy"] - target_entropy)
            log_alpha, alpha_opt, _, _ = learner.step(lambda la, _: (la * gap, {}), alpha_tx, log_alpha, alpha_opt,
                                                      state.loss_scale, ())
        target_actor = () if sac else target_update(cfg, weights, state.target_actor, state.grad_steps)
        stats = {**stats, "alpha": jnp.exp(log_alpha)}
        return state._replace(params=params, actor_opt=actor_opt, log_alpha=log_alpha, alpha_opt=alpha_opt,
                              target_actor=target_actor), stats

    def critic_steps(state: State, batches: Batch):
        """--policy-delay steps of the critics, each followed by the target critics' update."""
        def one(state, batch):
            state, stats = critic_step(state, batch)
            n = state.grad_steps + 1
            return state._replace(grad_steps=n,
                                  target_critic=target_update(cfg, state.critic, state.target_critic, n)), stats
        return jax.lax.scan(one, state, batches)

    def train_step(state: State, batches: Batch):
        """--policy-delay steps of the critics, then one of the actor (on the last batch)."""
        state, critic_stats = critic_steps(state, batches)
        state, actor_stats = actor_step(state, jax.tree.map(lambda x: x[-1], batches))
        return state, {**jax.tree.map(jnp.mean, critic_stats), **actor_stats}

    def sample(draw, key) -> Batch:
        """This device's share of a gradient step's batch: transitions from `draw(key)` (the
        replay's, or the asynchronous learner's ring's) with their random numbers."""
        sample_key, noise_key = jax.random.split(jax.random.fold_in(key, device_index()))
        t = draw(sample_key)
        keys = jax.vmap(jax.random.split)(vec.env_keys(noise_key, global_indices(batch_per_device)))
        return Batch(t._replace(reward=t.reward * cfg.reward_scale), actor_critic.standard_normal(keys[:, 0], num_dims),
                     actor_critic.standard_normal(keys[:, 1], num_dims))

    def learn_steps(state: State, draw, key):
        """An update's gradient steps on batches from `draw` (what --mode learn's learner runs too)."""
        def one(learning, k):
            batches = jax.vmap(lambda j: sample(draw, jax.random.fold_in(key, j)))(
                k * cfg.policy_delay + jnp.arange(cfg.policy_delay))
            return train_step(learning, batches)
        # the scan carries what the steps change, not the replay and the environments
        learning, stats = jax.lax.scan(one, state._replace(replay=(), envs=()), jnp.arange(grad_steps // cfg.policy_delay))
        return learning._replace(replay=state.replay, envs=state.envs), jax.tree.map(jnp.mean, stats)

    def learn_many(state: State, written, key):
        return learn_steps(state, lambda k: replay_sample(state.replay, written, k, batch_per_device, cfg.n_step,
                                                          cfg.gamma), key)

    def no_learning(state, written, key):
        stats = jax.eval_shape(learn_many, state, written, key)[1]
        return state, jax.tree.map(zeros, stats)

    def update(state: State):
        key, act_key, learn_key = jax.random.split(state.key, 3)
        written = state.update * cfg.num_steps
        envs, replay, obs, steps = rollout(state.params, state.envs, state.replay, act_key, written)
        params = state.params
        if cfg.normalize_obs:
            params = {**params, obs_norm.OBS_STATS: obs_norm.update(params[obs_norm.OBS_STATS], obs)}
        written = written + cfg.num_steps
        state = state._replace(params=params, envs=envs, replay=replay, key=key, update=state.update + 1)
        learning = jnp.logical_and(state.update - 1 >= learn_from, written >= cfg.n_step)
        state, losses = jax.lax.cond(learning, learn_many, no_learning, state, written, learn_key)
        return state, (losses, vec.EpisodeStats.of(steps.done_return, steps.done_length, steps.episode_metrics))

    return Parts(init, update, policy, act, to_env, train_step, sample, learn_steps)


class Parts(NamedTuple):
    """One device's functions of SAC or TD3 (`make`); --mode learn|collect (sac_async.py) runs
    the same `act` and `learn_steps`."""
    init: Any          # key -> State
    update: Any        # State -> State, (losses, episode stats)
    policy: Policy
    act: Any           # (params, obs, keys, global env ids, uniform) -> actions in [-1, 1]
    to_env: Any        # actions in [-1, 1] -> the action space's bounds
    train_step: Any    # State, Batch [policy_delay, ...] -> State, stats
    sample: Any        # (draw: key -> Transitions, key) -> Batch
    learn_steps: Any   # (State, draw, key) -> State, mean stats: an update's gradient steps


LEARNED, OPTIMIZERS = ("params", "critic", "log_alpha"), ("actor_opt", "critic_opt", "alpha_opt")


def algorithm(run: Resolved) -> Algorithm[Parts]:
    parts = make(run.cfg, run.env, run.env_params, run.split)
    return Algorithm(parts.init, parts.update, STATE_LAYOUT, parts.policy,
                     parts=parts, learned=LEARNED, optimizers=OPTIMIZERS)


def policy(run: Resolved) -> Policy:
    return sac_policy(run.cfg, run.env, run.env_params)
