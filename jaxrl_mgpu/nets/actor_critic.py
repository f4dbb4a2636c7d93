"""Actor-critic policies behind one interface, whatever memory they keep between steps, and
the action distributions they parameterise.

`make(cfg, env, env_params) -> Policy` for `--policy mlp` (no memory) or `--policy transformer`
(a key/value cache plus the previous action and reward). PPO, evaluation and data collection
use only these functions, so they work with either:

    init_params(key)                       -> params
    init_memory(n)                         -> memory of n environments (batch-first leaves)
    act(params, memory, obs, final_obs)    -> pi, value [n], bootstrap [n], memory
        pi: what the policy's action distribution takes (`dist` below): logits [n, A] for
        discrete actions; for Box actions (mean, log_std) [n, D] each, or with --action-dist
        tanh_normal the [n, 2D] location and raw scale
        acts on `obs` and also values `final_obs` (the previous step's pre-reset observation,
        continuing its episode): the bootstrap of a time-limit truncation, computed one step
        late so it costs no extra launches
    remember(memory, action, reward, done) -> memory after the environment step
    inputs(memory, obs)                    -> what the learner needs of this step
    evaluate(params, memory0, inputs)      -> pi, values with the leading dims of `inputs`
        the learner's recomputation: over transitions [B] (mlp), or over whole environment
        sequences [E, T] starting from the memory at the rollout's start (transformer)
    sequences: bool                        -> True: minibatches must be whole environments
    dist                                   -> the action distribution pi is for (None: the
                                              env's default, `distribution(env, env_params)`)

With `--normalize-obs` an MLP policy's params hold the running observation statistics
(nets/obs_norm.py) beside the network's weights, and every function above normalises the
observations it is given with them.

An action distribution (`Categorical`, `DiagGaussian` or `TanhNormal`, chosen from the env's
action space and `--action-dist`) is everything that depends on the kind of action, so the
rollout, the loss and evaluation are the same code for all:

    num_outputs          -> the actor head's outputs it is parameterised by
    noise(keys)          -> its random numbers, one row per key, drawn before pi is known
    sample(pi, noise)    -> actions;  mode(pi) -> the actions greedy evaluation takes
    log_prob(pi, action) -> [n]
    entropy(pi, noise)   -> [n]; `noise` is the rollout's draw for that step, with which a
                            distribution without a closed-form entropy estimates it; the
                            rollout keeps it only where `samples_entropy` (else it is ()
                            and ignored)
    to_env(action)       -> what the environment is given
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.nets import factory, obs_norm
from jaxrl_mgpu.nets.transformer import KVCache


class Policy(NamedTuple):
    init_params: Callable
    init_memory: Callable
    act: Callable
    remember: Callable
    inputs: Callable
    evaluate: Callable
    sequences: bool
    dist: object = None


def dist_of(policy: Policy, env, env_params):
    """The action distribution `policy`'s pi is for."""
    return distribution(env, env_params) if policy.dist is None else policy.dist


class Memory(NamedTuple):
    """What a transformer policy carries between steps, per environment."""
    cache: KVCache
    prev_action: jax.Array  # [n] int32
    prev_reward: jax.Array  # [n] float32
    is_first: jax.Array     # [n] bool: the next observation starts an episode


@dataclasses.dataclass(frozen=True)
class Categorical:
    """Discrete actions: pi is logits [n, A], actions are int32 [n]."""
    num_actions: int

    samples_entropy = False  # a closed-form entropy: the rollout keeps no noise for it

    @property
    def num_outputs(self) -> int:
        return self.num_actions

    def noise(self, keys: jax.Array) -> jax.Array:
        return gumbel_noise(keys, self.num_actions)

    def sample(self, logits: jax.Array, noise: jax.Array) -> jax.Array:
        return sample_with_noise(logits, noise)

    def mode(self, logits: jax.Array) -> jax.Array:
        return jnp.argmax(logits, -1)

    def log_prob(self, logits: jax.Array, action: jax.Array) -> jax.Array:
        return log_prob(logits, action)

    def entropy(self, logits: jax.Array, noise=()) -> jax.Array:
        log_probs = jax.nn.log_softmax(logits)
        return -(jnp.exp(log_probs) * log_probs).sum(-1)

    def to_env(self, action: jax.Array) -> jax.Array:
        return action


