"""Multi-agent PPO for ONE device's slice of the work: the Tag games of envs/tag.py, or any
environment with an agent axis inside it (`envs.is_multi_agent`).

Agents are a batch axis next to the environments: a rollout is `[T, E, agents]`. Each team
(the env's `teams`, e.g. taggers and runners) has its own policy and value network, shared by
all of its agents (WarpDrive's policy-to-agents map), and the teams learn in the same update:
one loss, the sum of each team's PPO loss, one gradient with a part per team, averaged over
devices by the same all-reduce as single-agent PPO (learner.step), and an optimizer per team
(clipping and Adam do not mix the teams' gradients).

What differs from single-agent PPO (ppo.py, whose GAE this reuses):
- an agent that leaves the game (a tagged runner) ends its own episode there: that step is
  terminal for it, and its later steps in the same game are masked out of the loss;
- each team's loss is the mean over its agents' (unmasked) transitions, and advantages are
  normalized per team; counts and moments are taken over the global minibatch (one all-reduce
  for all epochs), so one update on D devices equals one update on one device;
- metrics per team: mean episode return per agent, tags per episode, episode length.

`--algo ppo` on a multi-agent env runs this (plan.spec_for); `--policy transformer`,
`--normalize-reward` and the other algorithms are refused there (config.validate), as are
`--normalize-obs`, `--reward-scale`, `--no-clip-value` and `--action-dist` (`check`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_mgpu.algos import learner
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Evaluation, Resolved, Share
from jaxrl_mgpu.checkpoint import PER_ENV, REPLICATED
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic, factory
from jaxrl_mgpu.parallel import AXIS, all_sum, device_index, global_indices, split_evenly
from jaxrl_mgpu.cli import count

steps_per_update = ppo.steps_per_update


class State(NamedTuple):
    params: Any         # {team: params of its network}
    opt_state: Any      # {team: its optimizer's state} (optax.multi_transform)
    loss_scale: learner.LossScale
    envs: vec.EnvBatch
    key: jax.Array      # the same on every device; split once per update
    update: jax.Array


STATE_LAYOUT = {"params": REPLICATED, "opt_state": REPLICATED, "loss_scale": REPLICATED, "envs": PER_ENV,
                "key": REPLICATED, "update": REPLICATED}


class Batch(NamedTuple):
    """Transitions [B] of whole games: every field has the agent axis after B."""
    obs: jax.Array        # [B, A, obs_dim]
    action: jax.Array     # [B, A]
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    target: jax.Array
    weight: jax.Array     # the transition's share of its team's mean (0: the agent had left)


class Algo(NamedTuple):
    init: Any
    update: Any
    rollout: Any
    init_params: Any
    policy: Any           # actor_critic.Policy over observations [n, agents, obs_dim]
    teams: dict           # {team: (first agent, end)}


def check(run: Resolved, num_devices: int) -> BatchSplit:
    cfg = run.cfg
    if (cfg.policy, cfg.mode, cfg.normalize_reward) != ("mlp", "both", False):
        raise ConfigError(f"--env {cfg.env} is a multi-agent game: it trains with --algo {cfg.algo} --policy mlp (one "
                          f"network per team) in --mode both, without --normalize-reward")
    unsupported = [flag for flag, given in (("--normalize-obs", cfg.normalize_obs),
                                            ("--reward-scale", cfg.reward_scale != 1.0),
                                            ("--no-clip-value", not cfg.clip_value),
                                            (f"--unroll-length {cfg.unroll_length}", cfg.unroll_length > 0),
                                            (f"--action-dist {cfg.action_dist}", cfg.action_dist != "clipped_normal"))
                   if given]
    if unsupported:
        raise ConfigError(f"--env {cfg.env} is a multi-agent game, whose PPO (one network per team, categorical "
                          f"actions) does not take {', '.join(unsupported)}")
    factory.hidden_layers(cfg)  # a ConfigError for --actor-hidden / --critic-hidden that are no widths
    envs_per_device = split_evenly(cfg.num_envs, num_devices, "--num-envs")
    per_device_batch = envs_per_device * cfg.num_steps
    if per_device_batch % cfg.num_minibatches:
        raise ConfigError(
            f"--num-minibatches {cfg.num_minibatches} does not divide the per-device batch of {per_device_batch} "
            f"game steps (--num-envs {cfg.num_envs} / {count(num_devices, 'device')} x --num-steps {cfg.num_steps})")
    if (per_device_batch // cfg.num_minibatches) % cfg.grad_accum:
        raise ConfigError(f"--grad-accum {cfg.grad_accum} does not divide the per-device minibatch of "
                              f"{per_device_batch // cfg.num_minibatches} game steps")
    return BatchSplit(num_devices, environments=Share(cfg.num_envs, envs_per_device),
                      minibatch=Share(cfg.batch_size // cfg.num_minibatches, per_device_batch // cfg.num_minibatches))


def team_policy(cfg, env, env_params) -> actor_critic.Policy:
    """One MLP actor-critic per team, applied to that team's agents (a static slice of the agent
    axis); pi and values come back over all agents, in agent order."""
    obs_shape = env.observation_space(env_params).shape[1:]
    net = factory.actor_critic_mlp(cfg, action_distribution(env).num_outputs, len(obs_shape), learned_log_std=False)
    teams = env.teams

    def init_params(key):
        keys = jax.random.split(key, len(teams))
        return {name: net.init(k, jnp.zeros((1,) + obs_shape)) for name, k in zip(teams, keys)}

    def per_team(fn, *xs):
        outs = [fn(params_name, *(x[:, a:b] for x in xs)) for params_name, (a, b) in teams.items()]
        return tuple(jnp.concatenate(parts, axis=1) for parts in zip(*outs))

    def act(params, memory, obs, final_obs):
        pi, value, bootstrap = per_team(lambda name, o, f: net.apply(params[name], o, f, method=net.act),
                                        obs, final_obs)
        return pi, value, bootstrap, memory

    def evaluate(params, memory0, obs):
        return per_team(lambda name, o: net.apply(params[name], o), obs)

    return actor_critic.Policy(init_params, lambda n: (), act, lambda memory, *_: memory,
                               lambda memory, obs: obs, evaluate, sequences=False)


class Factored:
    """Independent categorical choices per agent, one per factor of the env's action (its
    `action_factors`: the continuous game's (acceleration, turn) levels, WarpDrive's
    MultiDiscrete pair; one factor in the gridworld). The network gives sum(sizes) logits, one
    softmax per factor, and the env gets the flat index sum_f digit_f * prod(sizes after f).
    Factored heads are what WarpDrive's policies have: 21 + 21 logits instead of a joint 441,
    whose softmax over every agent of every step would be most of the memory traffic."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = tuple(sizes)
        self.num_outputs = sum(self.sizes)

    def _groups(self, logits):
        bounds = np.cumsum(self.sizes)[:-1].tolist()
        return jnp.split(logits, bounds, axis=-1)

    def _digits(self, action):
        digits, rest = [], action
        for size in reversed(self.sizes):
            digits.append(rest % size)
            rest = rest // size
        return digits[::-1]

    def noise(self, keys: jax.Array, num_agents: int) -> jax.Array:
        """[n, agents, factors] uniforms, row i from keys[i]: one per choice (inverse-CDF
        sampling, where Gumbel-max would take one per action)."""
        return jax.vmap(lambda k: jax.random.uniform(k, (num_agents, len(self.sizes))))(keys)

    def sample(self, logits, u):
        action = jnp.zeros(logits.shape[:-1], jnp.int32)
        for f, (group, size) in enumerate(zip(self._groups(logits), self.sizes)):
            cdf = jnp.cumsum(jax.nn.softmax(group), -1)
            digit = jnp.minimum((cdf < u[..., f:f + 1] * cdf[..., -1:]).sum(-1), size - 1)
            action = action * size + digit
        return action

    def mode(self, logits):
        action = jnp.zeros(logits.shape[:-1], jnp.int32)
        for group, size in zip(self._groups(logits), self.sizes):
            action = action * size + jnp.argmax(group, -1)
        return action

    def log_prob(self, logits, action):
        return sum(actor_critic.log_prob(group, digit) for group, digit in zip(self._groups(logits), self._digits(action)))

    def entropy(self, logits):
        def one(group):
            log_p = jax.nn.log_softmax(group)
            return -(jnp.exp(log_p) * log_p).sum(-1)
        return sum(one(group) for group in self._groups(logits))


