"""Many runs in one program (--num-seeds, --sweep: multirun.py), on virtual CPU devices: each run
is the single run it stands for, whatever the device count and layout."""

import jax
import numpy as np
import pytest

from helpers import assert_trees_close, make_trainer

# One minibatch: then the device count does not change an update's numbers (each device
# shuffles its own share of the batch, so with several minibatches it would).
SMALL = dict(num_envs=8, num_steps=8, update_epochs=2, num_minibatches=1, hidden_size=16,
             total_timesteps=8 * 8 * 4, log_every=2)


def run_updates(trainer, n: int = 2):
    state = trainer.init_state()
    return trainer.chunk_fn(n, state)(state)


def per_run(trainer, tree):
    """[runs, ...] host arrays of a multi-run state's leaves."""
    return trainer.par.runs_of(tree)


@pytest.fixture(scope="module")
def two_seeds_on_two_devices():
    """--num-seeds 2 on 2 devices (pmap): one run per device, no collective across them."""
    trainer = make_trainer(2, "pmap", num_seeds=2, seed=3, **SMALL)
    assert (trainer.par.groups, trainer.par.data_devices, trainer.par.runs_per_device) == (2, 1, 1)
    state, chunk = run_updates(trainer)
    return trainer, per_run(trainer, state.params), per_run(trainer, chunk.losses)


def test_run_i_equals_the_single_run_with_seed_plus_i(two_seeds_on_two_devices):
    trainer, params, losses = two_seeds_on_two_devices
    for i in range(2):
        single = make_trainer(1, seed=3 + i, **SMALL)
        state, chunk = run_updates(single)
        assert_trees_close(single.par.first(state.params), jax.tree.map(lambda x: x[i], params), rtol=1e-5, atol=1e-6)
        assert_trees_close(single.par.first(chunk.losses), jax.tree.map(lambda x: x[i], losses), rtol=1e-4, atol=1e-6)
    # The runs differ (seeds 3 and 4), so the comparison above could fail.
    assert max(jax.tree.leaves(jax.tree.map(lambda x: float(np.abs(x[0] - x[1]).max()), params))) > 1e-2


@pytest.mark.parametrize("backend,devices,layout", [
    ("pmap", 1, (1, 1, 2)),       # both runs on the one device
    ("pmap", 4, (1, 4, 2)),       # pmap, 2 runs < 4 devices: every run on every device
    ("shard_map", 4, (2, 2, 1)),  # a 2 x 2 mesh: each run on its own 2 devices
])
def test_a_multi_run_program_does_not_depend_on_the_device_count(two_seeds_on_two_devices, backend, devices, layout):
    _, params, losses = two_seeds_on_two_devices
    trainer = make_trainer(devices, backend, num_seeds=2, seed=3, **SMALL)
    assert (trainer.par.groups, trainer.par.data_devices, trainer.par.runs_per_device) == layout
    state, chunk = run_updates(trainer)
    assert_trees_close(per_run(trainer, state.params), params, rtol=1e-5, atol=1e-6)
    assert_trees_close(per_run(trainer, chunk.losses), losses, rtol=1e-4, atol=1e-6)
