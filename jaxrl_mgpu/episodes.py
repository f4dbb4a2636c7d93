"""Evaluation episodes, spread over all devices and hosts: what training's `--eval-every`,
`python -m jaxrl_mgpu.evaluate` and the tests run."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_mgpu.envs import episode_metrics, vec
from jaxrl_mgpu.nets import actor_critic
from jaxrl_mgpu.parallel import AXIS, global_indices


def make_episodes(policy, env, env_params, total: int, num_devices: int, greedy: bool):
    """A per-device function `(params, key) -> (sum, sum of squares, count, {name: sum})` of the
    returns (and the environment's episode metrics, envs.episode_metrics) of the first episode
    of `ceil(total / num_devices)` environments per device, summed over all devices and hosts
    (environments past `total` are padding and do not count). `policy` is an
    actor-critic Policy (nets/actor_critic.py), with whatever memory it keeps; `greedy` takes the
    action distribution's mode (argmax of the logits, a Gaussian's mean) instead of a sample."""
    dist = actor_critic.dist_of(policy, env, env_params)
    per_device = -(-total // num_devices)
    max_steps = int(env_params.max_steps_in_episode)

    def episodes(params, key):
        ids = global_indices(per_device)
        batch = vec.reset(env, env_params, key, ids)

        def step(carry, t):
            batch, memory, first_return, first_metrics, finished = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t + 1), ids))
            pi, _, _, memory = policy.act(params, memory, batch.obs, batch.obs)
            action = dist.mode(pi) if greedy else dist.sample(pi, dist.noise(keys[:, 0]))
            batch, out = vec.step(env, env_params, batch, dist.to_env(action), keys[:, 1])
            ended = out.done_length > 0
            memory = policy.remember(memory, action, out.reward, ended)
            first = ended & ~finished
            first_return = jnp.where(first, out.done_return, first_return)
            first_metrics = {name: jnp.where(first, x, first_metrics[name]) for name, x in out.episode_metrics.items()}
            return (batch, memory, first_return, first_metrics, finished | ended), None

        start = (batch, policy.init_memory(per_device), jnp.zeros(per_device),
                 {name: jnp.zeros(per_device) for name in episode_metrics(env)}, jnp.zeros(per_device, bool))
        (_, _, returns, metrics, finished), _ = jax.lax.scan(step, start, jnp.arange(max_steps))
        counted = (ids < total) & finished
        totals = (jnp.where(counted, returns, 0.0).sum(), jnp.where(counted, returns ** 2, 0.0).sum(),
                  counted.sum().astype(jnp.float32),
                  {name: jnp.where(counted, x, 0.0).sum() for name, x in metrics.items()})
        return jax.lax.psum(totals, AXIS)

    return episodes


def summarize(totals) -> dict:
    """The mean and standard deviation of the returns, the count of episodes, and the mean of
    each episode metric as `env/NAME`."""
    total, total_sq, count = (float(x) for x in totals[:3])
    mean = total / count if count else float("nan")
    var = max(total_sq / count - mean ** 2, 0.0) if count else float("nan")
    metrics = {f"env/{name}": float(x) / count if count else float("nan") for name, x in totals[3].items()}
    return {"mean_return": mean, "std_return": var ** 0.5, "episodes": int(count), **metrics}
