"""PPO for ONE device's slice of the work.

`make(cfg, env, env_params, num_devices)` returns the per-device functions the runner maps
over all devices:

    init(key)      -> PPOState      identical params everywhere (same key), own environments
    update(state)  -> state, (losses, EpisodeStats)

One update: roll out `num_steps` on this device's environments (`lax.scan`), compute GAE,
then `update_epochs` passes of `num_minibatches` minibatches. The only cross-device code is
the fused all-reduces `parallel.all_mean` / `all_sum` (one in each of learner.step,
normalize_per_minibatch and EpisodeStats, and in normalize_rewards): gradients and losses are averaged, advantage
statistics are taken over the global minibatch, so one update on D devices equals one update on one device with the same
global batch. The policy is an MLP or a transformer (nets/actor_critic.py); with a
transformer, minibatches are whole environment sequences instead of shuffled transitions.
Actions come from the action distribution of the env's action space (actor_critic.distribution:
categorical over logits for discrete actions; for Box actions a Gaussian clipped to the bounds
or, with `--action-dist tanh_normal`, Brax's tanh-squashed normal), which is all the rollout
and the loss know about them.

Continuous control at Brax's scale: `--reward-scale` multiplies the rewards the learner sees;
`--normalize-obs` keeps running observation statistics (nets/obs_norm.py) inside the params,
which the optimizer never sees: it updates `params["params"]` alone. As in Brax's PPO, each
rollout's observations (all devices, one all-reduce) update the statistics BEFORE the learner
uses that rollout: the learner then fits the policy as it acts under the new statistics, within
PPO's clip of the policy that collected the rollout. (Updated after the learner, the shift of
the statistics would move the policy outside any clip.)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Share, Resolved
from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.checkpoint import PER_ENV, REPLICATED
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic, factory, obs_norm
from jaxrl_mgpu.parallel import all_mean, all_sum, device_index, global_indices, split_evenly
from jaxrl_mgpu.cli import count


class PPOState(NamedTuple):
    params: Any
    opt_state: Any
    loss_scale: learner.LossScale
    envs: vec.EnvBatch
    memory: Any         # the policy's per-environment memory (a transformer's cache; mlp: ())
    key: jax.Array      # the same on every device; split once per update
    update: jax.Array   # updates done so far
    return_stats: Any   # --normalize-reward: ReturnStats, the same on every device; else ()
    returns: Any        # --normalize-reward: [E] discounted return of each running episode; else ()


class ReturnStats(NamedTuple):
    """Running moments of the discounted return over all environments of all devices."""
    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @staticmethod
    def init() -> "ReturnStats":
        # A tiny prior count, as gym's RunningMeanStd: the first batch all but replaces it.
        return ReturnStats(jnp.zeros(()), jnp.ones(()), jnp.full((), 1e-4))


# Rollout steps per iteration of the compiled loop, on GPUs: there every iteration of a loop
# waits for the host to read its predicate, and each unrolled step is more code to compile.
# 4 keeps nearly all of 8's speed and compiles faster (measurements: experiments/RESULTS.md).
# Elsewhere 1: on CPUs a loop costs no round trip.
GPU_ROLLOUT_UNROLL = 4


def rollout_unroll(env) -> int:
    """The rollout loop's unroll for `env`: GPU_ROLLOUT_UNROLL on GPUs, 1 elsewhere and for an
    environment that says its step is heavy (`heavy_step = True`, e.g. a physics simulation:
    envs/brax_state.py). Such a step is many kernels and milliseconds long, so the loop's round
    trip is lost in it, while every unrolled copy is the whole simulator to compile again."""
    if jax.default_backend() != "gpu" or envs_lib.traits(env).heavy_step:
        return 1
    return GPU_ROLLOUT_UNROLL


def steps_per_update(cfg) -> int:
    return cfg.batch_size  # num_envs x num_steps


# How each state field is laid out over devices (see checkpoint.py).
STATE_LAYOUT = {"params": REPLICATED, "opt_state": REPLICATED, "loss_scale": REPLICATED, "envs": PER_ENV,
                "memory": PER_ENV, "key": REPLICATED, "update": REPLICATED, "return_stats": REPLICATED,
                "returns": PER_ENV}


class Rollout(NamedTuple):
    inputs: Any           # what the policy needs to recompute each step (policy.inputs)
    action: jax.Array     # as sampled: a Gaussian's sample before it is clipped or squashed for the env
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    bootstrap: jax.Array  # V(final observation) where the episode was truncated, else 0
    noise: Any = ()       # the action noise drawn, where the distribution's entropy needs it (samples_entropy)


class Batch(NamedTuple):
    """What the loss needs: transitions [B] (mlp), environment sequences [E, T] (transformer),
    or with --unroll-length N unrolls [U, N] whose advantages the loss computes (`unroll`)."""
    memory: Any
    inputs: Any
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: Any        # [B] or [E, T]; () with --unroll-length
    target: Any           # the value targets, likewise
    unroll: Any = ()      # --unroll-length: Unroll; else ()
    noise: Any = ()       # Rollout.noise, likewise laid out


class Unroll(NamedTuple):
    """What GAE over one unroll of N steps needs besides the values the loss computes."""
    reward: jax.Array       # [U, N] as the learner sees them (scaled, normalised)
    terminated: jax.Array   # [U, N]
    truncated: jax.Array    # [U, N]
    bootstrap: jax.Array    # [U, N] the rollout's V(final observation) where truncated, else 0
    next_inputs: Any        # [U, ...] the observation after the unroll's last step


class Algo(NamedTuple):
    init: Any         # key -> PPOState
    update: Any       # PPOState -> PPOState, (losses, EpisodeStats)
    rollout: Any      # params, EnvBatch, memory, key -> EnvBatch, memory, Rollout, last value, EpisodeStats
    init_params: Any  # key -> params (the same key gives the same params everywhere)
    policy: Any       # nets.actor_critic.Policy


def check(run: Resolved, num_devices: int) -> BatchSplit:
    """The batch layout over `num_devices`, or a ConfigError naming the option that breaks it."""
    cfg = run.cfg
    # A ConfigError for an unsupported action space (or one --action-dist cannot act in)
    dist = actor_critic.distribution(run.env, run.env_params, cfg.action_dist)
    if factory.is_sequence_policy(cfg) and not isinstance(dist, actor_critic.Categorical):
        raise ConfigError(actor_critic.transformer_refusal(cfg.env))
    if isinstance(dist, actor_critic.Categorical) and cfg.action_dist != "clipped_normal":
        raise ConfigError(f"--action-dist {cfg.action_dist} is for Box (continuous) actions; --env {cfg.env} has "
                          f"discrete actions, which take a categorical distribution")
    if not factory.is_sequence_policy(cfg):
        factory.hidden_layers(cfg)  # a ConfigError for --actor-hidden / --critic-hidden that are no widths
    envs_per_device = split_evenly(cfg.num_envs, num_devices, "--num-envs")
    per_device_batch = envs_per_device * cfg.num_steps
    if factory.is_sequence_policy(cfg) and envs_per_device % cfg.num_minibatches:
        raise ConfigError(
            f"--num-minibatches {cfg.num_minibatches} must divide the {envs_per_device} environments per device "
            f"(--num-envs {cfg.num_envs} / {count(num_devices, 'device')}): transformer minibatches are whole sequences")
    if per_device_batch % cfg.num_minibatches:
        raise ConfigError(
            f"--num-minibatches {cfg.num_minibatches} does not divide the per-device batch of {per_device_batch} "
            f"transitions (--num-envs {cfg.num_envs} / {count(num_devices, 'device')} x --num-steps {cfg.num_steps})")
    if cfg.unroll_length:
        unrolls_per_device = envs_per_device * (cfg.num_steps // cfg.unroll_length)
        if cfg.num_steps % cfg.unroll_length:
            raise ConfigError(f"--unroll-length {cfg.unroll_length} does not divide --num-steps {cfg.num_steps}")
        if unrolls_per_device % cfg.num_minibatches:
            raise ConfigError(f"--num-minibatches {cfg.num_minibatches} does not divide the {unrolls_per_device} "
                              f"unrolls per device (--num-envs {cfg.num_envs} / {count(num_devices, 'device')} x "
                              f"--num-steps {cfg.num_steps} / --unroll-length {cfg.unroll_length})")
        if cfg.grad_accum > 1:
            raise ConfigError("--unroll-length normalises the advantages of each minibatch as its loss computes "
                              "them; --grad-accum would split that minibatch: use --grad-accum 1")
    minibatch = per_device_batch // cfg.num_minibatches
    if minibatch % cfg.grad_accum or (factory.is_sequence_policy(cfg) and
                                      (envs_per_device // cfg.num_minibatches) % cfg.grad_accum):
        raise ConfigError(f"--grad-accum {cfg.grad_accum} does not divide the per-device minibatch "
                          f"({minibatch} transitions, {envs_per_device // cfg.num_minibatches} environments)")
    return BatchSplit(num_devices, environments=Share(cfg.num_envs, envs_per_device),
                      minibatch=Share(cfg.batch_size // cfg.num_minibatches, minibatch))


def learning_targets(cfg, traj: Rollout, last_value: jax.Array, return_stats, returns):
    """What the learner fits, from a rollout: GAE of its `learner_rewards`. Returns the
    advantages, the value targets, and the return statistics and running returns to carry."""
    traj, return_stats, returns = learner_rewards(cfg, traj, return_stats, returns)
    advantages, targets = gae(cfg, traj, last_value)
    return advantages, targets, return_stats, returns


def learner_rewards(cfg, traj: Rollout, return_stats, returns):
    """The rollout with the rewards the learner sees: times --reward-scale, then (with
    --normalize-reward) divided by the return's running standard deviation; and the return
    statistics and running returns to carry."""
    traj = traj._replace(reward=traj.reward * cfg.reward_scale)
    if cfg.normalize_reward:
        traj, return_stats, returns = normalize_rewards(cfg, traj, return_stats, returns)
    return traj, return_stats, returns


def unrolls(cfg, traj: Rollout, next_inputs) -> Batch:
    """--unroll-length N: the rollout [T, E] cut into T / N x E unrolls [U, N] of N steps of one
    environment each (Brax's PPO batch); `next_inputs` [E, ...] is what the policy sees after the
    rollout's last step. The advantages are left to the loss (`unroll_targets`)."""
    n = cfg.unroll_length

    def cut(x):  # [T, E, ...] -> [T/N, N, E, ...] -> [T/N, E, N, ...] -> [U, N, ...]
        x = jnp.moveaxis(x.reshape((x.shape[0] // n, n) + x.shape[1:]), 1, 2)
        return x.reshape((-1, n) + x.shape[3:])

    # The observation after unroll k is the first of unroll k + 1 (after the last: next_inputs).
    after = jax.tree.map(lambda x, last: jnp.concatenate([x[n::n], last[None]]).reshape((-1,) + last.shape[1:]),
                         traj.inputs, next_inputs)
    unroll = Unroll(cut(traj.reward), cut(traj.terminated), cut(traj.truncated), cut(traj.bootstrap), after)
    return Batch((), jax.tree.map(cut, traj.inputs), cut(traj.action), cut(traj.log_prob), cut(traj.value), (), (),
                 unroll, jax.tree.map(cut, traj.noise))


def gae(cfg, traj: Rollout, last_value: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Advantages and value targets. Terminated steps do not bootstrap; truncated ones
    bootstrap from the value of the observation before the auto-reset."""
    next_value = jnp.concatenate([traj.value[1:], last_value[None]], axis=0)
    next_value = jnp.where(traj.truncated > 0, traj.bootstrap, next_value)
    delta = traj.reward + cfg.gamma * next_value * (1.0 - traj.terminated) - traj.value
    episode_ends = jnp.maximum(traj.terminated, traj.truncated)

    # adv_t = delta_t + c_t * adv_{t+1} is a linear recurrence: an associative scan over the
    # affine maps x -> delta_t + c_t * x needs no loop. A `lax.scan` here is a while loop, and
    # on GPUs every iteration of one waits for the host to read its predicate.
    decay = cfg.gamma * cfg.gae_lambda * (1.0 - episode_ends)

    def compose(later, earlier):  # earlier-step map applied after the later steps' composition
        return earlier[0] * later[0], earlier[1] + earlier[0] * later[1]

    _, adv = jax.lax.associative_scan(compose, (decay, delta), reverse=True)
    return adv, adv + traj.value


def normalize_rewards(cfg, traj: Rollout, stats: ReturnStats, returns: jax.Array):
    """--normalize-reward: the rollout with its rewards divided by the standard deviation of the
    discounted return G_t = r_t + gamma G_{t-1} (restarted after every episode end), whose
    running moments are first updated with this rollout's G of all devices. Returns the rollout,
    the new statistics and each environment's G to carry into the next rollout.

    Returns, not rewards, set the scale, so that value targets come out near unit size whatever
    the env's reward scale, which the value clipping (an absolute clip_eps) and the gradient
    clipping assume. One update of the statistics per rollout, from all its steps at once,
    takes one all-reduce (per step, as gym's wrapper does, would take one in every step)."""
    ends = jnp.maximum(traj.terminated, traj.truncated)
    # G_t = b_t + a_t G_{t-1} is a linear recurrence: an associative scan, as in gae. The carried
    # G (zero where the last rollout ended an episode) enters through step 0's offset.
    decay = cfg.gamma * jnp.concatenate([jnp.zeros_like(ends[:1]), 1.0 - ends[:-1]])
    offset = traj.reward.at[0].add(cfg.gamma * returns)

    def compose(earlier, later):
        return later[0] * earlier[0], later[1] + later[0] * earlier[1]

    _, g = jax.lax.associative_scan(compose, (decay, offset))
    # Moments about the running mean (less cancellation in float32), summed over all devices.
    d = g - stats.mean
    s1, s2, n = all_sum(jnp.stack([d.sum(), jnp.square(d).sum(), jnp.float32(d.size)]))
    delta = s1 / n                                    # batch mean - running mean
    batch_var = jnp.maximum(s2 / n - jnp.square(delta), 0.0)
    total = stats.count + n
    m2 = stats.var * stats.count + batch_var * n + jnp.square(delta) * stats.count * n / total
    stats = ReturnStats(stats.mean + delta * n / total, m2 / total, total)
    traj = traj._replace(reward=traj.reward / jnp.sqrt(stats.var + 1e-8))
    return traj, stats, g[-1] * (1.0 - ends[-1])


def unroll_targets(cfg, batch: Batch, value: jax.Array, next_value: jax.Array):
    """--unroll-length: the advantages (normalised over the minibatch of all devices) and value
    targets of a minibatch of unrolls [U, N], by GAE with the critic's current `value` [U, N]
    and `next_value` [U] of the observation after each unroll, as Brax's PPO computes them in
    its loss. A step its time limit ended bootstraps from the rollout's value of its final
    observation (Brax drops such steps from the loss instead)."""
    u = batch.unroll
    steps = Rollout((), (), (), *(jax.lax.stop_gradient(x).T for x in (value, u.reward, u.terminated, u.truncated,
                                                                         u.bootstrap)))
    adv, target = gae(cfg, steps, jax.lax.stop_gradient(next_value))
    return normalize_per_minibatch(adv.T[None, None])[0, 0], target.T


def clipped_surrogate(log_ratio: jax.Array, advantages: jax.Array, clip_eps: float) -> tuple:
    """PPO's clipped policy loss, the KL estimate (ratio - 1) - log(ratio) and whether the ratio
    was clipped, per sample, from the log-ratio of the new and the rollout's log-probs. The KL
    takes the log-ratio itself, never log(exp(...)): a sample whose density fell by more than
    e^-88 (a narrow scale that moved off it) has ratio 0 in float32, where log(0) = -inf would
    make the update non-finite although that sample's policy loss and gradient are 0."""
    ratio = jnp.exp(log_ratio)
    policy_loss = -jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * advantages)
    return policy_loss, (ratio - 1) - log_ratio, (jnp.abs(ratio - 1) > clip_eps).astype(jnp.float32)


def normalize_per_minibatch(adv: jax.Array) -> jax.Array:
    """Advantages [epochs, minibatches, ...per device] -> (adv - mean) / std, each minibatch
    with the mean and std of that minibatch over ALL devices. One all-reduce for all of them."""
    flat = adv.reshape(adv.shape[:2] + (-1,))
    moments = all_mean(jnp.stack([flat.mean(-1), jnp.square(flat).mean(-1)]))
    mean, var = moments[0], jnp.maximum(moments[1] - jnp.square(moments[0]), 0.0)
    shape = adv.shape[:2] + (1,) * (adv.ndim - 2)
    return (adv - mean.reshape(shape)) / (jnp.sqrt(var).reshape(shape) + 1e-8)


def make(cfg, env, env_params, split: BatchSplit) -> Algo:
    policy = actor_critic.make(cfg, env, env_params)
    dist = policy.dist
    tx = learner.adam(cfg, cfg.total_updates * cfg.update_epochs * cfg.num_minibatches)
    envs_per_device = split.environments.per_device
    unroll = rollout_unroll(env)
    pipelined = vec.pipelined(env, envs_per_device, memoryless=not jax.tree.leaves(policy.init_memory(1)))

    def init(key: jax.Array) -> PPOState:
        params_key, env_key, key = jax.random.split(key, 3)
        params = policy.init_params(params_key)
        envs = vec.reset(env, env_params, env_key, global_indices(envs_per_device))
        normalizer = (ReturnStats.init(), jnp.zeros(envs_per_device)) if cfg.normalize_reward else ((), ())
        # The optimizer sees the weights only: not the observation statistics beside them.
        return PPOState(params, tx.init(params["params"]), learner.LossScale.init(cfg.precision), envs,
                        policy.init_memory(envs_per_device), key, jnp.zeros((), jnp.int32), *normalizer)

    def rollout(params, envs: vec.EnvBatch, memory, key: jax.Array):
        """`num_steps` steps of this device's environments; also returns V(last observation)."""
        ids = global_indices(envs_per_device)

        def draws(t):
            """Step t's randomness, per environment from (key, t, global index) alone."""
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t), ids))
            return dist.noise(keys[:, 0]), keys[:, 1]

        # All of the rollout's random numbers in one batched op before the loop, instead of a
        # few small kernels in every step of it.
        noise, env_keys = jax.vmap(draws)(jnp.arange(cfg.num_steps))
        metric_names = envs_lib.episode_metrics(env)

        def scalars_of(log_prob, value, prev_bootstrap, out: vec.Step):
            # The per-environment scalars leave the loop as ONE [E, 8 + metrics] array: each scan
            # output is one more small kernel in every step, and steps are what a rollout is made of.
            return jnp.stack([log_prob, value, out.reward, out.terminated.astype(jnp.float32),
                              out.truncated.astype(jnp.float32), prev_bootstrap, out.done_return,
                              out.done_length.astype(jnp.float32),
                              *(out.episode_metrics[name] for name in metric_names)], -1)

        def step(carry, xs):
            envs, memory, prev_final_obs = carry
            action_noise, step_keys = xs
            inputs = policy.inputs(memory, envs.obs)
            pi, value, prev_bootstrap, memory = policy.act(params, memory, envs.obs, prev_final_obs)
            action = dist.sample(pi, action_noise)
            # The env gets the action within its bounds; the log-prob is of the sample itself.
            next_envs, out = vec.step(env, env_params, envs, dist.to_env(action), step_keys)
            memory = policy.remember(memory, action, out.reward, out.terminated | out.truncated)
            scalars = scalars_of(dist.log_prob(pi, action), value, prev_bootstrap, out)
            return (next_envs, memory, out.final_obs), (inputs, action, scalars)

        def act(obs, prev_final_obs, action_noise):  # one half of a pipelined batch (memoryless)
            pi, value, prev_bootstrap, _ = policy.act(params, memory, obs, prev_final_obs)
            action = dist.sample(pi, action_noise)
            return dist.to_env(action), (policy.inputs(memory, obs), action, dist.log_prob(pi, action), value,
                                         prev_bootstrap)

        if pipelined:
            envs, final_obs, (inputs, action, log_prob, value, prev_bootstrap), out = vec.scan_halves(
                env, env_params, envs, envs.obs, act, noise, env_keys)
            scalars = scalars_of(log_prob, value, prev_bootstrap, out)
        else:
            (envs, memory, final_obs), (inputs, action, scalars) = jax.lax.scan(
                step, (envs, memory, envs.obs), (noise, env_keys), unroll=unroll)
        columns = jnp.moveaxis(scalars, -1, 0)
        log_prob, value, reward, terminated, truncated, prev_bootstrap, done_return, done_length = columns[:8]
        ended_metrics = dict(zip(metric_names, columns[8:]))
        _, last_value, last_bootstrap, _ = policy.act(params, memory, envs.obs, final_obs)
        # Step t's bootstrap was computed at step t + 1 (the last one just above).
        bootstrap = jnp.concatenate([prev_bootstrap[1:], last_bootstrap[None]])
        traj = Rollout(inputs, action, log_prob, value, reward, terminated, truncated,
                       jnp.where(truncated > 0, bootstrap, 0.0), noise if dist.samples_entropy else ())
        return envs, memory, traj, last_value, vec.EpisodeStats.of(done_return, done_length, ended_metrics)

    def loss_fn(params, batch: Batch):
        pi, value = policy.evaluate(params, batch.memory, batch.inputs)
        if cfg.unroll_length:
            advantages, targets = unroll_targets(cfg, batch, value,
                                                 policy.evaluate(params, (), batch.unroll.next_inputs)[1])
        else:
            advantages, targets = batch.advantage, batch.target
        policy_loss, approx_kl, clip_frac = (x.mean() for x in clipped_surrogate(
            dist.log_prob(pi, batch.action) - batch.log_prob, advantages, cfg.clip_eps))
        value_loss = jnp.square(value - targets)
        if cfg.clip_value:
            value_clipped = batch.value + jnp.clip(value - batch.value, -cfg.clip_eps, cfg.clip_eps)
            value_loss = jnp.maximum(value_loss, jnp.square(value_clipped - targets))
        value_loss = 0.5 * value_loss.mean()
        entropy = dist.entropy(pi, batch.noise).mean()
        total = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
        stats = {"loss/total": total, "loss/policy": policy_loss, "loss/value": value_loss,
                 "loss/entropy": entropy, "loss/approx_kl": approx_kl, "loss/clip_frac": clip_frac}
        return total, stats

    def learn(params, opt_state, loss_scale, data: Batch, key):
        """`update_epochs` passes over the rollout in `num_minibatches` shuffled minibatches:
        of transitions (mlp), or of whole environment sequences (transformer). The optimizer
        steps `params["params"]`; the rest of `params` (observation statistics) stays as it is."""
        def split(x, perm):  # shuffled, then cut into minibatches: [num_minibatches, ...]
            return x[perm].reshape((cfg.num_minibatches, -1) + x.shape[1:])

        n = jax.tree.leaves(data.action)[0].shape[0]
        # Every epoch's shuffle drawn before the loop, each device its own (device index folded
        # in), so all epochs' advantage moments take ONE all-reduce: each collective is a point
        # where devices wait for each other. One sort per epoch, not a vmapped (batched) sort,
        # which is much slower on GPUs at large n.
        perms = jnp.stack([jax.random.permutation(jax.random.fold_in(k, device_index()), n)
                           for k in jax.random.split(key, cfg.update_epochs)])
        # --unroll-length: none here (the loss computes each minibatch's advantages itself).
        advantages = () if cfg.unroll_length else normalize_per_minibatch(
            jax.vmap(lambda perm: split(data.advantage, perm))(perms))

        def loss_of_weights(weights, batch: Batch):
            return loss_fn({**params, "params": weights}, batch)

        def epoch(carry, xs):
            perm, epoch_advantages = xs  # the advantages come already shuffled and normalized
            minibatches = jax.tree.map(lambda x: split(x, perm), data._replace(advantage=()))
            minibatches = minibatches._replace(advantage=epoch_advantages)
            return learner.steps(loss_of_weights, tx, carry, minibatches, cfg.grad_accum, cfg.precision)

        (weights, opt_state, loss_scale), stats = jax.lax.scan(
            epoch, (params["params"], opt_state, loss_scale), (perms, advantages))
        return {**params, "params": weights}, opt_state, loss_scale, jax.tree.map(jnp.mean, stats)

    def update(state: PPOState):
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        envs, memory, traj, last_value, episodes = rollout(state.params, state.envs, state.memory, rollout_key)
        if cfg.unroll_length:  # unrolls [U, N]; the loss computes their advantages with its critic
            traj, return_stats, returns = learner_rewards(cfg, traj, state.return_stats, state.returns)
            data = unrolls(cfg, traj, policy.inputs(memory, envs.obs))
        else:
            advantages, targets, return_stats, returns = learning_targets(cfg, traj, last_value,
                                                                          state.return_stats, state.returns)
            data = Batch(state.memory, traj.inputs, traj.action, traj.log_prob, traj.value, advantages, targets,
                         noise=traj.noise)
            if policy.sequences:  # [T, E, ...] -> [E, T, ...]: minibatches of whole environments
                data = data._replace(**{f: jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), getattr(data, f))
                                        for f in Batch._fields if f not in ("memory", "unroll")})
            else:  # [T, E, ...] -> [T * E, ...]: minibatches of shuffled transitions
                data = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), data)
        params = state.params
        if cfg.normalize_obs:  # the statistics first, then the learner (the module's docstring says why)
            params = {**params, obs_norm.OBS_STATS: obs_norm.update(state.params[obs_norm.OBS_STATS], traj.inputs)}
        params, opt_state, loss_scale, losses = learn(params, state.opt_state, state.loss_scale, data,
                                                      learn_key)
        new = PPOState(params, opt_state, loss_scale, envs, memory, key, state.update + 1, return_stats, returns)
        return new, (losses, episodes)

    return Algo(init, update, rollout, policy.init_params, policy)


def algorithm(run: Resolved) -> Algorithm[Algo]:
    algo = make(run.cfg, run.env, run.env_params, run.split)
    return Algorithm(algo.init, algo.update, STATE_LAYOUT, algo.policy,
                     parts=algo)


def policy(run: Resolved) -> actor_critic.Policy:
    """The actor-critic of PPO's options (--policy, --actor-hidden, ...) for the run's environment."""
    return actor_critic.make(run.cfg, run.env, run.env_params)


# What the progress line shows of a PPO update (its spec's console; multi-agent PPO's too).
CONSOLE = (("policy", "loss/policy", ".3f"), ("value", "loss/value", ".3f"), ("kl", "loss/approx_kl", ".4f"),
           ("clip", "loss/clip_frac", ".3f"))