@dataclasses.dataclass(frozen=True)
class DiagGaussian:
    """Box actions [n, D]: a Gaussian with a diagonal covariance, pi = (mean, log_std), each
    [n, D]; log-probs and entropies are sums over the D dimensions. As in PureJaxRL's and
    CleanRL's continuous PPO, the environment gets the sample clipped to the space's bounds
    (`to_env`), while the rollout keeps the unclipped sample and its log-prob: the policy the
    ratio compares against is the Gaussian itself, not the clipped one, whose mass at a bound
    has no density."""
    low: tuple   # [D] bounds of the action space (may be infinite)
    high: tuple

    samples_entropy = False  # a closed-form entropy: the rollout keeps no noise for it

    @property
    def num_dims(self) -> int:
        return len(self.low)

    @property
    def num_outputs(self) -> int:
        return self.num_dims  # the mean; the log-std is a parameter of its own

    def noise(self, keys: jax.Array) -> jax.Array:
        return standard_normal(keys, self.num_dims)

    def sample(self, pi, noise: jax.Array) -> jax.Array:
        mean, log_std = pi
        return mean + jnp.exp(log_std) * noise

    def mode(self, pi) -> jax.Array:
        return pi[0]

    def log_prob(self, pi, action: jax.Array) -> jax.Array:
        mean, log_std = pi
        z = (action - mean) * jnp.exp(-log_std)
        return (-0.5 * jnp.square(z) - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)

    def entropy(self, pi, noise=()) -> jax.Array:
        return (pi[1] + HALF_LOG_2_PI_E).sum(-1)

    def to_env(self, action: jax.Array) -> jax.Array:
        return jnp.clip(action, np.asarray(self.low, np.float32), np.asarray(self.high, np.float32))


HALF_LOG_2_PI_E = 0.5 * (1.0 + np.log(2 * np.pi))  # the entropy of a unit normal
LOG_2 = float(np.log(2.0))


@dataclasses.dataclass(frozen=True)
class TanhNormal:
    """Box actions [n, D] with finite bounds, as Brax's PPO acts (`NormalTanhDistribution`):
    u ~ Normal(loc, scale) per dimension and the action tanh(u), mapped affinely from [-1, 1]
    onto the bounds. pi is the actor head's [n, 2D] outputs, loc and a raw scale; scale =
    softplus(raw) + 0.001 depends on the state. The rollout keeps u, the sample before the
    squashing, and the log-prob is the density of the action tanh(u): log N(u) - log(1 -
    tanh(u)^2) (the affine map to the bounds is a constant factor and cancels in PPO's ratio).
    The entropy has no closed form; as Brax, one sample estimates it: H(Normal) + log(1 -
    tanh(u)^2) at a reparameterised u = loc + scale * e, with e standard normal. Brax draws e
    afresh in the loss; here e is the noise the rollout drew for that step, kept with the
    rollout, so the loss needs no random numbers of its own and 1 device == 8 still holds
    (the same e in every epoch). Not e = (action - loc) / scale at the current params: once an
    epoch has moved loc away from a rollout's sample, that e is no longer standard normal, and
    the estimate's gradient drives the scale down, the more so the more epochs there are."""
    low: tuple   # [D] finite bounds of the action space
    high: tuple

    MIN_STD = 0.001
    samples_entropy = True  # the rollout keeps its noise for `entropy`

    @property
    def num_dims(self) -> int:
        return len(self.low)

    @property
    def num_outputs(self) -> int:
        return 2 * self.num_dims

    def loc_scale(self, pi) -> tuple[jax.Array, jax.Array]:
        loc, raw = jnp.split(pi, 2, axis=-1)
        return loc, jax.nn.softplus(raw) + self.MIN_STD

    def noise(self, keys: jax.Array) -> jax.Array:
        return standard_normal(keys, self.num_dims)

    def sample(self, pi, noise: jax.Array) -> jax.Array:
        loc, scale = self.loc_scale(pi)
        return loc + scale * noise

    def mode(self, pi) -> jax.Array:
        return self.loc_scale(pi)[0]  # tanh is monotonic: tanh(loc) is the squashed median

    def log_prob(self, pi, action: jax.Array) -> jax.Array:
        loc, scale = self.loc_scale(pi)
        z = (action - loc) / scale
        return (-0.5 * jnp.square(z) - jnp.log(scale) - 0.5 * np.log(2 * np.pi)
                - tanh_log_det_jacobian(action)).sum(-1)

    def entropy(self, pi, noise: jax.Array) -> jax.Array:
        loc, scale = self.loc_scale(pi)
        u = loc + scale * noise
        return (jnp.log(scale) + HALF_LOG_2_PI_E + tanh_log_det_jacobian(u)).sum(-1)

    def to_env(self, action: jax.Array) -> jax.Array:
        low, high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        return (high + low) / 2 + (high - low) / 2 * jnp.tanh(action)


