"""Observation normalisation (`--normalize-obs`): running moments of the observations over
every device and process, and observations scaled by them.

The statistics are a non-trainable part of a policy's params (`{"params": ..., OBS_STATS:
RunningStats}`, as Flax keeps batch statistics beside the params), so wherever the params go
the statistics go too: the checkpoint (hence an exact resume), the best checkpoint,
`evaluate`, videos, every run of a `--num-seeds` program. The optimizer sees only
`params["params"]` (algos/ppo/ppo.py).

As Brax's `running_statistics` in its PPO: (obs - mean) / std with std clipped to [1e-6,
1e6] and no clipping of the normalised values; the statistics start at mean 0 and std 1, so
the first rollout sees the raw observations.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_mgpu.parallel import all_sum

OBS_STATS = "obs_stats"  # the key of the statistics in a policy's params
STD_MIN, STD_MAX = 1e-6, 1e6


class RunningStats(NamedTuple):
    """Moments of every observation seen so far, of all devices, per observation element.
    float32 throughout: the count is exact while each batch is a multiple of the float's
    spacing at the count (any batch below 2**24 observations in all; beyond, batches of a power
    of two's multiple, as the usual ones are)."""
    count: jax.Array  # [] observations
    mean: jax.Array   # [*obs_shape]
    m2: jax.Array     # [*obs_shape] sum of squared deviations from the mean

    @staticmethod
    def init(obs_shape: tuple) -> "RunningStats":
        return RunningStats(jnp.zeros(()), jnp.zeros(obs_shape), jnp.zeros(obs_shape))


def update(stats: RunningStats, obs: jax.Array) -> RunningStats:
    """`stats` merged with a batch of observations `[..., *obs_shape]` of this device and of
    every other device on the axis (one all-reduce): Chan et al.'s parallel combination of
    (count, mean, M2). The batch's moments are summed about the running mean (not about zero),
    so that float32 loses little to cancellation once the mean is known."""
    x = obs.reshape((-1,) + stats.mean.shape).astype(jnp.float32)
    d = x - stats.mean
    s1, s2, n = all_sum((d.sum(0), jnp.square(d).sum(0), jnp.float32(x.shape[0])))
    delta = s1 / n                                       # batch mean - running mean
    batch_m2 = jnp.maximum(s2 - s1 * delta, 0.0)         # sum over the batch of (x - batch mean)^2
    total = stats.count + n
    return RunningStats(total, stats.mean + delta * (n / total),
                        stats.m2 + batch_m2 + jnp.square(delta) * (stats.count * n / total))


def std(stats: RunningStats) -> jax.Array:
    var = jnp.where(stats.count > 0, stats.m2 / jnp.maximum(stats.count, 1.0), 1.0)
    return jnp.clip(jnp.sqrt(var), STD_MIN, STD_MAX)


def normalize(stats: RunningStats, obs: jax.Array) -> jax.Array:
    """Observations `[..., *obs_shape]` scaled to zero mean and unit variance."""
    return (obs - stats.mean) / std(stats)
