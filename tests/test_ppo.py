"""algos/ppo.py's pure parts, by hand: GAE, the clipped surrogate, reward normalisation over
devices, and the unrolls of --unroll-length."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import pendulum_config, resolved
from jaxrl_mgpu import parallel
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.cli import ConfigError


@pytest.mark.slow
def test_gae_equals_the_backward_recursion():
    """The loop-free GAE (an associative scan) gives the textbook backward recursion: no
    bootstrap through a termination, the pre-reset value's bootstrap at a truncation."""
    rng = np.random.default_rng(0)
    T, E, gamma, lam = 33, 6, 0.99, 0.95
    value, reward, bootstrap = (rng.normal(size=(T, E)).astype(np.float32) for _ in range(3))
    terminated = (rng.random((T, E)) < 0.1).astype(np.float32)
    truncated = ((rng.random((T, E)) < 0.05) * (1 - terminated)).astype(np.float32)
    last_value = rng.normal(size=E).astype(np.float32)
    traj = ppo.Rollout(None, None, None, value, reward, terminated, truncated, bootstrap * truncated)
    adv, target = ppo.gae(SimpleNamespace(gamma=gamma, gae_lambda=lam), traj, last_value)

    expected, running = np.zeros((T, E)), np.zeros(E)
    for t in reversed(range(T)):
        next_value = np.where(truncated[t] > 0, bootstrap[t], value[t + 1] if t < T - 1 else last_value)
        delta = reward[t] + gamma * next_value * (1 - terminated[t]) - value[t]
        running = delta + gamma * lam * (1 - np.maximum(terminated[t], truncated[t])) * running
        expected[t] = running
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(target), expected + value, rtol=1e-5, atol=1e-5)


def test_reward_normalisation_matches_a_numpy_reference_over_devices():
    """Discounted returns restarted after episode ends, their moments over all devices merged
    into the running ones, rewards divided by the new standard deviation."""
    rng = np.random.default_rng(0)
    T, E, devices, gamma = 9, 6, 2, 0.97
    reward = (5 * rng.normal(size=(T, E)) - 3).astype(np.float32)
    terminated = (rng.random((T, E)) < 0.15).astype(np.float32)
    truncated = ((rng.random((T, E)) < 0.1) * (1 - terminated)).astype(np.float32)
    carried = (10 * rng.normal(size=E)).astype(np.float32)
    mean, var, count = -2.0, 4.0, 100.0

    expected_g, g = np.zeros((T, E)), carried.astype(np.float64)
    for t in range(T):
        g = reward[t] + gamma * g
        expected_g[t] = g
        g = np.where(np.maximum(terminated[t], truncated[t]) > 0, 0.0, g)
    n = T * E
    delta = expected_g.mean() - mean
    total = count + n
    new_var = (var * count + expected_g.var() * n + delta ** 2 * count * n / total) / total

    par = parallel.setup("pmap", devices)
    per_device = lambda x: np.stack(np.split(x, devices, axis=-1))  # envs split over devices
    traj = ppo.Rollout(None, None, None, None, *(per_device(x) for x in (reward, terminated, truncated)), None)
    stats = ppo.ReturnStats(*(np.full(devices, v, np.float32) for v in (mean, var, count)))
    out, new_stats, returns = par.map(lambda tr, st, r: ppo.normalize_rewards(SimpleNamespace(gamma=gamma), tr, st, r))(
        par.shard(traj), par.shard(stats), par.shard(per_device(carried)))
    new_stats = par.first(new_stats)
    np.testing.assert_allclose(new_stats.mean, mean + delta * n / total, rtol=1e-5)
    np.testing.assert_allclose(new_stats.var, new_var, rtol=1e-5)
    np.testing.assert_allclose(new_stats.count, total, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(list(np.asarray(out.reward)), axis=-1), reward / np.sqrt(new_var),
                               rtol=1e-5)
    np.testing.assert_allclose(np.concatenate(list(np.asarray(returns))), g, rtol=1e-5, atol=1e-5)


def test_the_clipped_surrogate_stays_finite_where_a_sample_s_ratio_underflows():
    """A sample whose new density is e^-200 of the rollout's (a narrow tanh-normal scale that
    moved off it) has ratio 0 in float32: its policy loss and gradient are those of the clip,
    and the KL estimate (ratio - 1) - log(ratio) is 199, not log(0) = -inf."""
    log_ratio = jnp.asarray([-200.0, -200.0, 0.1, -0.1, 0.5], jnp.float32)
    adv = jnp.asarray([1.0, -1.0, 1.0, -1.0, 2.0], jnp.float32)
    loss, kl, clipped = ppo.clipped_surrogate(log_ratio, adv, 0.2)
    ratio = np.exp(np.asarray(log_ratio, np.float64))
    np.testing.assert_allclose(loss, -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.2) * adv), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(kl, (ratio - 1) - np.asarray(log_ratio, np.float64), rtol=1e-5)
    assert np.asarray(clipped).tolist() == [1, 1, 0, 0, 1]
    grad = jax.grad(lambda r: sum(x.sum() for x in ppo.clipped_surrogate(r, adv, 0.2)[:2]))(log_ratio)
    assert np.isfinite(grad).all()