def tanh_log_det_jacobian(u: jax.Array) -> jax.Array:
    """log(d tanh(u) / du) = log(1 - tanh(u)^2), written so that it stays finite for large |u|
    (Brax's and TensorFlow Probability's form)."""
    return 2.0 * (LOG_2 - u - jax.nn.softplus(-2.0 * u))


def standard_normal(keys: jax.Array, num_dims: int) -> jax.Array:
    """[n, num_dims] standard normal numbers, row i from keys[i]."""
    return jax.vmap(lambda k: jax.random.normal(k, (num_dims,)))(keys)


ACTION_DISTS = {"clipped_normal": DiagGaussian, "tanh_normal": TanhNormal}


def distribution(env, env_params, action_dist: str = "clipped_normal") -> Categorical | DiagGaussian | TanhNormal:
    """The action distribution of the env's action space (Box actions: `action_dist`, the
    config's --action-dist), or a ConfigError naming what does not fit."""
    space = env.action_space(env_params)
    if isinstance(space, spaces.Discrete):
        return Categorical(env.num_actions)
    if isinstance(space, spaces.Box) and len(space.shape) == 1 and jnp.issubdtype(space.dtype, jnp.floating):
        low, high = (tuple(float(x) for x in np.broadcast_to(np.asarray(b, np.float32), space.shape))
                     for b in (space.low, space.high))
        if action_dist == "tanh_normal" and not np.isfinite([*low, *high]).all():
            raise ConfigError(f"--action-dist tanh_normal squashes actions into the action space's bounds; --env "
                              f"{getattr(env, 'name', type(env).__name__)} has unbounded actions: use "
                              f"--action-dist clipped_normal")
        return ACTION_DISTS[action_dist](low, high)
    what = (f"Box of shape {space.shape} and dtype {np.dtype(space.dtype).name}" if isinstance(space, spaces.Box)
            else type(space).__name__)
    name = getattr(env, "name", type(env).__name__)
    raise ConfigError(f"--env {name}: its actions ({what}) are neither discrete nor a float vector (1-D Box), "
                      f"the two kinds the policies act in")


def make(cfg, env, env_params) -> Policy:
    obs_shape = env.observation_space(env_params).shape
    dist = distribution(env, env_params, cfg.action_dist)
    if factory.is_sequence_policy(cfg):
        if not isinstance(dist, Categorical):
            raise ConfigError(transformer_refusal(cfg.env))
        return _transformer(cfg, dist.num_actions, obs_shape)
    return _mlp(cfg, dist, obs_shape)


def transformer_refusal(env_name: str) -> str:
    """Why --policy transformer refuses Box actions (its tokens hold the previous action one-hot)."""
    return (f"--policy transformer embeds the previous action as a discrete token; --env {env_name} has "
            f"continuous (Box) actions: use --policy mlp")


