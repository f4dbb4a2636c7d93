"""Actor-critic policies behind one interface, whatever memory they keep between steps.

`make(cfg, env, env_params) -> Policy` for `--policy mlp` (no memory) or `--policy transformer`
(a key/value cache plus the previous action and reward). PPO, evaluation and data collection
use only these functions, so they work with either:

    init_params(key)                       -> params
    init_memory(n)                         -> memory of n environments (batch-first leaves)
    act(params, memory, obs, final_obs)    -> logits [n, A], value [n], bootstrap [n], memory
        acts on `obs` and also values `final_obs` (the previous step's pre-reset observation,
        continuing its episode): the bootstrap of a time-limit truncation, computed one step
        late so it costs no extra launches
    remember(memory, action, reward, done) -> memory after the environment step
    inputs(memory, obs)                    -> what the learner needs of this step
    evaluate(params, memory0, inputs)      -> logits, values with the leading dims of `inputs`
        the learner's recomputation: over transitions [B] (mlp), or over whole environment
        sequences [E, T] starting from the memory at the rollout's start (transformer)
    sequences: bool                        -> True: minibatches must be whole environments
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_mgpu.nets import compute_dtype, kernels
from jaxrl_mgpu.nets.mlp import ActorCritic
from jaxrl_mgpu.nets.transformer import KVCache, TransformerActorCritic


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


def make(cfg, env, env_params) -> Policy:
    obs_shape = env.observation_space(env_params).shape
    dtype = compute_dtype(cfg.precision)
    if cfg.policy == "transformer":
        return _transformer(cfg, env.num_actions, obs_shape, dtype)
    return _mlp(cfg, env.num_actions, obs_shape, dtype)


def _mlp(cfg, num_actions: int, obs_shape: tuple, dtype) -> Policy:
    net = ActorCritic(num_actions=num_actions, obs_ndim=len(obs_shape), hidden_size=cfg.hidden_size,
                      num_layers=cfg.num_layers, activation=cfg.activation, dtype=dtype)

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


def _transformer(cfg, num_actions: int, obs_shape: tuple, dtype) -> Policy:
    net = TransformerActorCritic(num_actions=num_actions, obs_ndim=len(obs_shape), d_model=cfg.d_model,
                                 n_layers=cfg.n_layers, n_heads=cfg.n_heads, context_len=cfg.context_len,
                                 context_across_episodes=cfg.context_across_episodes, dtype=dtype,
                                 **kernels(cfg))

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

