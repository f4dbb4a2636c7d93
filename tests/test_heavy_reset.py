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
from helpers import assert_trees_close, make_trainer
from test_episode_metrics import Countdown  # registered there as Countdown-test

NUM_ENVS, STEPS = 48, 24  # 3 resets a batch (48 // 16); episodes of 2 to 6 steps end up to 48 at once


class HeavyCountdown(Countdown):
    heavy_reset = True


envs.register("HeavyCountdown-test", lambda: (HeavyCountdown(), HeavyCountdown().default_params), {})


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_ppo_with_heavy_reset_updates_as_without_on_1_and_8_devices_pmap_and_shard_map():
    """One PPO update: the same params with and without heavy_reset, on 1 device and on 8 (6
    environments a device: resets one at a time), through shard_map and pmap."""
    options = dict(num_minibatches=1, num_envs=NUM_ENVS, num_steps=8, update_epochs=2, hidden_size=16,
                   total_timesteps=NUM_ENVS * 8 * 4)
    trainers = [make_trainer(1, env="Countdown-test", **options), make_trainer(1, env="HeavyCountdown-test", **options),
                make_trainer(8, "shard_map", env="HeavyCountdown-test", **options),
                make_trainer(8, "pmap", env="HeavyCountdown-test", **options)]
    params = []
    for trainer in trainers:
        state = trainer.init_state()
        params.append(trainer.par.first(trainer.chunk_fn(1, state)(state)[0].params))
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), params[0],
                         trainers[0].par.first(trainers[0].init_state().params))
    assert max(jax.tree.leaves(moved)) > 1e-5  # the update moved the params: the comparison means something
    jax.tree.map(np.testing.assert_array_equal, params[1], params[0])
    for other in params[2:]:
        assert_trees_close(other, params[0], rtol=1e-5, atol=1e-6)