def _mlp(cfg, dist, obs_shape: tuple) -> Policy:
    net = factory.actor_critic_mlp(cfg, dist.num_outputs, len(obs_shape), learned_log_std=isinstance(dist, DiagGaussian))

    def init_params(key):
        variables = net.init(key, jnp.zeros((1,) + obs_shape))
        return {**variables, obs_norm.OBS_STATS: obs_norm.RunningStats.init(obs_shape)} if cfg.normalize_obs \
            else variables

    def seen(params, obs):
        """The observations as the network sees them (--normalize-obs: normalised), and its weights."""
        if cfg.normalize_obs:
            obs = jax.tree.map(lambda x: obs_norm.normalize(params[obs_norm.OBS_STATS], x), obs)
        return {"params": params["params"]}, obs

    def act(params, memory, obs, final_obs):
        weights, (obs, final_obs) = seen(params, (obs, final_obs))
        return (*net.apply(weights, obs, final_obs, method=net.act), memory)

    def evaluate(params, memory0, obs):
        return net.apply(*seen(params, obs))

    return Policy(
        init_params=init_params,
        init_memory=lambda n: (),
        act=act,
        remember=lambda memory, action, reward, done: memory,
        inputs=lambda memory, obs: obs,
        evaluate=evaluate,
        sequences=False,
        dist=dist)


def _transformer(cfg, num_actions: int, obs_shape: tuple) -> Policy:
    net = factory.transformer(cfg, num_actions, len(obs_shape))

    def init_params(key):
        one = lambda shape, dt: jnp.zeros((1, 1) + shape, dt)
        return net.init(key, None, one(obs_shape, jnp.float32), one((), jnp.int32), one((), jnp.float32),
                        jnp.ones((1, 1), bool))

    def init_memory(n):
        return Memory(net.init_cache(n), jnp.zeros(n, jnp.int32), jnp.zeros(n), jnp.ones(n, bool))

    def act(params, memory, obs, final_obs):
        prev = (memory.prev_action, memory.prev_reward)
        # The pre-reset observation continues its episode: not a first step.
        _, bootstrap = net.apply(params, memory.cache, final_obs, *prev, jnp.zeros_like(memory.is_first),
                                 method=net.peek)
        logits, value, cache = net.apply(params, memory.cache, obs, *prev, memory.is_first, method=net.step)
        return logits, value, bootstrap, memory._replace(cache=cache)

    def remember(memory, action, reward, done):
        return Memory(memory.cache, action.astype(jnp.int32), reward.astype(jnp.float32), done)

    def inputs(memory, obs):
        return (obs, memory.prev_action, memory.prev_reward, memory.is_first)

    def evaluate(params, memory0, inputs):
        logits, values, _ = net.apply(params, memory0.cache, *inputs)
        return logits, values

    return Policy(init_params, init_memory, act, remember, inputs, evaluate, sequences=True,
                  dist=Categorical(num_actions))


def sample(logits: jax.Array, keys: jax.Array, greedy: bool = False) -> jax.Array:
    """One action per row of `logits`, each with its own key (per-environment streams)."""
    return jnp.argmax(logits, -1) if greedy else sample_with_noise(logits, gumbel_noise(keys, logits.shape[-1]))


def gumbel_noise(keys: jax.Array, num_actions: int) -> jax.Array:
    """[n, num_actions] Gumbel noise, row i from keys[i]: drawn ahead of the logits it perturbs."""
    return jax.vmap(lambda k: jax.random.gumbel(k, (num_actions,)))(keys)


def sample_with_noise(logits: jax.Array, noise: jax.Array) -> jax.Array:
    """The Gumbel-max trick, exactly what `jax.random.categorical(key, logits)` computes when
    `noise` is `gumbel(key)`."""
    return jnp.argmax(noise + logits, -1)


def log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    return jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]

