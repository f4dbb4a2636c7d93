"""SAC and TD3 (algos/sac.py) on 8 virtual CPU devices: the n-step targets with continuous
actions, the critics' loss by hand, 1 device == 8, resume == uninterrupted with the replay partly
full, the tiny preset learning, and bad input."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_resume_is_exact, assert_trees_close, make_trainer, run
from jaxrl_mgpu import config as config_lib, evaluate
from jaxrl_mgpu.algos.sac import sac
from jaxrl_mgpu.algos.replay import Replay, Transitions, replay_sample

SMALL = dict(algo="sac", env="Pendulum-v1", num_envs=16, num_steps=4, buffer_size=16 * 32, replay_batch_size=64,
             learning_starts=128, updates_per_step=0.5, tau=0.05, hidden_size=16, activation="relu",
             total_timesteps=16 * 4 * 8, policy_delay=2)


def test_n_step_targets_of_continuous_actions_stop_at_terminations_and_bootstrap_through_time_limits():
    """A constant reward of 1: the target of a window is the discounted count of the steps it
    uses, bootstrapping with gamma^(k+1) unless its last step terminated."""
    rows, gamma, n = 8, 0.5, 3
    terminated, truncated = np.zeros((1, rows), bool), np.zeros((1, rows), bool)
    terminated[0, 2], truncated[0, 5] = True, True
    replay = Replay(obs=np.arange(rows, dtype=np.float32)[None, :, None],
                    action=np.linspace(-1, 1, 2 * rows, dtype=np.float32).reshape(1, rows, 2),
                    reward=np.ones((1, rows), np.float32), terminated=terminated, truncated=truncated,
                    next_obs=100 + np.arange(rows, dtype=np.float32)[None, :, None])
    batch = jax.jit(lambda replay, key: replay_sample(replay, jnp.int32(rows), key, 256, n, gamma))(
        jax.tree.map(jnp.asarray, replay), jax.random.PRNGKey(0))
    for obs, action, reward, discount, next_obs in zip(*map(np.asarray, batch)):
        t = int(obs[0])
        last = min(t + n - 1, *[i for i in range(t, rows) if terminated[0, i] or truncated[0, i]])
        k = last - t
        np.testing.assert_allclose(reward, sum(gamma ** i for i in range(k + 1)))
        np.testing.assert_allclose(discount, 0.0 if terminated[0, last] else gamma ** (k + 1))
        assert next_obs[0] == 100 + last and np.array_equal(action, replay.action[0, t])


class FixedCritics:
    """Critics whose values are their params: what the loss does with them, by hand."""
    def apply(self, params, obs, action):
        return params


def test_the_plain_critics_loss_by_hand():
    cfg = config_lib.build(dict(algo="sac", critic="plain", clipped_double_q=True))
    batch = Transitions(obs=None, action=None, reward=jnp.array([1.0, 2.0]), discount=jnp.array([0.5, 0.0]),
                        next_obs=None)
    now = jnp.array([[[1.0], [1.0]], [[3.0], [2.0]]])          # [2 critics, B, 1]
    target = jnp.array([[[4.0], [7.0]], [[2.0], [9.0]]])       # min over critics: 2, 7
    loss, stats = sac.critic_loss(cfg, FixedCritics(), None, now, target, batch, None, jnp.array([-1.0, 0.0]))
    y = np.array([1 + 0.5 * (2 - 1), 2.0])                    # r + discount (min Q' + bonus)
    expect = 0.5 * (np.mean((np.array([1, 1]) - y) ** 2) + np.mean((np.array([3, 2]) - y) ** 2))
    np.testing.assert_allclose(loss, expect, rtol=1e-6)
    np.testing.assert_allclose(stats["loss/target_mean"], y.mean(), rtol=1e-6)
    mean_cfg = dataclasses.replace(cfg, clipped_double_q=False)   # the mean of the two: 3, 8
    loss, _ = sac.critic_loss(mean_cfg, FixedCritics(), None, now, target, batch, None, 0.0)
    y = np.array([1 + 0.5 * 3, 2.0])
    np.testing.assert_allclose(loss, 0.5 * (np.mean((1 - y) ** 2) + np.mean((np.array([3, 2]) - y) ** 2)), rtol=1e-6)


def test_the_categorical_projection_and_loss_by_hand():
    atoms = jnp.array([0.0, 1.0, 2.0])
    # all mass on 1, shifted by 0.5 x 1 + 0.25: 0.75 -> 1/4 on 0 and 3/4 on 1; mass on 2 -> 1.25
    probs = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    out = sac.project(probs, jnp.array([0.25, 0.25]), jnp.array([0.5, 0.5]), atoms)
    np.testing.assert_allclose(out, [[0.25, 0.75, 0.0], [0.0, 0.75, 0.25]], atol=1e-6)
    # exactly on an atom, and clipped at the top
    out = sac.project(probs, jnp.array([1.0, 5.0]), jnp.array([1.0, 1.0]), atoms)
    np.testing.assert_allclose(out, [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], atol=1e-6)
    cfg = config_lib.build(dict(algo="sac", critic="categorical", clipped_double_q=True))
    logits = jnp.log(jnp.array([[[0.5, 0.5, 1e-9]], [[1e-9, 0.5, 0.5]]]))  # critic 0's mean 0.5, critic 1's 1.5
    batch = Transitions(None, None, jnp.array([0.0]), jnp.array([1.0]), None)
    now = jnp.log(jnp.array([[[0.2, 0.3, 0.5]], [[0.6, 0.3, 0.1]]]))
    loss, stats = sac.critic_loss(cfg, FixedCritics(), atoms, now, logits, batch, None, 0.0)
    target = np.array([0.5, 0.5, 0.0])                          # critic 0's distribution: the smaller mean
    expect = -(target * np.log([0.2, 0.3, 0.5])).sum() - (target * np.log([0.6, 0.3, 0.1])).sum()
    np.testing.assert_allclose(loss, expect, rtol=1e-5)
    assert stats["loss/target_outside_support"] == 0.0         # 0 + 0.5 is inside [0, 2]
    for reward in (1.6, -0.6):                                  # 2.1 and -0.1: past either end, clipped
        _, stats = sac.critic_loss(cfg, FixedCritics(), atoms, now, logits, batch._replace(reward=jnp.array([reward])),
                                   None, 0.0)
        assert stats["loss/target_outside_support"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("algo, critic", [("sac", "plain"), ("td3", "categorical")])
def test_one_training_step_on_8_devices_equals_1_device_with_the_same_global_batch(algo, critic):
    """The same global batch and random numbers (by global sample index): 8 devices, each on its
    share, take the same critic and actor steps as 1 device with all of it."""
    cfg = dict(SMALL, algo=algo, critic=critic, v_min=-10.0, v_max=10.0, num_atoms=11)
    one, eight = make_trainer(1, **cfg), make_trainer(8, grad_accum=2, **cfg)
    rng = np.random.default_rng(0)
    delay, batch = 2, 64
    t = Transitions(obs=rng.normal(size=(delay, batch, 3)).astype(np.float32),
                    action=rng.uniform(-1, 1, (delay, batch, 1)).astype(np.float32),
                    reward=rng.normal(size=(delay, batch)).astype(np.float32),
                    discount=rng.choice([0.0, 0.99], (delay, batch)).astype(np.float32),
                    next_obs=rng.normal(size=(delay, batch, 3)).astype(np.float32))
    batches = sac.Batch(t, rng.normal(size=(delay, batch, 1)).astype(np.float32),
                        rng.normal(size=(delay, batch, 1)).astype(np.float32))

    def step(trainer):
        d = trainer.par.num_devices
        local = lambda x: np.moveaxis(x.reshape((delay, d, -1) + x.shape[2:]), 1, 0)  # noqa: E731  [d, delay, share]
        train_step = trainer.algorithm.parts.train_step
        fn = trainer.par.map(lambda state, b: train_step(state._replace(replay=(), envs=()), b))
        state, stats = fn(trainer.init_state(), trainer.par.shard(jax.tree.map(local, batches)))
        return trainer.par.first((state.params, state.critic, state.target_critic, state.log_alpha)), \
            trainer.par.first(stats)

    (state1, stats1), (state8, stats8) = step(one), step(eight)
    assert_trees_close(state1, state8, rtol=1e-5, atol=1e-6)
    assert_trees_close(stats1, stats8, rtol=1e-5, atol=1e-6)
    start = one.par.first(one.init_state().params)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), state1[0], start)
    assert max(jax.tree.leaves(moved)) > 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_stop_and_resume_equals_an_uninterrupted_run_with_the_replay_partly_full(tmp_path, algo):
    tiny = ["--algo", algo, "--env", "Pendulum-v1", "--num-envs", "16", "--num-steps", "4", "--updates-per-step",
            "0.5", "--replay-batch-size", "64", "--buffer-size", "1024", "--learning-starts", "128",
            "--hidden-size", "16", "--tau", "0.05", "--normalize-obs", "--total-timesteps", "512", "--log-every", "2",
            "--checkpoint-every", "2"]  # 512 of the replay's 1,024 transitions written by the end
    straight, _ = assert_resume_is_exact(tmp_path, tiny, stop_at=4, end=8)
    assert json.loads((straight / "metrics.jsonl").read_text().splitlines()[-1])["loss/critic"] > 0


@pytest.mark.slow
def test_the_tiny_preset_learns_pendulum(tmp_path):
    run_dir = tmp_path / "run"
    assert run("--config", "pendulum-sac", "--total-timesteps", "12800", "--checkpoint-every", "0",
               "--run-dir", str(run_dir)) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, late = rows[0]["episode_return"], np.mean([r["episode_return"] for r in rows[-3:]])
    # random actions score about -1,200; a swing-up policy above -400 (a broken learner stays below -900)
    assert first < -900 and late > -400, (first, late)
    assert evaluate.main(["--run-dir", str(run_dir), "--episodes", "16", "--greedy"]) == 0


@pytest.mark.parametrize("argv, words", [
    (["--algo", "sac", "--env", "CartPole-v1"], "--algo sac takes continuous (Box) actions; --env CartPole-v1 has "
                                               "discrete actions: use --algo dqn"),
    (["--algo", "td3", "--buffer-size", str(2 ** 40), "--num-envs", "16"], "--buffer-size 1099511627776: the replay "
                                                                           "takes"),
    (["--algo", "sac", "--buffer-size", "1024", "--replay-batch-size", "2048"], "--replay-batch-size 2048 is larger "
                                                                                "than the replay"),
    (["--algo", "sac", "--updates-per-step", "0"], "--updates-per-step"),
    (["--algo", "sac", "--critic", "categorical", "--v-min", "5", "--v-max", "5"], "--v-min 5 must be below "
                                                                                   "--v-max 5"),
    (["--algo", "ppo", "--policy-delay", "3"], "--policy-delay is only for --algo sac or td3"),
    (["--algo", "sac", "--clip-eps", "0.1"], "--clip-eps is only for --algo ppo"),
    (["--config", "pendulum-sac", "--policy", "transformer"], "--hidden-size (set by --config pendulum-sac) is only "
                                                              "for an MLP"),
    (["--algo", "td3", "--init-alpha", "0.1"], "--init-alpha is only for --algo sac"),
    (["--algo", "sac", "--mode", "learn", "--buffer-size", "128", "--replay-batch-size", "64"],
     "--buffer-size 128 must hold at least 256 transitions per device"),
    (["--algo", "sac", "--num-steps", "3", "--updates-per-step", "1", "--policy-delay", "2"],
     "--policy-delay 2 does not divide the 3"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, words):
    run_dir = tmp_path / "run"
    assert run("--env", "Pendulum-v1", *argv, "--run-dir", str(run_dir)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not run_dir.exists()


@pytest.mark.slow
def test_shard_map_equals_pmap_and_many_seeds_train_in_one_program(tmp_path):
    tiny = ["--algo", "td3", "--env", "Pendulum-v1", "--num-envs", "16", "--num-steps", "4", "--updates-per-step",
            "0.5", "--replay-batch-size", "64", "--buffer-size", "1024", "--learning-starts", "128",
            "--hidden-size", "16", "--tau", "0.05", "--total-timesteps", "384", "--log-every", "2"]
    for backend in ("pmap", "shard_map"):
        assert run(*tiny, "--parallel", backend, "--run-dir", str(tmp_path / backend)) == 0
    (_, a), (_, b) = evaluate.load_params(str(tmp_path / "pmap")), evaluate.load_params(str(tmp_path / "shard_map"))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert run(*tiny, "--num-seeds", "2", "--sweep", "lr=1e-3,3e-4", "--run-dir", str(tmp_path / "runs")) == 0
    summary = json.loads((tmp_path / "runs" / "runs_summary.json").read_text())
    assert [c["lr"] for c in summary] == [1e-3, 3e-4] and [c["runs"] for c in summary] == [[0, 1], [2, 3]], summary


@pytest.mark.slow
def test_a_sweep_of_the_categorical_support_and_td3_s_noise_applies_each_value_per_run():
    """--sweep v_max=5,50 target_noise=0.1,0.3 (numbers the update reads only as numbers, so one
    program serves every value): run i learns as the single run with configuration i's values,
    and the runs' critics differ."""
    cfg = dict(SMALL, algo="td3", critic="categorical", v_min=-50.0, num_atoms=11, total_timesteps=16 * 4 * 4)
    multi = make_trainer(2, "shard_map", sweep="v_max=5,50 target_noise=0.1,0.3", **cfg)
    assert multi.runs.count == 4
    state = multi.init_state()
    state, _ = multi.chunk_fn(4, state)(state)
    critics = multi.par.runs_of(state.critic)
    for i in (1, 2):
        single = make_trainer(1, **cfg, **multi.runs.hparams(i))
        state1 = single.init_state()
        state1, _ = single.chunk_fn(4, state1)(state1)
        assert_trees_close(single.par.first(state1.critic), jax.tree.map(lambda x: x[i], critics), rtol=1e-5,
                           atol=1e-6)
    assert not np.allclose(jax.tree.leaves(critics)[0][0], jax.tree.leaves(critics)[0][2])  # v_max 5 and 50


