"""Actor-critic policies behind one interface, whatever memory they keep between steps, and
the action distributions they parameterise.

`make(cfg, env, env_params) -> Policy` for `--policy mlp` (no memory) or `--policy transformer`
(a key/value cache plus the previous action and reward). PPO, evaluation and data collection
use only these functions, so they work with either:

    init_params(key)                       -> params
    init_memory(n)                         -> memory of n environments (batch-first leaves)
    act(params, memory, obs, final_obs)    -> pi, value [n], bootstrap [n], memory
        pi: what the env's action distribution takes (`distribution(env, env_params)`): logits
        [n, A] for discrete actions, (mean, log_std) [n, D] each for Box actions
        acts on `obs` and also values `final_obs` (the previous step's pre-reset observation,
        continuing its episode): the bootstrap of a time-limit truncation, computed one step
        late so it costs no extra launches
    remember(memory, action, reward, done) -> memory after the environment step
    inputs(memory, obs)                    -> what the learner needs of this step
    evaluate(params, memory0, inputs)      -> pi, values with the leading dims of `inputs`
        the learner's recomputation: over transitions [B] (mlp), or over whole environment
        sequences [E, T] starting from the memory at the rollout's start (transformer)
    sequences: bool                        -> True: minibatches must be whole environments

An action distribution (`Categorical` or `DiagGaussian`, chosen from the env's action space)
is everything that depends on the kind of action, so the rollout, the loss and evaluation are
the same code for both:

    noise(keys)          -> its random numbers, one row per key, drawn before pi is known
    sample(pi, noise)    -> actions;  mode(pi) -> the most likely actions (greedy evaluation)
    log_prob(pi, action) -> [n];      entropy(pi) -> [n]
    to_env(action)       -> what the environment is given
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces

from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.nets import factory
from jaxrl_mgpu.nets.transformer import KVCache


class Policy(NamedTuple):
    init_params: Callable
    init_memory: Callable
    act: Callable
    remember: Callable
    inputs: Callable
    evaluate: Callable
    sequences: bool


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

    def noise(self, keys: jax.Array) -> jax.Array:
        return gumbel_noise(keys, self.num_actions)

    def sample(self, logits: jax.Array, noise: jax.Array) -> jax.Array:
        return sample_with_noise(logits, noise)

    def mode(self, logits: jax.Array) -> jax.Array:
        return jnp.argmax(logits, -1)

    def log_prob(self, logits: jax.Array, action: jax.Array) -> jax.Array:
        return log_prob(logits, action)

    def entropy(self, logits: jax.Array) -> jax.Array:
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

    @property
    def num_dims(self) -> int:
        return len(self.low)

    def noise(self, keys: jax.Array) -> jax.Array:
        return jax.vmap(lambda k: jax.random.normal(k, (self.num_dims,)))(keys)

    def sample(self, pi, noise: jax.Array) -> jax.Array:
        mean, log_std = pi
        return mean + jnp.exp(log_std) * noise

    def mode(self, pi) -> jax.Array:
        return pi[0]

    def log_prob(self, pi, action: jax.Array) -> jax.Array:
        mean, log_std = pi
        z = (action - mean) * jnp.exp(-log_std)
        return (-0.5 * jnp.square(z) - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)

    def entropy(self, pi) -> jax.Array:
        return (pi[1] + 0.5 * (1.0 + np.log(2 * np.pi))).sum(-1)

    def to_env(self, action: jax.Array) -> jax.Array:
        return jnp.clip(action, np.asarray(self.low, np.float32), np.asarray(self.high, np.float32))


def distribution(env, env_params) -> Categorical | DiagGaussian:
    """The action distribution of the env's action space, or a ConfigError naming it."""
    space = env.action_space(env_params)
    if isinstance(space, spaces.Discrete):
        return Categorical(env.num_actions)
    if isinstance(space, spaces.Box) and len(space.shape) == 1 and jnp.issubdtype(space.dtype, jnp.floating):
        bounds = (tuple(float(x) for x in np.broadcast_to(np.asarray(b, np.float32), space.shape))
                  for b in (space.low, space.high))
        return DiagGaussian(*bounds)
    what = (f"Box of shape {space.shape} and dtype {np.dtype(space.dtype).name}" if isinstance(space, spaces.Box)
            else type(space).__name__)
    name = getattr(env, "name", type(env).__name__)
    raise ConfigError(f"--env {name}: its actions ({what}) are neither discrete nor a float vector (1-D Box), "
                      f"the two kinds the policies act in")


def make(cfg, env, env_params) -> Policy:
    obs_shape = env.observation_space(env_params).shape
    dist = distribution(env, env_params)
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
    continuous = isinstance(dist, DiagGaussian)
    net = factory.actor_critic_mlp(cfg, dist.num_dims if continuous else dist.num_actions, len(obs_shape), continuous)

    def act(params, memory, obs, final_obs):
        return (*net.apply(params, obs, final_obs, method=net.act), memory)

    return Policy(
        init_params=lambda key: net.init(key, jnp.zeros((1,) + obs_shape)),
        init_memory=lambda n: (),
        act=act,
        remember=lambda memory, action, reward, done: memory,
        inputs=lambda memory, obs: obs,
        evaluate=lambda params, memory0, obs: net.apply(params, obs),
        sequences=False)


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

    return Policy(init_params, init_memory, act, remember, inputs, evaluate, sequences=True)


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