def action_distribution(env) -> Factored:
    return Factored(envs_lib.traits(env).action_factors or (env.num_actions,))


def team_sums(x: jax.Array, teams: dict) -> jax.Array:
    """[..., agents] -> [..., teams]: sums over each team's agents."""
    return jnp.stack([x[..., a:b].sum(-1) for a, b in teams.values()], -1)


def by_agent(x: jax.Array, teams: dict) -> jax.Array:
    """[..., teams] -> [..., agents]: each agent gets its team's value."""
    return jnp.concatenate([jnp.repeat(x[..., k:k + 1], b - a, -1) for k, (a, b) in enumerate(teams.values())], -1)


def make(cfg, env, env_params, split: BatchSplit) -> Algo:
    policy = team_policy(cfg, env, env_params)
    teams, num_agents = env.teams, env.num_agents
    dist = action_distribution(env)
    steps_per_team = cfg.total_updates * cfg.update_epochs * cfg.num_minibatches
    tx = optax.multi_transform({name: learner.adam(cfg, steps_per_team) for name in teams},
                               {name: name for name in teams})
    envs_per_device = split.environments.per_device
    unroll = ppo.rollout_unroll(env)

    def init(key: jax.Array) -> State:
        params_key, env_key, key = jax.random.split(key, 3)
        params = policy.init_params(params_key)
        envs = vec.reset(env, env_params, env_key, global_indices(envs_per_device))
        return State(params, tx.init(params), learner.LossScale.init(cfg.precision), envs, key,
                     jnp.zeros((), jnp.int32))

    def rollout(params, envs: vec.EnvBatch, key: jax.Array):
        """`num_steps` steps of this device's games: a ppo.Rollout whose per-agent fields are
        [T, E, agents] (an agent that left the game ends its episode where it left), the mask
        of agents still in the game at each step, V(last observation), and the episode sums."""
        ids = global_indices(envs_per_device)

        def draws(t):
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t), ids))
            return dist.noise(keys[:, 0], num_agents), keys[:, 1]

        noise, env_keys = jax.vmap(draws)(jnp.arange(cfg.num_steps))

        def step(carry, xs):
            envs, prev_final_obs = carry
            action_noise, step_keys = xs
            logits, value, prev_bootstrap, _ = policy.act(params, (), envs.obs, prev_final_obs)
            action = dist.sample(logits, action_noise)
            next_envs, out = vec.step(env, env_params, envs, action, step_keys)
            was_in = envs.state.active
            left = was_in & ~out.info["active"]          # e.g. a runner tagged in this step
            terminated = out.terminated[:, None] | left
            truncated = out.truncated[:, None] & ~left
            per_agent = jnp.stack([dist.log_prob(logits, action), value, out.reward,
                                   terminated.astype(jnp.float32), truncated.astype(jnp.float32), prev_bootstrap,
                                   was_in.astype(jnp.float32), out.done_return], -1)
            ended = out.done_length > 0
            per_game = jnp.stack([out.done_length.astype(jnp.float32),
                                  jnp.where(ended, out.info["episode_tags"], 0).astype(jnp.float32)], -1)
            return (next_envs, out.final_obs), (envs.obs, action, per_agent, per_game)

        (envs, final_obs), (obs, action, per_agent, per_game) = jax.lax.scan(
            step, (envs, envs.obs), (noise, env_keys), unroll=unroll)
        log_prob, value, reward, terminated, truncated, prev_bootstrap, mask, done_return = jnp.moveaxis(per_agent, -1, 0)
        done_length, done_tags = jnp.moveaxis(per_game, -1, 0)
        _, last_value, last_bootstrap, _ = policy.act(params, (), envs.obs, final_obs)
        bootstrap = jnp.concatenate([prev_bootstrap[1:], last_bootstrap[None]])
        traj = ppo.Rollout(obs, action, log_prob, value, reward, terminated, truncated,
                           jnp.where(truncated > 0, bootstrap, 0.0))
        return envs, traj, mask, last_value, episode_sums(done_return, done_length, done_tags)

    def episode_sums(done_return, done_length, done_tags) -> dict:
        """Sums over the games that ended (all devices): per team the mean return of its agents."""
        ended = done_length > 0
        sizes = jnp.array([b - a for a, b in teams.values()], jnp.float32)
        team_returns = (team_sums(done_return, teams) / sizes).sum(tuple(range(done_return.ndim - 1)))
        sums = {"episodes": ended.sum().astype(jnp.float32), "episode_length": done_length.sum(),
                "episode_return": done_return.mean(-1).sum(),  # the mean over all agents
                "tags_per_episode": done_tags.sum(),
                **{f"{name}/episode_return": team_returns[k] for k, name in enumerate(teams)}}
        return all_sum(sums)

    def loss_fn(params, batch: Batch):
        logits, value = policy.evaluate(params, (), batch.obs)
        policy_loss, approx_kl, clip_frac = ppo.clipped_surrogate(
            dist.log_prob(logits, batch.action) - batch.log_prob, batch.advantage, cfg.clip_eps)
        value_clipped = batch.value + jnp.clip(value - batch.value, -cfg.clip_eps, cfg.clip_eps)
        value_loss = 0.5 * jnp.maximum(jnp.square(value - batch.target), jnp.square(value_clipped - batch.target))
        entropy = dist.entropy(logits)
        terms = {"loss/policy": policy_loss, "loss/value": value_loss, "loss/entropy": entropy,
                 "loss/approx_kl": approx_kl, "loss/clip_frac": clip_frac}
        # Each team's mean over its agents' transitions (the weights hold the team's count).
        means = {k: team_sums((batch.weight * v).sum(0), teams) for k, v in terms.items()}
        team_total = means["loss/policy"] + cfg.vf_coef * means["loss/value"] - cfg.ent_coef * means["loss/entropy"]
        stats = {f"{name}/{k}": v[i] for k, v in means.items() for i, name in enumerate(teams)}
        return team_total.sum(), {"loss/total": team_total.sum(), **stats}

    def learn(params, opt_state, loss_scale, data: Batch, mask: jax.Array, key):
        """`update_epochs` passes in `num_minibatches` shuffled minibatches of game steps; per
        minibatch and team, the advantage moments and the count of transitions (agents still in
        the game) over all devices, all in one all-reduce."""
        def split_(x, perm):
            return x[perm].reshape((cfg.num_minibatches, -1) + x.shape[1:])

        n = data.action.shape[0]
        perms = jnp.stack([jax.random.permutation(jax.random.fold_in(k, device_index()), n)
                           for k in jax.random.split(key, cfg.update_epochs)])
        adv, mask = (jax.vmap(lambda perm: split_(x, perm))(perms) for x in (data.advantage, mask))
        # [epochs, minibatches, teams] counts and sums of this device's minibatch parts
        moments = all_sum(jnp.stack([team_sums(mask.sum(2), teams), team_sums((mask * adv).sum(2), teams),
                                     team_sums((mask * jnp.square(adv)).sum(2), teams)]))
        count = jnp.maximum(moments[0], 1.0)
        mean = moments[1] / count
        std = jnp.sqrt(jnp.maximum(moments[2] / count - jnp.square(mean), 0.0))
        expand = lambda x: by_agent(x, teams)[:, :, None]  # noqa: E731  [epochs, mbs, 1, agents]
        adv = (adv - expand(mean)) / (expand(std) + 1e-8)
        # The gradients are averaged over the D devices, so a device's share of a team's global
        # mean is weighted D / (global count).
        # learner.step also averages over the --grad-accum micro-batches of a minibatch.
        weight = mask * (jax.lax.axis_size(AXIS) * cfg.grad_accum) / expand(count)

        def epoch(carry, xs):
            perm, epoch_adv, epoch_weight = xs
            minibatches = jax.tree.map(lambda x: split_(x, perm), data._replace(advantage=(), weight=()))
            minibatches = minibatches._replace(advantage=epoch_adv, weight=epoch_weight)
            return learner.steps(loss_fn, tx, carry, minibatches, cfg.grad_accum, cfg.precision)

        carry, stats = jax.lax.scan(epoch, (params, opt_state, loss_scale), (perms, adv, weight))
        return (*carry, jax.tree.map(jnp.mean, stats))

    def update(state: State):
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        envs, traj, mask, last_value, episodes = rollout(state.params, state.envs, rollout_key)
        advantages, targets = ppo.gae(cfg, traj, last_value)
        data = Batch(traj.inputs, traj.action, traj.log_prob, traj.value, advantages, targets, ())
        data = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), data)   # [T, E, ...] -> [T * E, ...]
        params, opt_state, loss_scale, losses = learn(state.params, state.opt_state, state.loss_scale, data,
                                                      mask.reshape((-1,) + mask.shape[2:]), learn_key)
        return State(params, opt_state, loss_scale, envs, key, state.update + 1), (losses, episodes)

    return Algo(init, update, rollout, policy.init_params, policy, teams)


