"""algos/replay.py's pure functions by hand: n-step targets, segments of episodes as
transitions, and the asynchronous learner's ring (DQN's int actions, SAC's float vectors).
The replay's use by the algorithms: test_dqn.py, test_sac.py, test_async.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mgpu.algos.replay import Transitions, n_step_targets, ring_init, ring_insert, ring_sample, \
    segment_transitions


def test_n_step_targets_by_hand():
    reward = jnp.array([[1.0, 2.0, 3.0]] * 3)
    terminated = jnp.array([[False, False, False], [False, True, False], [False, False, False]])
    truncated = jnp.array([[False, False, False], [False, False, False], [True, False, False]])
    total, discount, last = n_step_targets(reward, terminated, terminated | truncated, 0.5)
    # whole window: 1 + 0.5 x 2 + 0.25 x 3, bootstrapping 0.5^3 after it; a termination at
    # step 1: 1 + 0.5 x 2, no bootstrap; a time limit at step 0: 1, bootstrapping 0.5 after it
    np.testing.assert_allclose(total, [2.75, 2.0, 1.0])
    np.testing.assert_allclose(discount, [0.125, 0.0, 0.5])
    np.testing.assert_array_equal(last, [2, 1, 0])


def test_segments_give_each_step_but_the_lookahead_its_window_cut_at_the_segment_end():
    # segment A: 3 steps, its episode ended by a termination; segment B: 3 steps of an unfinished
    # episode whose last step is lookahead (n_step 2: it only completes its predecessor's window)
    obs = np.arange(6, dtype=np.float32)[:, None]
    action = np.array([[0.5], [-0.5], [0.25], [1.0], [0.0], [-1.0]], np.float32)
    reward = np.array([1, 1, 1, 2, 2, 2], np.float32)
    terminal = np.array([False, False, True, False, False, False])
    final = np.array([[10.0], [20.0]], np.float32)
    t = segment_transitions(obs, action, reward, terminal, np.array([3, 3]), np.array([0, 1]), final, 2, 0.9)
    np.testing.assert_array_equal(t.obs[:, 0], [0, 1, 2, 3, 4])            # B's last step held back
    np.testing.assert_array_equal(t.action, action[:5])                     # float vectors kept
    np.testing.assert_allclose(t.reward, [1.9, 1.9, 1.0, 3.8, 3.8])
    np.testing.assert_allclose(t.discount, [0.81, 0.0, 0.0, 0.81, 0.81])    # A's end terminated
    np.testing.assert_array_equal(t.next_obs[:, 0], [2, 10, 10, 5, 20])     # B's window from 4 ends at B's end


@pytest.mark.parametrize("action_shape, action_dtype", [((), jnp.int32), ((2,), jnp.float32)])
def test_the_ring_overwrites_its_oldest_rows_and_samples_only_written_ones(action_shape, action_dtype):
    ring = ring_init(8, (1,), jnp.float32, action_shape, action_dtype)
    block = lambda start, n: Transitions(  # noqa: E731  transitions numbered start, start + 1, ...
        np.arange(start, start + n, dtype=np.float32)[:, None],
        np.zeros((n,) + action_shape, action_dtype) + np.arange(start, start + n).reshape((n,) + (1,) * len(action_shape)),
        np.zeros(n, np.float32), np.ones(n, np.float32), np.zeros((n, 1), np.float32))
    ring = ring_insert(ring, block(0, 6))
    seen = ring_sample(ring, jax.random.PRNGKey(0), 256)
    assert set(np.asarray(seen.obs[:, 0]).astype(int)) == set(range(6))  # rows 6, 7 not written yet
    assert seen.action.dtype == action_dtype and seen.action.shape == (256,) + action_shape
    ring = ring_insert(ring, block(6, 6))  # 12 written: 0..3 overwritten by 8..11
    np.testing.assert_array_equal(ring.obs[:, 0], [8, 9, 10, 11, 4, 5, 6, 7])
    assert int(ring.written) == 12
    seen = ring_sample(ring, jax.random.PRNGKey(1), 256)
    assert set(np.asarray(seen.obs[:, 0]).astype(int)) == set(range(4, 12))
