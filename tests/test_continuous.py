"""Box (continuous) actions: a diagonal Gaussian policy for PPO, refused by DQN and AD."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.pendulum import Pendulum

from helpers import assert_trees_close, make_trainer
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs, parallel
from jaxrl_mgpu.algos import ad, dqn, ppo
from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.evaluate import make_episodes
from jaxrl_mgpu.nets import actor_critic

SMALL = dict(env="Pendulum-v1", num_envs=16, num_steps=16, update_epochs=2, hidden_size=32,
             total_timesteps=16 * 16 * 8)
HALF_LOG_2_PI_E = 0.5 * np.log(2 * np.pi * np.e)  # entropy of a unit Gaussian


def small_config(**overrides):
    return config_lib.validate(dataclasses.replace(config_lib.Config(), **{**SMALL, **overrides}))


class RecordingPendulum(Pendulum):
    """Pendulum whose reward is the first action component it was given and whose `last_u`
    is that action as given (the real one clips it first): what the trainer hands the env."""

    def step_env(self, key, state, action, params):
        obs, new_state, _, done, info = super().step_env(key, state, action, params)
        given = jnp.asarray(action, jnp.float32).reshape(-1)[0]
        return obs, new_state.replace(last_u=given), given, done, info


def test_gaussian_log_prob_and_entropy_match_a_hand_computation():
    rng = np.random.default_rng(0)
    n, d = 64, 3
    mean, log_std = rng.normal(size=(n, d)), 0.7 * rng.normal(size=(n, d))
    x = mean + 1.5 * np.exp(log_std) * rng.normal(size=(n, d))  # not so far out that the density is 0
    dist = actor_critic.DiagGaussian(low=(-1.0,) * d, high=(1.0,) * d)
    pi = (jnp.asarray(mean, jnp.float32), jnp.asarray(log_std, jnp.float32))

    # The density of independent dimensions is the product of 1-D normal densities.
    std = np.exp(log_std)
    density = np.prod(np.exp(-0.5 * ((x - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi)), axis=-1)
    np.testing.assert_allclose(dist.log_prob(pi, jnp.asarray(x, jnp.float32)), np.log(density), rtol=1e-5, atol=1e-5)
    # Entropy: the sum over dimensions of log(std * sqrt(2 pi e)).
    np.testing.assert_allclose(dist.entropy(pi), np.log(std * np.sqrt(2 * np.pi * np.e)).sum(-1), rtol=1e-5)
    # ... and it is what samples say it is: -E[log p(sample)].
    keys = jax.random.split(jax.random.PRNGKey(0), 20000)
    one = (jnp.broadcast_to(pi[0][0], (20000, d)), jnp.broadcast_to(pi[1][0], (20000, d)))
    samples = dist.sample(one, dist.noise(keys))
    np.testing.assert_allclose(samples.mean(0), mean[0], atol=0.05 * std[0].max())
    np.testing.assert_allclose(samples.std(0), std[0], rtol=0.03)
    np.testing.assert_allclose(-dist.log_prob(one, samples).mean(), dist.entropy(pi)[0], rtol=0.02)


def test_the_env_gets_clipped_actions_and_the_log_prob_is_of_the_raw_sample():
    cfg = small_config(num_envs=32)
    env, env_params = RecordingPendulum(), Pendulum().default_params
    algo = ppo.make(cfg, env, env_params, ppo.check(cfg, 1))
    dist = actor_critic.distribution(env, env_params)
    assert dist == actor_critic.DiagGaussian(low=(-2.0,), high=(2.0,))
    params = algo.init_params(jax.random.PRNGKey(0))
    params["params"]["log_std"] = jnp.full((1,), 1.5)  # std 4.5: most samples fall outside [-2, 2]
    par = parallel.setup("pmap", 1)

    def rollout(params, key):
        state = algo.init(key)
        envs_after, _, traj, _, _ = algo.rollout(params, state.envs, state.memory, state.key)
        pi, _ = algo.policy.evaluate(params, (), traj.inputs)
        return envs_after.state.last_u, traj, pi

    last_u, traj, pi = par.first(par.map(rollout)(par.replicate(params), par.replicate(jax.random.PRNGKey(1))))
    action = np.asarray(traj.action)
    assert action.shape == (cfg.num_steps, cfg.num_envs, 1)
    assert (np.abs(action) > 2).mean() > 0.3
    # The environment got the clipped action (what it recorded, and its reward here) ...
    np.testing.assert_array_equal(np.asarray(last_u), np.clip(action[-1, :, 0], -2, 2))
    np.testing.assert_array_equal(np.asarray(traj.reward), np.clip(action[..., 0], -2, 2))
    # ... while the log-prob is the Gaussian's density at the unclipped sample.
    np.testing.assert_allclose(traj.log_prob, dist.log_prob(pi, jnp.asarray(action)), rtol=1e-5, atol=1e-5)
    clipped = dist.log_prob(pi, jnp.clip(jnp.asarray(action), -2, 2))
    assert np.abs(np.asarray(traj.log_prob) - np.asarray(clipped)).max() > 0.1


@pytest.mark.parametrize("normalize_reward", [False, True])
def test_one_pendulum_update_on_8_devices_equals_1_device(normalize_reward):
    one = make_trainer(1, num_minibatches=1, normalize_reward=normalize_reward, **SMALL)
    eight = make_trainer(8, num_minibatches=1, normalize_reward=normalize_reward, **SMALL)
    (state1, _), (state8, _) = (t.chunk_fn(1, s)(s) for t, s in ((one, one.init_state()), (eight, eight.init_state())))
    params1, params8 = one.par.first(state1.params), eight.par.first(state8.params)
    assert_trees_close(params1, params8, rtol=1e-5)
    init = one.par.first(one.init_state().params)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), init, params1)
    assert max(jax.tree.leaves(moved)) > 1e-4
    assert moved["params"]["log_std"] > 1e-5  # the log-std is learned
    if normalize_reward:
        stats1, stats8 = one.par.first(state1.return_stats), eight.par.first(state8.return_stats)
        assert_trees_close(stats1, stats8, rtol=1e-5)
        assert stats1.count > SMALL["num_envs"] * SMALL["num_steps"] and stats1.var > 10  # Pendulum's returns
        global_returns = lambda t, s: np.asarray(t.par.local(s.returns)).reshape(-1)
        np.testing.assert_allclose(global_returns(one, state1), global_returns(eight, state8), rtol=1e-5)


def test_reward_normalisation_matches_a_numpy_reference_over_devices():
    """Discounted returns restarted after episode ends, their moments over all devices merged
    into the running ones, rewards divided by the new standard deviation."""
    from types import SimpleNamespace

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


def test_a_resumed_run_with_reward_normalisation_equals_an_uninterrupted_one(tmp_path):
    from jaxrl_mgpu import evaluate, train

    def run(*argv):
        # One minibatch: the update is then the same on any device count (see test_data_parallel).
        try:
            return train.main(["--env", "Pendulum-v1", "--normalize-reward", "--num-envs", "16", "--num-steps", "16",
                               "--num-minibatches", "1", "--hidden-size", "16", "--total-timesteps",
                               str(16 * 16 * 6), "--log-every", "2", "--checkpoint-every", "2", *argv])
        except SystemExit as e:
            return e.code

    straight, same, fewer = tmp_path / "straight", tmp_path / "same", tmp_path / "fewer"
    assert run("--run-dir", str(straight)) == 0
    for run_dir, devices in ((same, "8"), (fewer, "2")):
        assert run("--run-dir", str(run_dir), "--stop-at-update", "2") == 0
        assert run("--run-dir", str(run_dir), "--resume", "--devices", devices) == 0
    (step_a, params_a), (step_b, params_b), (step_c, params_c) = (
        evaluate.load_params(str(d)) for d in (straight, same, fewer))
    assert step_a == step_b == step_c == 6
    # Without the return statistics and the running returns in the checkpoint, the resumed
    # runs would scale their rewards by another standard deviation.
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)  # bitwise on CPU
    assert_trees_close(params_a, params_c, rtol=1e-4, atol=1e-6)      # 2 devices sum in another order


def test_the_policy_has_one_gaussian_per_action_dimension_and_nonzero_entropy():
    trainer = make_trainer(1, **{**SMALL, "env": "Reacher-misc"})  # 2 action dimensions
    state = trainer.init_state()
    params = trainer.par.first(state.params)["params"]
    assert params["log_std"].shape == (2,)
    assert params["actor"]["Dense_2"]["kernel"].shape[-1] == 2
    _, chunk = trainer.chunk_fn(1, state)(state)
    # log_std starts at 0: two unit Gaussians, nudged by one update.
    np.testing.assert_allclose(trainer.par.first(chunk.losses)["loss/entropy"], 2 * HALF_LOG_2_PI_E, rtol=1e-2)


def test_greedy_evaluation_acts_with_the_mean_clipped_to_the_bounds():
    env, env_params = RecordingPendulum(), Pendulum().default_params
    par = parallel.setup("pmap", 1)

    def returns(mean: float, greedy: bool) -> float:
        def act(params, memory, obs, final_obs):
            n = obs.shape[0]
            return (jnp.full((n, 1), mean), jnp.zeros((n, 1))), jnp.zeros(n), jnp.zeros(n), memory

        policy = actor_critic.Policy(None, lambda n: (), act, lambda m, a, r, d: m, None, None, False)
        run = par.map(make_episodes(policy, env, env_params, 4, 1, greedy))
        totals = par.first(run(par.replicate(jnp.zeros(())), par.replicate(jax.random.PRNGKey(0))))
        return float(totals[0] / totals[2])  # the reward is the action the env got, 200 steps

    assert returns(1.5, greedy=True) == pytest.approx(1.5 * 200)
    assert returns(5.0, greedy=True) == pytest.approx(2.0 * 200)   # clipped to the bound
    assert abs(returns(1.5, greedy=False) - 1.5 * 200) > 1.0       # sampling: not the mean


@pytest.mark.parametrize("algo, module, extra", [
    ("dqn", dqn, {}),
    ("ad", ad, {"num_updates": 1}),
])
def test_dqn_and_ad_refuse_continuous_actions_in_one_line(algo, module, extra):
    cfg = dataclasses.replace(config_lib.Config(), algo=algo, env="Pendulum-v1", **extra)
    with pytest.raises(ConfigError) as e:
        module.check(cfg, 1)
    message = str(e.value)
    assert "\n" not in message and "Pendulum-v1" in message and "continuous" in message and f"--algo {algo}" in message


def test_the_transformer_policy_refuses_continuous_actions_in_one_line():
    cfg = dataclasses.replace(config_lib.Config(), env="MountainCarContinuous-v0", policy="transformer")
    with pytest.raises(ConfigError, match="--policy transformer.*MountainCarContinuous-v0.*--policy mlp"):
        ppo.check(cfg, 1)


def test_discrete_action_envs_still_get_a_categorical():
    env, env_params = envs.make("CartPole-v1")
    assert actor_critic.distribution(env, env_params) == actor_critic.Categorical(2)
    ppo.check(dataclasses.replace(config_lib.Config(), policy="transformer"), 1)  # no refusal
