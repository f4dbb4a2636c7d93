"""`heavy_reset = True` (envs/vec.step_resetting_ended): a batch of environments that resets
only those whose episode ended gives what gymnax's own step under vmap gives, step for step,
also where more episodes end at once than one batch of resets holds, and under vmap (the runs
axis of --num-seeds)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mgpu import envs
from jaxrl_mgpu.envs import vec
from tests.test_episode_metrics import Countdown

NUM_ENVS, STEPS = 48, 24  # 3 resets a batch (48 // 16); episodes of 2 to 6 steps end up to 48 at once


class HeavyCountdown(Countdown):
    heavy_reset = True


def rollout(env, params, key):
    """STEPS steps of NUM_ENVS environments from `key`: every step's observations, states and
    Step fields, as vec.step gives them."""
    ids = jnp.arange(NUM_ENVS)
    batch = vec.reset(env, params, key, ids)

    def one(batch, t):
        batch, out = vec.step(env, params, batch, jnp.zeros(NUM_ENVS, jnp.int32),
                              vec.env_keys(jax.random.fold_in(key, t), ids))
        return batch, (batch, out)
    return jax.lax.scan(one, batch, jnp.arange(STEPS))[1]


def test_resetting_only_the_ended_environments_gives_gymnax_steps():
    dense, sparse = Countdown(), HeavyCountdown()
    params = dense.default_params
    key = jax.random.PRNGKey(0)
    expected, got = jax.jit(rollout, static_argnums=0)(dense, params, key), jax.jit(rollout, static_argnums=0)(
        sparse, params, key)
    jax.tree.map(np.testing.assert_array_equal, got, expected)
    ended = np.asarray(expected[1].done_length > 0).sum(1)
    assert ended.max() > NUM_ENVS // vec.RESET_BATCH_FRACTION and (ended == 0).any()  # both cases were met
    # under vmap (runs of --num-seeds), each run its own
    keys = jax.random.split(key, 3)
    many = jax.jit(jax.vmap(lambda k: rollout(sparse, params, k)))(keys)
    for run in range(3):
        jax.tree.map(np.testing.assert_array_equal, jax.tree.map(lambda x: x[run], many),
                     rollout(dense, params, keys[run]))


def test_heavy_reset_needs_gymnax_own_step():
    class OwnStep(HeavyCountdown):
        def step(self, key, state, action, params=None):
            return super().step(key, state, action, params)

    with pytest.raises(envs.EnvError, match="heavy_reset needs gymnax's own Environment.step"):
        rollout(OwnStep(), OwnStep().default_params, jax.random.PRNGKey(0))
