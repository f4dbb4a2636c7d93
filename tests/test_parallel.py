"""parallel.py: the data-parallel contract of the PPO core, on 8 virtual CPU devices."""

import jax
import numpy as np
import pytest

from helpers import assert_trees_close, make_trainer

SMALL = dict(num_envs=16, num_steps=16, update_epochs=2, hidden_size=32, total_timesteps=16 * 16 * 8)


def run_updates(trainer, n: int):
    """`n` updates as one compiled chunk; returns the final state and the chunk metrics."""
    state = trainer.init_state()
    return trainer.chunk_fn(n, state)(state)


def global_rollout(trainer, state):
    """One rollout from `state`, with each leaf laid out [T, global envs] in global env order."""
    algo = trainer.algorithm.parts
    traj = trainer.par.map(lambda s: algo.rollout(s.params, s.envs, s.memory, s.key)[2])(state)
    local = trainer.par.local(traj)  # [devices, T, envs per device, ...]
    return jax.tree.map(lambda x: np.concatenate(list(x), axis=1), local)


@pytest.mark.slow
def test_one_update_on_8_devices_equals_1_device_with_the_same_global_batch():
    # A single minibatch: the update sees the whole global batch either way, so advantage
    # normalisation and the averaged gradient must agree.
    one = make_trainer(1, num_minibatches=1, **SMALL)
    eight = make_trainer(8, num_minibatches=1, **SMALL)
    state1, _ = run_updates(one, 1)
    state8, _ = run_updates(eight, 1)
    assert_trees_close(one.par.first(state1.params), eight.par.first(state8.params), rtol=1e-5)
    # ... and the update did move the params (the comparison is not trivially true).
    init = one.par.first(one.init_state().params)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), init, one.par.first(state1.params))
    assert max(jax.tree.leaves(moved)) > 1e-4


@pytest.mark.slow
def test_params_start_and_stay_identical_on_all_devices():
    trainer = make_trainer(8, num_minibatches=4, **SMALL)
    state = trainer.init_state()
    for tree in (state.params, run_updates(trainer, 3)[0].params):
        per_device = trainer.par.local(tree)
        for leaf in jax.tree.leaves(per_device):
            for d in range(1, 8):
                np.testing.assert_array_equal(leaf[0], leaf[d])


@pytest.mark.slow
def test_pmap_and_shard_map_agree():
    pm = make_trainer(8, "pmap", num_minibatches=2, **SMALL)
    sm = make_trainer(8, "shard_map", num_minibatches=2, **SMALL)
    (state_p, chunk_p), (state_s, chunk_s) = run_updates(pm, 3), run_updates(sm, 3)
    assert_trees_close(pm.par.local(state_p.params), sm.par.local(state_s.params), rtol=1e-6)
    assert_trees_close(pm.par.first(chunk_p), sm.par.first(chunk_s), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [2, 8])
def test_rollouts_do_not_depend_on_the_device_count(devices):
    one, many = make_trainer(1, **SMALL), make_trainer(devices, **SMALL)
    traj1 = global_rollout(one, one.init_state())
    trajn = global_rollout(many, many.init_state())
    np.testing.assert_array_equal(traj1.action, trajn.action)
    np.testing.assert_array_equal(traj1.terminated, trajn.terminated)
    np.testing.assert_allclose(traj1.inputs, trajn.inputs, rtol=1e-6)
    np.testing.assert_allclose(traj1.log_prob, trajn.log_prob, rtol=1e-5, atol=1e-6)
    assert traj1.terminated.any(), "the rollout should cross episode boundaries"


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_fused_collectives_equal_per_leaf_ones(backend):
    """parallel.all_mean / all_sum (one flat all-reduce for a whole tree) give what lax.pmean /
    lax.psum give leaf by leaf, keep each leaf's dtype, and are the identity on one device."""
    import jax.numpy as jnp
    from jaxrl_mgpu import parallel

    def per_device(x):
        tree = {"w": x * 2.0, "b": (x[:3] + 1.0, jnp.int32(7) * parallel.device_index())}
        fused = (parallel.all_mean(tree), parallel.all_sum(tree))
        reference = (jax.lax.pmean(tree, parallel.AXIS), jax.lax.psum(tree, parallel.AXIS))
        return fused, reference

    for devices in (8, 1):
        par = parallel.setup(backend, devices)
        x = np.arange(devices * 5, dtype=np.float32).reshape(devices, 5) ** 1.5
        fused, reference = par.map(per_device)(par.shard(x))
        for f, r in zip(jax.tree.leaves(fused), jax.tree.leaves(reference)):
            assert f.dtype == r.dtype
            np.testing.assert_allclose(np.asarray(f), np.asarray(r), rtol=1e-6)
