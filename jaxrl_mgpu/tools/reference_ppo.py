"""A hand-fused, single-file, single-device PPO in the PureJaxRL style: the speed baseline that
`python -m jaxrl_mgpu.bench --baseline` times next to the project's data-parallel PPO.

It does the same work per update as `algos/ppo/ppo.py` (same network, rollout length, epochs and
minibatches) but none of the things that make the project's version correct across devices:
one key for the whole batch instead of per-environment streams, no bootstrap through
truncation, no collectives. Not used for training.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.algos.ppo.spec import SPEC as PPO
from jaxrl_mgpu.nets.mlp import ActorCritic

REPRODUCES = PPO  # the algorithm (spec) whose update this one does, single-agent, with --policy mlp


def make_update_loop(cfg, num_updates: int):
    """Returns `(init(key) -> carry, run(carry) -> carry)`; `run` does `num_updates` updates
    in one jitted `lax.scan` with the carry donated."""
    env, params_env = envs_lib.make(cfg.env, cfg.env_args)
    obs_shape = env.observation_space(params_env).shape
    hidden = (cfg.hidden_size,) * cfg.num_layers
    net = ActorCritic(env.num_actions, len(obs_shape), hidden, hidden, cfg.activation)
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr, eps=1e-5))
    n_envs, mb = cfg.num_envs, cfg.num_envs * cfg.num_steps // cfg.num_minibatches

    def init(key):
        k1, k2, key = jax.random.split(key, 3)
        params = net.init(k1, jnp.zeros((1,) + obs_shape))
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(k2, n_envs), params_env)
        return params, tx.init(params), state, obs, key

    def one_update(carry, _):
        params, opt_state, state, obs, key = carry

        def env_step(c, _):
            state, obs, key = c
            key, k_act, k_env = jax.random.split(key, 3)
            logits, value = net.apply(params, obs)
            action = jax.random.categorical(k_act, logits)
            logp = jax.nn.log_softmax(logits)[jnp.arange(n_envs), action]
            obs2, state, reward, term, trunc, _ = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k_env, n_envs), state, action, params_env)
            done = jnp.logical_or(term, trunc).astype(jnp.float32)
            return (state, obs2, key), (obs, action, logp, value, reward, done)

        (state, obs, key), (b_obs, b_act, b_logp, b_val, b_rew, b_done) = jax.lax.scan(
            env_step, (state, obs, key), None, cfg.num_steps)
        _, last_val = net.apply(params, obs)

        def gae_step(c, x):
            adv, next_val = c
            val, rew, done = x
            delta = rew + cfg.gamma * next_val * (1 - done) - val
            adv = delta + cfg.gamma * cfg.gae_lambda * (1 - done) * adv
            return (adv, val), adv

        _, adv = jax.lax.scan(gae_step, (jnp.zeros_like(last_val), last_val), (b_val, b_rew, b_done), reverse=True)
        targets = adv + b_val
        data = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (b_obs, b_act, b_logp, b_val, adv, targets))

        def loss(p, obs, act, logp_old, val_old, adv, tgt):
            logits, val = net.apply(p, obs)
            logps = jax.nn.log_softmax(logits)
            ratio = jnp.exp(logps[jnp.arange(act.shape[0]), act] - logp_old)
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv).mean()
            v_clip = val_old + jnp.clip(val - val_old, -cfg.clip_eps, cfg.clip_eps)
            vl = 0.5 * jnp.maximum((val - tgt) ** 2, (v_clip - tgt) ** 2).mean()
            ent = -(jnp.exp(logps) * logps).sum(-1).mean()
            return pg + cfg.vf_coef * vl - cfg.ent_coef * ent

        def epoch(c, k):
            perm = jax.random.permutation(k, data[0].shape[0])
            mbs = jax.tree.map(lambda x: x[perm].reshape((-1, mb) + x.shape[1:]), data)

            def step(c, b):
                p, o = c
                g = jax.grad(loss)(p, *b)
                u, o = tx.update(g, o, p)
                return (optax.apply_updates(p, u), o), None

            return jax.lax.scan(step, c, mbs)[0], None

        key, k = jax.random.split(key)
        (params, opt_state), _ = jax.lax.scan(epoch, (params, opt_state), jax.random.split(k, cfg.update_epochs))
        return (params, opt_state, state, obs, key), None

    def run(carry):
        return jax.lax.scan(one_update, carry, None, num_updates)[0]

    return jax.jit(init), jax.jit(run, donate_argnums=0)