def test_unrolls_take_gae_within_each_unroll_with_the_critic_they_are_given():
    """--unroll-length 4 on a rollout of 12 steps x 3 environments: each unroll is 4 steps of one
    environment, followed by the observation its next unroll starts with (the one after the
    rollout, for the last); its advantages are GAE within the unroll, bootstrapped from the value
    given for that observation (the rollout's value of the final observation where a time limit
    cut an episode, nothing where it terminated), normalised over the minibatch; the targets are
    advantage + value before normalising. Checked against a backward loop in numpy."""
    T, E, N = 12, 3, 4
    cfg = pendulum_config(num_envs=E, num_steps=T, unroll_length=N, gamma=0.9, gae_lambda=0.8, total_timesteps=T * E)
    rng = np.random.default_rng(0)
    ended = rng.random((T, E)) < 0.25
    terminated = (ended & (rng.random((T, E)) < 0.5)).astype(np.float32)
    truncated = (ended & (terminated == 0)).astype(np.float32)
    obs = (np.arange(T)[:, None] * 10 + np.arange(E)[None, :]).astype(np.float32)[..., None]  # t * 10 + e
    traj = ppo.Rollout(obs, rng.normal(size=(T, E, 1)).astype(np.float32), rng.normal(size=(T, E)).astype(np.float32),
                       rng.normal(size=(T, E)).astype(np.float32), rng.normal(size=(T, E)).astype(np.float32),
                       terminated, truncated, np.where(truncated > 0, rng.normal(size=(T, E)), 0).astype(np.float32))
    after = np.full((E, 1), -1.0, np.float32)
    batch = ppo.unrolls(cfg, traj, after)
    assert batch.inputs.shape == (T // N * E, N, 1) and batch.unroll.next_inputs.shape == (T // N * E, 1)
    critic = rng.normal(size=(T // N * E, N)).astype(np.float32)  # the values "the critic" gives now
    next_value = rng.normal(size=T // N * E).astype(np.float32)
    par = parallel.setup("pmap", 1)
    adv, target = par.first(par.map(lambda b, v, nv: ppo.unroll_targets(cfg, b, v, nv))(
        *par.replicate((batch, critic, next_value))))

    expected_adv, expected_target = np.zeros_like(critic), np.zeros_like(critic)
    for u in range(T // N * E):
        k, e = divmod(u, E)  # unroll k of environment e
        steps = range(k * N, (k + 1) * N)
        np.testing.assert_array_equal(batch.inputs[u, :, 0], [t * 10 + e for t in steps])
        np.testing.assert_array_equal(batch.unroll.next_inputs[u, 0], -1.0 if k == T // N - 1 else (k + 1) * N * 10 + e)
        later = 0.0
        for i in reversed(range(N)):
            t = k * N + i
            following = next_value[u] if i == N - 1 else critic[u, i + 1]
            following = traj.bootstrap[t, e] if truncated[t, e] else following * (1 - terminated[t, e])
            delta = traj.reward[t, e] + cfg.gamma * following - critic[u, i]
            later = delta + (0.0 if ended[t, e] else cfg.gamma * cfg.gae_lambda * later)
            expected_adv[u, i] = later
        expected_target[u] = expected_adv[u] + critic[u]
    np.testing.assert_allclose(target, expected_target, rtol=1e-5, atol=1e-5)
    normalised = (expected_adv - expected_adv.mean()) / (expected_adv.std() + 1e-8)
    np.testing.assert_allclose(adv, normalised, rtol=1e-4, atol=1e-4)


def test_unroll_length_must_fit_the_batch_in_one_line():
    for overrides, words in (({"num_steps": 16, "unroll_length": 5}, "does not divide --num-steps 16"),
                             ({"num_envs": 16, "unroll_length": 16, "num_minibatches": 32}, "unrolls per device"),
                             ({"unroll_length": 4, "grad_accum": 2}, "--grad-accum 1")):
        with pytest.raises(ConfigError, match=words):
            ppo.check(resolved(pendulum_config(**overrides)), 1)


def test_the_clipped_surrogate_takes_the_pessimistic_bound_and_no_gradient_past_the_clip():
    """ratio 1.5 with a positive advantage is clipped to 1.2 (no gradient: the update gains
    nothing by moving further), with a negative one it is not (the worse of the two is kept);
    ratio 0.5 mirrors it; inside [0.8, 1.2] the loss is -ratio * advantage."""
    log_ratio = jnp.log(jnp.asarray([1.5, 1.5, 0.5, 0.5, 1.1], jnp.float32))
    adv = jnp.asarray([2.0, -2.0, 2.0, -2.0, 3.0], jnp.float32)
    loss, _, clipped = ppo.clipped_surrogate(log_ratio, adv, 0.2)
    np.testing.assert_allclose(loss, [-2.4, 3.0, -1.0, 1.6, -3.3], rtol=1e-6)
    assert np.asarray(clipped).tolist() == [1, 1, 1, 1, 0]
    grad = jax.grad(lambda r: ppo.clipped_surrogate(r, adv, 0.2)[0].sum())(log_ratio)
    np.testing.assert_allclose(grad, [0.0, 3.0, -1.0, 0.0, -3.3], rtol=1e-6, atol=1e-7)