def algorithm(run: Resolved) -> Algorithm[Algo]:
    algo = make(run.cfg, run.env, run.env_params, run.split)
    return Algorithm(algo.init, algo.update, STATE_LAYOUT, algo.policy,
                     parts=algo, agents_per_env=run.env.num_agents, evaluation=evaluation(run, algo.policy))


def policy(run: Resolved) -> actor_critic.Policy:
    return team_policy(run.cfg, run.env, run.env_params)


# -- evaluation: trained teams, and each against a uniform-random opponent --------------------

def evaluation(run: Resolved, policy: actor_critic.Policy | None = None) -> Evaluation:
    """How a game's teams are evaluated (algos.base.Evaluation): matches of every team with its
    network or, named in `random_sides`, uniformly at random; a video samples (or, greedy, takes
    the mode of) each agent's factored action."""
    env, env_params = run.env, run.env_params
    policy = policy or team_policy(run.cfg, env, env_params)
    factored = action_distribution(env)

    def episodes(total, num_devices, greedy, random_sides=()):
        return (make_match(policy, env, env_params, total, num_devices, greedy, random_sides),
                lambda sums: summarize_match(sums, tuple(env.teams)))

    def choose(greedy):
        def chosen(pi, keys):
            action = factored.mode(pi) if greedy else factored.sample(pi, factored.noise(keys, env.num_agents))
            return action, action
        return chosen

    return Evaluation(episodes, tuple(env.teams), choose)

