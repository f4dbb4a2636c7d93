"""DQN on 8 virtual CPU devices: the data-parallel contract, n-step replay targets, learning,
and bad input."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_resume_is_exact, assert_trees_close, make_trainer, resolved
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import train
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.replay import Replay, replay_gather, replay_sample, replay_window
from jaxrl_mgpu.cli import ConfigError

SMALL = dict(algo="dqn", num_envs=16, num_steps=4, buffer_size=16 * 32, replay_batch_size=64, learning_starts=128,
             updates_per_step=0.5, target_update_every=3, hidden_size=32, activation="relu",
             total_timesteps=16 * 4 * 8, eps_decay_steps=256)


def run_updates(trainer, n: int):
    state = trainer.init_state()
    return trainer.chunk_fn(n, state)(state)


def random_replay(rng, envs: int, rows: int, obs_dim: int) -> Replay:
    return Replay(obs=rng.normal(size=(envs, rows, obs_dim)).astype(np.float32),
                  action=rng.integers(0, 2, (envs, rows)).astype(np.int32),
                  reward=rng.normal(size=(envs, rows)).astype(np.float32),
                  terminated=rng.random((envs, rows)) < 0.1,
                  truncated=rng.random((envs, rows)) < 0.1,
                  next_obs=rng.normal(size=(envs, rows, obs_dim)).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_one_gradient_step_on_8_devices_equals_1_device_with_the_same_global_batch(grad_accum):
    """The same global replay contents and the same global sample (env, row) indices: 8 devices,
    each gathering its share from its own environments' buffers (in `grad_accum` micro-batches),
    take the same gradient steps as 1 device with the whole batch."""
    cfg = dict(SMALL, n_step=3)
    one, eight = make_trainer(1, **cfg), make_trainer(8, grad_accum=grad_accum, **cfg)
    rng = np.random.default_rng(0)
    envs, rows, batch, n_step = 16, 32, 64, 3
    replay = random_replay(rng, envs, rows, 4)
    # Device d owns environments [2d, 2d + 2); its share of the batch is samples [8d, 8d + 8).
    env = np.concatenate([rng.integers(2 * d, 2 * d + 2, batch // 8) for d in range(8)]).astype(np.int32)
    row = rng.integers(0, rows, batch).astype(np.int32)

    def steps(trainer):
        d, algo = trainer.par.num_devices, trainer.algorithm.parts
        local = lambda x: x.reshape((d, -1) + x.shape[1:])  # global leading axis -> [devices, share]
        env_local = env.reshape(d, -1) - (envs // d) * np.arange(d)[:, None]

        def two_steps(state, replay, env, row):
            sample = replay_gather(replay, env, row, n_step, 0.99)
            params, target, opt_state, scale = state.params, state.target_params, state.opt_state, state.loss_scale
            for _ in range(2):  # the second step sees target != online params
                params, opt_state, scale, stats = algo.learn(params, target, opt_state, scale, sample)
            return params, stats

        fn = trainer.par.map(two_steps)
        args = trainer.par.shard((jax.tree.map(local, replay), env_local, local(row)))
        return trainer.par.first(fn(trainer.init_state(), *args))

    (params1, stats1), (params8, stats8) = steps(one), steps(eight)
    assert_trees_close(params1, params8, rtol=1e-5)
    assert_trees_close(stats1, stats8, rtol=1e-5)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), params1, one.par.first(one.init_state().params))
    assert max(jax.tree.leaves(moved)) > 1e-4


@pytest.mark.slow
def test_params_start_and_stay_identical_on_all_devices():
    trainer = make_trainer(8, **SMALL)
    state, _ = run_updates(trainer, 4)
    assert int(trainer.par.first(state.grad_steps)) == 3 * 2  # updates 1..3 learn, 2 steps each
    for tree in (state.params, state.target_params):
        for leaf in jax.tree.leaves(trainer.par.local(tree)):
            for d in range(1, 8):
                np.testing.assert_array_equal(leaf[0], leaf[d])
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), trainer.par.first(state.params),
                         trainer.par.first(trainer.init_state().params))
    assert max(jax.tree.leaves(moved)) > 1e-4


@pytest.mark.slow
def test_acting_and_replay_do_not_depend_on_the_device_count():
    """Before learning starts, the replay buffers of 8 devices, stacked, are 1 device's buffer."""
    cfg = dict(SMALL, learning_starts=10_000, total_timesteps=20_000)
    one, eight = make_trainer(1, **cfg), make_trainer(8, **cfg)
    replay1 = one.par.local(run_updates(one, 6)[0].replay)
    replay8 = eight.par.local(run_updates(eight, 6)[0].replay)
    stack = lambda x: x.reshape((1, -1) + x.shape[2:])  # [devices, envs, ...] -> [1, all envs, ...]
    for a, b in zip(replay1, jax.tree.map(stack, replay8)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert replay1.terminated[0, :, :24].any(), "the rollout should cross episode boundaries"


@pytest.mark.slow
def test_n_step_targets_stop_at_terminations_and_bootstrap_through_time_limits():
    rows = 8
    reward = np.arange(1, rows + 1, dtype=np.float32)[None]
    terminated = np.zeros((1, rows), bool)
    truncated = np.zeros((1, rows), bool)
    terminated[0, 2], truncated[0, 5] = True, True
    obs = np.arange(rows, dtype=np.float32)[None, :, None]
    replay = Replay(obs, np.zeros((1, rows), np.int32), reward, terminated, truncated, obs + 100)
    g = 0.5
    r = reward[0]
    expected = {  # start row: (discounted reward sum, bootstrap discount, row of the bootstrap observation)
        0: (r[0] + g * r[1] + g * g * r[2], 0.0, None),     # terminated at row 2: no bootstrap
        1: (r[1] + g * r[2], 0.0, None),
        2: (r[2], 0.0, None),
        3: (r[3] + g * r[4] + g * g * r[5], g ** 3, 5),      # truncated at row 5: bootstrap from its final obs
        4: (r[4] + g * r[5], g ** 2, 5),
        5: (r[5], g, 5),
        6: (r[6] + g * r[7] + g * g * r[0], g ** 3, 0),      # wraps around the ring
    }
    starts = np.array(list(expected), np.int32)
    batch = replay_gather(jax.tree.map(jnp.asarray, replay), jnp.zeros(len(starts), jnp.int32),
                          jnp.asarray(starts), 3, g)
    for i, start in enumerate(starts):
        ret, discount, boot = expected[start]
        assert float(batch.obs[i, 0]) == start
        np.testing.assert_allclose(float(batch.reward[i]), ret, rtol=1e-6)
        np.testing.assert_allclose(float(batch.discount[i]), discount, rtol=1e-6)
        if boot is not None:
            assert float(batch.next_obs[i, 0]) == boot + 100


@pytest.mark.slow
@pytest.mark.parametrize("written", [5, 8, 13])
def test_replay_samples_only_stored_transitions_with_a_complete_window(written):
    rows, n_step = 8, 3
    obs = np.broadcast_to(np.arange(rows, dtype=np.float32)[None, :, None], (2, rows, 1))
    replay = jax.tree.map(jnp.asarray, Replay(obs, np.zeros((2, rows), np.int32), np.zeros((2, rows), np.float32),
                                              np.zeros((2, rows), bool), np.zeros((2, rows), bool), obs))
    batch = replay_sample(replay, jnp.int32(written), jax.random.PRNGKey(0), 2048, n_step, 0.9)
    filled = min(written, rows)
    oldest = written - filled
    valid = {(oldest + age) % rows for age in range(filled - n_step + 1)}
    assert set(np.asarray(batch.obs[:, 0]).astype(int).tolist()) == valid


@pytest.mark.slow
def test_a_short_run_on_8_devices_learns_cartpole():
    # The cartpole-dqn preset, shortened: 64k env steps (~20 s here).
    cfg = dict(algo="dqn", num_envs=64, num_steps=1, updates_per_step=8, replay_batch_size=256, buffer_size=64_000,
               learning_starts=5_000, eps_decay_steps=20_000, eps_end=0.05, lr=1e-3, target_update_every=100,
               n_step=5, max_grad_norm=10.0, hidden_size=128, activation="relu", total_timesteps=64_000,
               log_every=125, checkpoint_every=0)
    trainer = make_trainer(8, **cfg)
    state = trainer.init_state()
    fn = trainer.chunk_fn(cfg["log_every"], state)
    returns = []
    for _ in range(trainer.cfg.total_updates // cfg["log_every"]):
        state, chunk = fn(state)
        episodes = trainer.par.first(chunk.episodes)
        returns.append(float(episodes.return_sum) / max(float(episodes.count), 1.0))
    # A random policy averages about 22 on CartPole.
    assert returns[0] < 40, returns
    assert max(returns[-2:]) > 150, returns


@pytest.mark.slow
def test_stop_and_resume_equals_an_uninterrupted_run_and_the_replay_moves_between_device_counts(tmp_path, capsys):
    """The replay buffer is part of the checkpointed state: a resumed run is bitwise the run that
    never stopped, and the buffer (laid out per environment) restores on another device count."""
    tiny = ["--algo", "dqn", "--num-envs", "16", "--num-steps", "4", "--updates-per-step", "0.5",
            "--replay-batch-size", "64", "--buffer-size", "512", "--learning-starts", "128", "--hidden-size", "16",
            "--target-update-every", "3", "--eps-decay-steps", "256", "--total-timesteps", "512",
            "--log-every", "2", "--checkpoint-every", "2"]
    straight, _ = assert_resume_is_exact(tmp_path, tiny, stop_at=4, end=8, rows_equal=False,
                                         straight_flags=["--eval-every", "4", "--eval-episodes", "4"])
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert "eval/episode_return" in rows[-1] and "loss/td" in rows[-1], rows[-1]
    capsys.readouterr()
    # continued on 2 devices: nothing is re-created (same global envs, so the same replay)
    assert train.main([*tiny, "--run-dir", str(straight), "--resume", "--devices", "2",
                       "--total-timesteps", "768"]) == 0
    assert "re-created" not in capsys.readouterr().out


def bad(**overrides):
    """The error of the config's checks (ranges: config.validate) or of DQN's (the split over 8 devices)."""
    cfg = config_lib.build({**SMALL, **overrides})
    with pytest.raises(ConfigError) as info:
        dqn.check(resolved(config_lib.validate(cfg)), 8)
    return str(info.value)


@pytest.mark.parametrize("overrides, names", [
    (dict(buffer_size=16 * 32 + 4), ["--buffer-size", "8 devices"]),
    (dict(buffer_size=16 * 33 + 8), ["--buffer-size", "--num-envs"]),
    (dict(replay_batch_size=60), ["--replay-batch-size", "8 devices"]),
    (dict(grad_accum=3), ["--grad-accum", "--replay-batch-size"]),
    (dict(num_envs=12), ["--num-envs", "8 devices"]),
    (dict(policy="transformer"), ["--context-len", "--buffer-size"]),  # the windows must fit the replay
    (dict(updates_per_step=0.3), ["--updates-per-step", "--num-steps"]),
    (dict(tau=0.0), ["--tau"]),
    (dict(n_step=64), ["--n-step", "--buffer-size"]),
    (dict(learning_starts=10**9), ["--learning-starts", "--total-timesteps"]),
    (dict(replay_obs_dtype="uint8"), ["--replay-obs-dtype", "CartPole-v1", "float32"]),  # not whole numbers
])
def test_bad_numbers_give_a_config_error_naming_the_option(overrides, names):
    message = bad(**overrides)
    for name in names:
        assert name in message, (name, message)
    assert "\n" not in message


def test_bad_input_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--algo", "dqn", "--replay-batch-size", "100", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "--replay-batch-size" in err[0], err
    assert not run_dir.exists()


@pytest.mark.slow
def test_presets_validate():
    for name in ("cartpole-dqn", "breakout-minatar-dqn", "spaceinvaders-minatar-dqn"):
        cfg = config_lib.from_args(["--config", name])
        assert cfg.algo == "dqn"
        layout = dqn.check(resolved(cfg), 1)
        assert layout.minibatch == (cfg.replay_batch_size, cfg.replay_batch_size)


@pytest.mark.slow
def test_byte_replay_trains_exactly_as_float32_on_minatar():
    """--replay-obs-dtype uint8: a quarter of the replay's memory, and MinAtar's 0/1 observations
    come back unchanged, so the same updates give the same parameters, bit for bit."""
    cfg = dict(SMALL, env="Breakout-MinAtar", hidden_size=16)
    states = {dtype: run_updates(make_trainer(2, **cfg, replay_obs_dtype=dtype), 4)[0]
              for dtype in ("float32", "uint8")}
    as_float, as_bytes = states["float32"].replay, states["uint8"].replay
    assert as_bytes.obs.dtype == as_bytes.next_obs.dtype == np.uint8
    assert as_bytes.obs.nbytes * 4 == as_float.obs.nbytes
    assert np.asarray(as_float.obs).any()  # frames were written
    np.testing.assert_array_equal(np.asarray(as_bytes.obs, np.float32), as_float.obs)
    np.testing.assert_array_equal(np.asarray(as_bytes.next_obs, np.float32), as_float.next_obs)
    assert int(states["uint8"].grad_steps[0]) > 0
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 states["float32"].params, states["uint8"].params)


def test_a_saved_config_without_a_newer_option_reads_as_its_default():
    """Runs saved before --replay-obs-dtype existed resume (the option had its default then)."""
    cfg = config_lib.build(SMALL)
    saved = {k: v for k, v in cfg.to_dict().items() if k != "replay_obs_dtype"}
    assert config_lib.incompatible(saved, cfg) == []
    assert config_lib.incompatible(saved, dataclasses.replace(cfg, replay_obs_dtype="uint8")) == [
        "replay-obs-dtype ('float32' vs 'uint8')"]



# -- --policy transformer: Q-values from the recent history --------------------------------

@pytest.mark.slow
def test_replay_windows_follow_the_ring_and_episode_starts():
    rows, written = 8, 10  # the ring holds absolute steps 2..9
    steps = np.arange(written)
    obs = np.zeros((1, rows, 1), np.float32)
    action = np.zeros((1, rows), np.int32)
    reward = np.zeros((1, rows), np.float32)
    done = np.zeros((1, rows), bool)
    for t in steps[-rows:]:
        obs[0, t % rows, 0], action[0, t % rows], reward[0, t % rows] = t, t % 3, 10.0 * t
    done[0, 4 % rows] = True  # the episode ends at step 4: step 5 starts one
    replay = jax.tree.map(jnp.asarray, Replay(obs, action, reward, done, np.zeros_like(done), obs + 100))
    w = replay_window(replay, jnp.int32(written), jnp.zeros(1, jnp.int32), jnp.array([6]), 6)
    np.testing.assert_array_equal(w.valid[0], [False, True, True, True, True, True])        # steps 1..6
    np.testing.assert_array_equal(w.obs[0, 1:, 0], [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(w.is_first[0, 1:], [True, False, False, True, False])    # 2: oldest held; 5: new episode
    np.testing.assert_array_equal(w.prev_reward[0, 2:], [20, 30, 40, 50])
    np.testing.assert_array_equal(w.prev_action[0, 2:], [2 % 3, 3 % 3, 4 % 3, 5 % 3])


TRANSFORMER = dict(SMALL, policy="transformer", d_model=16, n_layers=1, n_heads=2, context_len=4, buffer_size=16 * 16)


@pytest.mark.slow
def test_transformer_q_network_keeps_devices_in_sync_and_learns_something():
    trainer = make_trainer(8, **TRANSFORMER)
    state, chunk = run_updates(trainer, 8)
    for leaf in jax.tree.leaves(trainer.par.local(state.params)):
        np.testing.assert_array_equal(leaf[0], leaf[-1])
    losses = trainer.par.first(chunk.losses)
    assert np.isfinite(losses["loss/td"]) and losses["loss/td"] > 0  # gradient steps ran
    assert jax.tree.leaves(state.memory.cache)[0].shape[:2] == (8, 2)  # a cache per device and env


@pytest.mark.slow
def test_transformer_dqn_resumes_exactly(tmp_path):
    flags = ["--algo", "dqn", "--policy", "transformer", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
             "--context-len", "4", "--num-envs", "16", "--num-steps", "4", "--buffer-size", "256",
             "--replay-batch-size", "32", "--learning-starts", "64", "--updates-per-step", "0.5",
             "--total-timesteps", str(16 * 4 * 8), "--log-every", "2", "--checkpoint-every", "2", "--devices", "2"]
    straight, resumed = tmp_path / "a", tmp_path / "b"
    assert train.main([*flags, "--run-dir", str(straight)]) == 0
    assert train.main([*flags, "--run-dir", str(resumed), "--stop-at-update", "4"]) == 0
    assert train.main([*flags, "--run-dir", str(resumed), "--resume"]) == 0
    rows = lambda d: [{k: v for k, v in json.loads(line).items() if k not in ("sps", "time")}  # noqa: E731
                      for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows(straight) == rows(resumed)