@pytest.mark.slow
def test_auto_scale_sizes_a_sac_run_whose_policy_evaluate_draws(tmp_path, capsys):
    """--auto-scale memory picks SAC's environments (the largest that leaves 100 updates: 25,600
    steps / (100 x 8 steps x 8 devices) = 4 per device) and says that the gradient steps per
    env step fall with them; `evaluate --video` draws the trained actor's first evaluation
    episode of Pendulum (200 steps, 201 frames, the same return as `evaluate`)."""
    import imageio.v3 as iio
    run_dir = tmp_path / "run"
    assert run("--config", "pendulum-sac", "--auto-scale", "memory", "--total-timesteps", "25600",
               "--run-dir", str(run_dir), "--stop-at-update", "2") == 0
    out = capsys.readouterr().out
    assert "chose 4 per device" in out and "gradient steps per env step fall as environments grow" in out, out
    assert json.loads((run_dir / "config.json").read_text())["num_envs"] == 32
    video = tmp_path / "pendulum.gif"
    assert evaluate.main(["--run-dir", str(run_dir), "--video", str(video), "--greedy"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    frames = iio.imread(video, index=None)
    assert line["episode_length"] == 200 and frames.shape[0] == 201 == line["frames"] and frames.std() > 0
    assert evaluate.main(["--run-dir", str(run_dir), "--episodes", "1", "--devices", "1", "--greedy"]) == 0
    evaluated = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["return"] == pytest.approx(evaluated["mean_return"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_with_none_of_its_options_given_each_learns_pendulum(tmp_path, algo):
    """The algorithms' own defaults (algos/sac/options.py): with only --env and a length given,
    SAC and TD3 learn Pendulum. With DQN's and PPO's settings, SAC ended at -1,346 after 100k
    steps; random actions score about -1,200. (On one device: the 8 virtual ones of the tests
    would each step one environment, and cost minutes of 2 CPU cores for nothing.)"""
    run_dir = tmp_path / algo
    assert run("--algo", algo, "--env", "Pendulum-v1", "--total-timesteps", "19200", "--checkpoint-every", "0",
               "--devices", "1", "--run-dir", str(run_dir)) == 0
    returns = [json.loads(line)["episode_return"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    returns = [r for r in returns if r is not None]
    assert returns[0] < -900 and returns[-1] > -400, returns