def make_match(policy, env, env_params, total: int, num_devices: int, greedy: bool, random_teams=()):
    """A per-device function `(params, key) -> sums` over the first episode of
    `ceil(total / num_devices)` games per device (all devices and hosts; games past `total` are
    padding). The teams named in `random_teams` act uniformly at random instead of with their
    network (the baseline), the others sample their policy (`greedy`: its argmax). Sums: games,
    per team the mean return of its agents and its agents' mean steps in the game (for runners:
    how long they survive), tags and episode lengths, and the all-agent return and its square."""
    teams, num_agents = env.teams, env.num_agents
    dist = action_distribution(env)
    per_device = -(-total // num_devices)
    is_random = jnp.array([any(a <= i < b for name, (a, b) in teams.items() if name in random_teams)
                           for i in range(num_agents)])
    sizes = jnp.array([b - a for a, b in teams.values()], jnp.float32)

    def match(params, key):
        ids = global_indices(per_device)
        batch = vec.reset(env, env_params, key, ids)

        def step(carry, t):
            batch, finished, sums = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t + 1), ids))
            logits, _, _, _ = policy.act(params, (), batch.obs, batch.obs)
            logits = jnp.where(is_random[:, None], 0.0, logits)   # uniform for a random team
            action = dist.sample(logits, dist.noise(keys[:, 0], num_agents))
            if greedy:
                action = jnp.where(is_random, action, dist.mode(logits))
            in_game = team_sums(batch.state.active.astype(jnp.float32), teams) / sizes    # [E, teams]
            batch, out = vec.step(env, env_params, batch, action, keys[:, 1])
            ended = (out.done_length > 0) & ~finished
            team_return = team_sums(out.done_return, teams) / sizes                       # [E, teams]
            everyone = out.done_return.mean(-1)
            add = {"returns": jnp.where(ended[:, None], team_return, 0.0),
                   "steps_in_game": jnp.where(finished[:, None], 0.0, in_game),
                   "tags": jnp.where(ended, out.info["episode_tags"], 0).astype(jnp.float32),
                   "length": jnp.where(ended, out.done_length, 0).astype(jnp.float32),
                   "return": jnp.where(ended, everyone, 0.0), "return_sq": jnp.where(ended, everyone ** 2, 0.0)}
            return (batch, finished | ended, jax.tree.map(jnp.add, sums, add)), None

        zeros = {"returns": jnp.zeros((per_device, len(teams))), "steps_in_game": jnp.zeros((per_device, len(teams))),
                 **{k: jnp.zeros(per_device) for k in ("tags", "length", "return", "return_sq")}}
        start = (batch, jnp.zeros(per_device, bool), zeros)
        (_, finished, sums), _ = jax.lax.scan(step, start, jnp.arange(int(env_params.max_steps_in_episode)))
        counted = (ids < total) & finished
        sums = jax.tree.map(lambda x: jnp.where(counted.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0.0).sum(0), sums)
        return all_sum({**sums, "games": counted.sum().astype(jnp.float32)})

    return match


def summarize_match(sums, teams) -> dict:
    """Means over the games of a `make_match` result (host numbers): `mean_return` (over all
    agents, what training's --eval-every tracks) and per team `{team}/mean_return` (per agent)
    and `{team}/steps_in_game`, `tags_per_episode`, `episode_length`."""
    games = float(sums["games"])
    mean = lambda x: float(x) / games if games else float("nan")  # noqa: E731
    out = {"mean_return": mean(sums["return"]),
           "std_return": max(mean(sums["return_sq"]) - mean(sums["return"]) ** 2, 0.0) ** 0.5 if games else float("nan"),
           "episodes": int(games), "tags_per_episode": mean(sums["tags"]), "episode_length": mean(sums["length"])}
    for k, name in enumerate(teams):
        out[f"{name}/mean_return"] = mean(sums["returns"][k])
        out[f"{name}/steps_in_game"] = mean(sums["steps_in_game"][k])
    return out

