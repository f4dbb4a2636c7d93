"""Box (continuous) actions: a diagonal Gaussian policy for PPO, refused by DQN and AD."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.pendulum import Pendulum

from helpers import PENDULUM, assert_trees_close, make_trainer, pendulum_config, resolved
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs, parallel
from jaxrl_mgpu.algos.ad import ad
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.evaluate import make_episodes
from jaxrl_mgpu.nets import actor_critic, factory, obs_norm

HALF_LOG_2_PI_E = 0.5 * np.log(2 * np.pi * np.e)  # entropy of a unit Gaussian


class RecordingPendulum(Pendulum):
    """Pendulum whose reward is the first action component it was given and whose `last_u`
    is that action as given (the real one clips it first): what the trainer hands the env."""

    def step_env(self, key, state, action, params):
        obs, new_state, _, done, info = super().step_env(key, state, action, params)
        given = jnp.asarray(action, jnp.float32).reshape(-1)[0]
        return obs, new_state.replace(last_u=given), given, done, info


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_env_gets_clipped_actions_and_the_log_prob_is_of_the_raw_sample():
    cfg = pendulum_config(num_envs=32)
    env, env_params = RecordingPendulum(), Pendulum().default_params
    algo = ppo.make(cfg, env, env_params, ppo.check(resolved(cfg), 1))
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


@pytest.mark.slow
@pytest.mark.parametrize("normalize_reward", [False, True])
def test_one_pendulum_update_on_8_devices_equals_1_device(normalize_reward):
    one = make_trainer(1, num_minibatches=1, normalize_reward=normalize_reward, **PENDULUM)
    eight = make_trainer(8, num_minibatches=1, normalize_reward=normalize_reward, **PENDULUM)
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
        assert stats1.count > PENDULUM["num_envs"] * PENDULUM["num_steps"] and stats1.var > 10  # Pendulum's returns
        global_returns = lambda t, s: np.asarray(t.par.local(s.returns)).reshape(-1)
        np.testing.assert_allclose(global_returns(one, state1), global_returns(eight, state8), rtol=1e-5)


@pytest.mark.slow
def test_a_resumed_run_with_reward_normalisation_equals_an_uninterrupted_one(tmp_path):
    from jaxrl_mgpu import evaluate, train

    def run(*argv):
        # One minibatch: the update is then the same on any device count (see test_parallel.py).
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


@pytest.mark.slow
def test_the_policy_has_one_gaussian_per_action_dimension_and_nonzero_entropy():
    trainer = make_trainer(1, **{**PENDULUM, "env": "Reacher-misc"})  # 2 action dimensions
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
    cfg = config_lib.build(dict(algo=algo, env="Pendulum-v1", **extra))
    with pytest.raises(ConfigError) as e:
        module.check(resolved(cfg), 1)
    message = str(e.value)
    assert "\n" not in message and "Pendulum-v1" in message and "continuous" in message and f"--algo {algo}" in message


def test_the_transformer_policy_refuses_continuous_actions_in_one_line():
    cfg = config_lib.build(dict(env="MountainCarContinuous-v0", policy="transformer"))
    with pytest.raises(ConfigError, match="--policy transformer.*MountainCarContinuous-v0.*--policy mlp"):
        ppo.check(resolved(cfg), 1)


def test_discrete_action_envs_still_get_a_categorical():
    env, env_params = envs.make("CartPole-v1")
    assert actor_critic.distribution(env, env_params) == actor_critic.Categorical(2)
    ppo.check(resolved(config_lib.build(dict(policy="transformer"))), 1)  # no refusal


# -- continuous control at Brax's scale (issue 50, point 4) ------------------------------------

@pytest.mark.slow
def test_tanh_normal_log_prob_and_entropy_match_a_direct_computation():
    from scipy.stats import norm

    rng = np.random.default_rng(1)
    n, d = 64, 3
    loc, raw = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    scale = np.log1p(np.exp(raw)) + 0.001  # softplus + Brax's minimum std
    e = rng.normal(size=(n, d))
    u = loc + scale * e
    dist = actor_critic.TanhNormal(low=(-1.0,) * d, high=(1.0,) * d)
    pi = jnp.asarray(np.concatenate([loc, raw], -1), jnp.float32)
    assert dist.num_outputs == 2 * d

    # The density of the action a = tanh(u): by the change of variables, and independently as
    # the derivative of its distribution function P(tanh(U) <= a) = Phi((atanh(a) - loc) / scale).
    a = np.tanh(u)
    by_change = (norm.logpdf(u, loc, scale) - np.log(1 - a ** 2)).sum(-1)
    h = 1e-6 * (1 - a ** 2)
    cdf = lambda x: norm.cdf((np.arctanh(x) - loc) / scale)  # noqa: E731
    by_cdf = np.log((cdf(a + h) - cdf(a - h)) / (2 * h)).sum(-1)
    np.testing.assert_allclose(by_change, by_cdf, rtol=1e-4)
    np.testing.assert_allclose(dist.log_prob(pi, jnp.asarray(u, jnp.float32)), by_change, rtol=1e-4, atol=1e-4)

    # The entropy estimate at the sample drawn with noise e: H(Normal) + log(1 - tanh(u)^2), as
    # Brax's one-sample estimate ...
    direct = (np.log(scale) + HALF_LOG_2_PI_E + np.log(1 - a ** 2)).sum(-1)
    np.testing.assert_allclose(dist.entropy(pi, jnp.asarray(e, jnp.float32)), direct, rtol=1e-4, atol=1e-4)
    # ... its gradient that of the reparameterised sample u = loc + scale * e, e held fixed, also
    # at params the sample was not drawn from (a later epoch's) ...
    moved = pi.at[:, :d].add(1.5).at[:, d:].add(-1.0)

    def reparameterised(p):
        loc_, raw_ = jnp.split(p, 2, -1)
        scale_ = jax.nn.softplus(raw_) + 0.001
        return (jnp.log(scale_) + HALF_LOG_2_PI_E + jnp.log1p(-jnp.tanh(loc_ + scale_ * e) ** 2)).sum()

    for p in (pi, moved):
        np.testing.assert_allclose(jax.grad(lambda p: dist.entropy(p, jnp.asarray(e, jnp.float32)).sum())(p),
                                   jax.grad(reparameterised)(p), rtol=1e-3, atol=1e-4)
    # ... and unbiased: its mean over samples is the squashed distribution's entropy -E[log p(a)],
    # here by quadrature over u.
    one = jnp.broadcast_to(pi[0], (20000, 2 * d))
    noise = dist.noise(jax.random.split(jax.random.PRNGKey(0), 20000))
    samples = dist.sample(one, noise)
    grid = np.linspace(-12, 12, 200001)[:, None] * scale[0] + loc[0]
    weights = norm.pdf(grid, loc[0], scale[0])
    exact = (np.log(scale[0]) + HALF_LOG_2_PI_E + np.trapezoid(weights * np.log1p(-np.tanh(grid) ** 2), grid, axis=0)).sum()
    np.testing.assert_allclose(float(dist.entropy(one, noise).mean()), exact, rtol=0.02)
    np.testing.assert_allclose(float(-dist.log_prob(one, samples).mean()), exact, rtol=0.02)


@pytest.mark.slow
def test_tanh_normal_acts_within_the_bounds_and_keeps_the_sample_before_squashing():
    """The env gets tanh(u) mapped onto Pendulum's [-2, 2]; the rollout keeps u and its log-prob;
    greedy evaluation acts with tanh(loc)."""
    cfg = pendulum_config(num_envs=32, action_dist="tanh_normal")
    env, env_params = RecordingPendulum(), Pendulum().default_params
    algo = ppo.make(cfg, env, env_params, ppo.check(resolved(cfg), 1))
    dist = algo.policy.dist
    assert dist == actor_critic.TanhNormal(low=(-2.0,), high=(2.0,))
    params = algo.init_params(jax.random.PRNGKey(0))
    assert "log_std" not in params["params"]  # the std comes from the actor head
    assert params["params"]["actor"]["Dense_2"]["kernel"].shape[-1] == 2
    head = params["params"]["actor"]["Dense_2"]  # loc 0.3 and std softplus(1) + 0.001 in every state
    head["kernel"], head["bias"] = jnp.zeros_like(head["kernel"]), jnp.array([0.3, 1.0])
    par = parallel.setup("pmap", 1)

    def rollout(params, key):
        state = algo.init(key)
        _, _, traj, _, _ = algo.rollout(params, state.envs, state.memory, state.key)
        pi, _ = algo.policy.evaluate(params, (), traj.inputs)
        return traj, pi

    traj, pi = par.first(par.map(rollout)(par.replicate(params), par.replicate(jax.random.PRNGKey(1))))
    u = np.asarray(traj.action)
    assert (np.abs(u) > 1.5).mean() > 0.05  # samples well into tanh's flat part
    np.testing.assert_allclose(np.asarray(traj.reward), 2 * np.tanh(u[..., 0]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(traj.log_prob, dist.log_prob(pi, jnp.asarray(u)), rtol=1e-5, atol=1e-5)

    def greedy_return(params):
        run = par.map(make_episodes(algo.policy, env, env_params, 4, 1, greedy=True))
        totals = par.first(run(par.replicate(params), par.replicate(jax.random.PRNGKey(0))))
        return float(totals[0] / totals[2])

    assert greedy_return(params) == pytest.approx(200 * 2 * np.tanh(0.3), rel=1e-4)


def test_tanh_normal_refuses_discrete_and_unbounded_actions_in_one_line():
    cfg = config_lib.build(dict(action_dist="tanh_normal"))
    with pytest.raises(ConfigError, match="--action-dist tanh_normal is for Box.*CartPole-v1") as e:
        ppo.check(resolved(cfg), 1)
    assert "\n" not in str(e.value)

    class Unbounded(Pendulum):
        def action_space(self, params=None):
            from gymnax.environments import spaces
            return spaces.Box(-jnp.inf, jnp.inf, (1,), jnp.float32)

    with pytest.raises(ConfigError, match="unbounded actions: use --action-dist clipped_normal"):
        actor_critic.distribution(Unbounded(), Pendulum().default_params, "tanh_normal")
    assert isinstance(actor_critic.distribution(Unbounded(), Pendulum().default_params), actor_critic.DiagGaussian)


@pytest.mark.slow
def test_actor_and_critic_take_their_own_widths():
    trainer = make_trainer(1, **{**PENDULUM, "actor_hidden": "32,32,32,32", "critic_hidden": "256,256,256,256,256",
                                 "action_dist": "tanh_normal", "activation": "swish"})
    params = trainer.par.first(trainer.init_state().params)["params"]
    shapes = lambda net: [params[net][f"Dense_{i}"]["kernel"].shape for i in range(len(params[net]))]  # noqa: E731
    assert shapes("actor") == [(3, 32), (32, 32), (32, 32), (32, 32), (32, 2)]  # Pendulum: 3 obs, loc and scale
    assert shapes("critic") == [(3, 256)] + [(256, 256)] * 4 + [(256, 1)]
    default = make_trainer(1, **{**PENDULUM, "hidden_size": 24, "num_layers": 3})
    params = default.par.first(default.init_state().params)["params"]
    assert shapes("actor") == [(3, 24), (24, 24), (24, 24), (24, 1)] and shapes("critic")[-1] == (24, 1)
    for bad in ("32,,32", "0,4", "a", ""):
        with pytest.raises(ConfigError, match="--actor-hidden .*positive whole numbers separated by commas"):
            ppo.check(resolved(pendulum_config(actor_hidden=bad)), 1)


def test_bad_new_options_on_the_command_line_are_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    from helpers import run

    for argv, says in ((["--critic-hidden", "64,x"], "--critic-hidden '64,x'"),
                       (["--reward-scale", "0"], "--reward-scale must be > 0"),
                       (["--action-dist", "beta"], "--action-dist 'beta' is not valid"),
                       (["--env", "CartPole-v1", "--action-dist", "tanh_normal"], "discrete actions"),
                       (["--algo", "dqn", "--env", "CartPole-v1", "--normalize-obs"], "--normalize-obs is only for"),
                       (["--policy", "transformer", "--env", "CartPole-v1", "--actor-hidden", "8"],
                        "--actor-hidden is only for"),
                       (["--env", "TagGridworld-v0", "--normalize-obs"], "multi-agent game"),
                       (["--env", "TagGridworld-v0", "--unroll-length", "4"], "does not take --unroll-length 4"),
                       (["--policy", "transformer", "--env", "CartPole-v1", "--unroll-length", "4"],
                        "--unroll-length is only for"),
                       (["--num-steps", "16", "--unroll-length", "5"], "--unroll-length 5 does not divide"),
                       (["--unroll-length", "-1"], "--unroll-length must be >= 0")):
        argv = ["--env", "Pendulum-v1", *argv] if "--env" not in argv else argv
        assert run(*argv, "--run-dir", str(tmp_path / "run")) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_reward_scale_scales_the_value_targets():
    rng = np.random.default_rng(2)
    steps, n = 16, 8
    ends = rng.random((steps, n)) < 0.15
    traj = ppo.Rollout(None, None, None, jnp.zeros((steps, n)), jnp.asarray(rng.normal(size=(steps, n)), jnp.float32),
                       jnp.asarray(ends & (rng.random((steps, n)) < 0.5), jnp.float32),
                       jnp.asarray(ends & (rng.random((steps, n)) >= 0.5), jnp.float32), jnp.zeros((steps, n)))
    cfg = pendulum_config()
    targets = {scale: ppo.learning_targets(dataclasses.replace(cfg, reward_scale=scale), traj, jnp.zeros(n), (), ())[1]
               for scale in (1.0, 10.0)}
    # With a zero value function the targets are discounted reward sums: linear in the rewards.
    np.testing.assert_allclose(targets[10.0], 10 * np.asarray(targets[1.0]), rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(targets[1.0])).max() > 0.5


def obs_stats(trainer, state):
    return trainer.par.first(state.params)[obs_norm.OBS_STATS]


def test_observation_statistics_all_reduce_matches_numpy_over_the_whole_batch():
    """Chan's combination of the running (count, mean, M2) with a batch spread over 4 devices
    equals the moments of the prior data and the whole batch together (float64 numpy), on every
    device; the same batch on 1 device gives the same statistics."""
    rng = np.random.default_rng(3)
    devices, per_device, shape = 4, (6, 5), (3,)
    obs = (50 + 3 * rng.normal(size=(devices, *per_device, *shape))).astype(np.float32)  # far from zero: cancellation
    prior = 48 + 2 * rng.normal(size=(100, *shape))
    stats = obs_norm.RunningStats(np.float32(100), prior.mean(0).astype(np.float32),
                                  ((prior - prior.mean(0)) ** 2).sum(0).astype(np.float32))
    everything = np.concatenate([prior, obs.reshape(-1, *shape)])

    par = parallel.setup("pmap", devices)
    new = par.map(obs_norm.update)(par.replicate(stats), par.shard(obs))
    every_device = par.local(new)
    for leaf in jax.tree.leaves(every_device):
        for d in range(1, devices):
            np.testing.assert_array_equal(leaf[0], leaf[d])
    new = par.first(new)
    assert float(new.count) == len(everything)
    np.testing.assert_allclose(new.mean, everything.mean(0), rtol=1e-6)
    np.testing.assert_allclose(new.m2 / new.count, everything.var(0), rtol=1e-5)
    np.testing.assert_allclose(obs_norm.std(new), everything.std(0), rtol=1e-5)
    np.testing.assert_allclose(obs_norm.normalize(new, obs[0, 0]), (obs[0, 0] - everything.mean(0)) / everything.std(0),
                               rtol=1e-4, atol=1e-5)

    one = parallel.setup("pmap", 1)
    alone = one.first(one.map(obs_norm.update)(one.replicate(stats), one.shard(obs.reshape(1, -1, *shape))))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), alone, new)
    # Before any update: mean 0 and std 1, so the first rollout sees the raw observations.
    fresh = obs_norm.RunningStats.init(shape)
    np.testing.assert_array_equal(obs_norm.normalize(fresh, obs[0, 0]), obs[0, 0])


@pytest.mark.slow
def test_observation_statistics_count_each_rollout_before_the_learner_uses_it():
    """After one update the statistics are the moments of that update's rollout; the rollout
    acted with the statistics before it (here the identity), and the learner learned with the
    new ones: its first minibatch already sees the policy move (ratio != 1)."""
    # One epoch of one minibatch: had the learner used the statistics the rollout acted with,
    # its only minibatch would see the rollout's own policy (ratio exactly 1, KL exactly 0).
    trainer = make_trainer(1, normalize_obs=True, num_minibatches=1, **{**PENDULUM, "update_epochs": 1})
    state = trainer.init_state()
    algo, par = trainer.algorithm.parts, trainer.par

    def first_rollout(state):
        _, rollout_key, _ = jax.random.split(state.key, 3)
        return algo.rollout(state.params, state.envs, state.memory, rollout_key)[2].inputs

    observed = np.asarray(par.first(par.map(first_rollout)(state))).reshape(-1, 3)
    assert float(obs_stats(trainer, state).count) == 0
    after, metrics = trainer.chunk_fn(1, state)(state)  # (donates `state`)
    stats = obs_stats(trainer, after)
    assert float(stats.count) == len(observed) == PENDULUM["num_envs"] * PENDULUM["num_steps"]
    np.testing.assert_allclose(stats.mean, observed.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats.m2 / stats.count, observed.var(0), rtol=1e-4)
    assert np.asarray(metrics.losses["loss/approx_kl"]).ravel()[0] > 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("action_dist, unroll_length", [("clipped_normal", 0), ("tanh_normal", 0), ("tanh_normal", 4)])
def test_two_updates_with_observation_normalisation_on_8_devices_equal_1_device(action_dist, unroll_length):
    opts = dict(PENDULUM, normalize_obs=True, num_minibatches=1, action_dist=action_dist, reward_scale=0.1,
                clip_value=False, unroll_length=unroll_length)
    one, eight = make_trainer(1, **opts), make_trainer(8, **opts)
    (state1, _), (state8, _) = (t.chunk_fn(2, s)(s) for t, s in ((one, one.init_state()), (eight, eight.init_state())))
    stats1, stats8 = obs_stats(one, state1), obs_stats(eight, state8)
    assert float(stats1.count) == float(stats8.count) == 2 * PENDULUM["num_envs"] * PENDULUM["num_steps"]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), stats1, stats8)
    assert_trees_close(one.par.first(state1.params), eight.par.first(state8.params), rtol=1e-5)
    for leaf in jax.tree.leaves(eight.par.local(state8.params)):  # the same on every device
        for d in range(1, 8):
            np.testing.assert_array_equal(leaf[0], leaf[d])


NORMALIZED_RUN = ["--env", "Pendulum-v1", "--normalize-obs", "--action-dist", "tanh_normal", "--num-envs", "16",
                  "--num-steps", "16", "--num-minibatches", "1", "--hidden-size", "16", "--total-timesteps",
                  str(16 * 16 * 6), "--log-every", "2", "--checkpoint-every", "2"]


@pytest.fixture(scope="module")
def normalized_runs(tmp_path_factory):
    """A run with --normalize-obs straight through (8 devices), and the same stopped at update 2
    and resumed on 8 devices, and on 2."""
    from helpers import run

    root = tmp_path_factory.mktemp("normalized")
    straight, same, fewer = root / "straight", root / "same", root / "fewer"
    assert run(*NORMALIZED_RUN, "--run-dir", str(straight)) == 0
    for run_dir, devices in ((same, "8"), (fewer, "2")):
        assert run(*NORMALIZED_RUN, "--run-dir", str(run_dir), "--stop-at-update", "2") == 0
        assert run(*NORMALIZED_RUN, "--run-dir", str(run_dir), "--resume", "--devices", devices) == 0
    return straight, same, fewer


@pytest.mark.slow
def test_a_resumed_run_with_observation_normalisation_equals_an_uninterrupted_one(normalized_runs):
    from jaxrl_mgpu import evaluate

    (step_a, params_a), (step_b, params_b), (step_c, params_c) = (evaluate.load_params(str(d))
                                                                  for d in normalized_runs)
    assert step_a == step_b == step_c == 6
    # The statistics are checkpointed with the params: a resume that lost them would start
    # counting again (and normalise with other moments).
    assert float(params_a[obs_norm.OBS_STATS].count) == float(params_c[obs_norm.OBS_STATS].count) == 6 * 16 * 16
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)  # bitwise on CPU, statistics included
    assert_trees_close(params_a, params_c, rtol=1e-4, atol=1e-6)      # 2 devices sum in another order


@pytest.mark.slow
def test_evaluate_normalises_observations_with_the_runs_statistics(normalized_runs, capsys):
    """`evaluate` returns exactly what the run's params (statistics included) score on the same
    episodes, and not what the same weights score without the statistics."""
    import json

    from jaxrl_mgpu import evaluate

    run_dir = str(normalized_runs[0])
    assert evaluate.main(["--run-dir", run_dir, "--episodes", "4", "--devices", "2", "--greedy"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _, params = evaluate.load_params(run_dir)
    cfg = config_lib.from_dict(config_lib.read_saved(run_dir))
    env, env_params = envs.make(cfg.env)
    algo = ppo.make(cfg, env, env_params, ppo.check(resolved(cfg), 2))
    par = parallel.setup("pmap", 2)
    run = par.map(make_episodes(algo.policy, env, env_params, 4, 2, greedy=True))

    def mean_return(params):
        totals = par.first(run(par.replicate(params), par.replicate(np.asarray(jax.random.PRNGKey(1)))))
        return float(totals[0] / totals[2])

    assert printed["mean_return"] == pytest.approx(mean_return(params), rel=1e-6)
    identity = {**params, obs_norm.OBS_STATS: jax.tree.map(np.zeros_like, params[obs_norm.OBS_STATS])}
    assert abs(mean_return(identity) - printed["mean_return"]) > 1.0


@pytest.mark.slow
def test_many_runs_keep_their_own_observation_statistics():
    """--num-seeds 2 --sweep reward_scale=1,10 with --normalize-obs and the tanh-squashed
    normal: run i equals the single run of its seed and reward scale, statistics included."""
    opts = dict(PENDULUM, normalize_obs=True, num_minibatches=1, action_dist="tanh_normal", clip_value=False)
    multi = make_trainer(2, "shard_map", num_seeds=2, sweep="reward_scale=1,10", **opts)
    state, _ = multi.chunk_fn(2, multi.init_state())(multi.init_state())
    params = multi.par.runs_of(state.params)
    for i in (1, 2):  # seed 1 with scale 1; seed 0 with scale 10
        single = make_trainer(1, seed=i % 2, reward_scale=multi.runs.hparams(i)["reward_scale"], **opts)
        state1, _ = single.chunk_fn(2, single.init_state())(single.init_state())
        assert_trees_close(single.par.first(state1.params), jax.tree.map(lambda x: x[i], params), rtol=1e-5, atol=1e-6)
    counts = params[obs_norm.OBS_STATS].count
    np.testing.assert_array_equal(counts, 2 * PENDULUM["num_envs"] * PENDULUM["num_steps"])
    assert np.abs(params[obs_norm.OBS_STATS].mean[0] - params[obs_norm.OBS_STATS].mean[1]).max() > 1e-3  # seeds differ


@pytest.mark.slow
def test_pendulum_learns_with_observation_normalisation_and_the_tanh_squashed_normal(tmp_path):
    """200k steps on one device (about 10 s after a 20 s compile on 2 cores): from random play's
    about -1200 to better than -500 (seeds 0-2 reach -260 to -280)."""
    import json

    from helpers import run

    assert run("--env", "Pendulum-v1", "--normalize-obs", "--action-dist", "tanh_normal", "--reward-scale", "0.1",
               "--no-clip-value", "--gamma", "0.95", "--num-envs", "64", "--num-steps", "64", "--num-minibatches", "8",
               "--lr", "1e-3", "--no-anneal-lr", "--ent-coef", "0", "--total-timesteps", str(64 * 64 * 50),
               "--devices", "1", "--checkpoint-every", "0", "--run-dir", str(tmp_path / "run")) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["episode_return"] < -1000  # the first 10 updates: about random
    assert rows[-1]["episode_return"] > -500, [row["episode_return"] for row in rows]


# (preset, Brax's num_envs, batch_size, num_minibatches, unroll_length, num_updates_per_batch, training steps)
BRAX_PRESETS = [("brax-ant", 4096, 2048, 32, 5, 4, 153), ("brax-humanoid", 2048, 1024, 32, 10, 8, 153),
                ("dmc-cheetah-run", 2048, 1024, 32, 30, 16, 90),
                ("dmc-humanoid-walk", 2048, 1024, 32, 30, 16, 90)]


@pytest.mark.parametrize("preset, envs, batch, minibatches, unroll, epochs, updates", BRAX_PRESETS)
def test_brax_scale_presets_have_brax_batches(preset, envs, batch, minibatches, unroll, epochs, updates):
    """Each update is one Brax training step: batch_size x num_minibatches unrolls, split into
    minibatches of batch_size unrolls, passed over num_updates_per_batch times; on 1 and 8
    devices. (Their environments come with the brax and dmc extras; Pendulum-v1 stands in.)"""
    cfg = config_lib.build(config_lib.load_preset(preset))
    assert (cfg.num_envs, cfg.num_minibatches, cfg.update_epochs, cfg.unroll_length) == (envs, minibatches, epochs,
                                                                                          unroll)
    assert cfg.batch_size == batch * minibatches * unroll and cfg.total_updates == updates
    assert (cfg.normalize_obs, cfg.action_dist, cfg.clip_value) == (True, "tanh_normal", False)
    stand_in = config_lib.validate(dataclasses.replace(cfg, env="Pendulum-v1"))
    for devices in (1, 8):
        assert ppo.check(resolved(stand_in), devices).minibatch.total == batch * unroll
    assert factory.hidden_layers(stand_in) == ((32,) * 4, (256,) * 5)


def test_the_tiny_preset_has_brax_settings_at_a_cpu_batch():
    cfg = config_lib.build(config_lib.load_preset("brax-inverted-pendulum"))
    assert (cfg.env, cfg.batch_size, cfg.total_updates, cfg.reward_scale, cfg.gamma, cfg.unroll_length) == (
        "brax:inverted_pendulum", 256 * 40, 60, 10.0, 0.97, 5)
    stand_in = config_lib.validate(dataclasses.replace(cfg, env="Pendulum-v1"))
    assert ppo.check(resolved(stand_in), 8).minibatch.total == 1280


def test_the_craftax_preset_is_the_craftax_baseline():
    cfg = config_lib.build(config_lib.load_preset("craftax-classic"))
    assert cfg.env == "craftax:Craftax-Classic-Symbolic-v1" and cfg.total_updates == 1_000_000_000 // (1024 * 64)
    stand_in = config_lib.validate(dataclasses.replace(cfg, env="CartPole-v1"))
    assert ppo.check(resolved(stand_in), 8).minibatch.total == 1024 * 64 // 8
    assert factory.hidden_layers(stand_in) == ((512,) * 3, (512,) * 3)
