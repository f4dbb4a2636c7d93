"""The atari suite (envs/atari.py): ale-py's vector environment stepped from inside the compiled
step. Its frames against gymnasium's own preprocessing, the logged score against the clipped
reward, the same games on any device count, what a resume keeps, collectors feeding a learner,
videos, and bad input."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mgpu import autoscale, envs, parallel
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu.autoscale import host
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.log import RunLog

from helpers import make_trainer, one_error_line, rows, run, spawn_train, wait_until, without_timing

pytest.importorskip("ale_py")
gym = pytest.importorskip("gymnasium")


def gymnasium_breakout():
    """Gymnasium's reference: ALE's Breakout at every frame, AtariPreprocessing (frame skip 4,
    max-pooled, 84 x 84 grey) and a 4-frame stack padded with zeros, as ale-py's vector one."""
    import ale_py
    gym.register_envs(ale_py)
    env = gym.make("ALE/Breakout-v5", frameskip=1, repeat_action_probability=0.0)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=84, grayscale_obs=True)
    return gym.wrappers.FrameStackObservation(env, 4, padding_type="zero")


@pytest.mark.slow
def test_its_frames_rewards_and_ends_are_gymnasium_s_preprocessing_frame_for_frame():
    """A fixed sequence of actions through a whole game and into the next: every stacked frame,
    score and termination equal gymnasium's; the step after game over is the next game's first
    frame (ale-py resets a batch's ended game in the next step, whatever the action)."""
    env, params = envs.make("atari:Breakout", "noop_max=0,fire_reset=false,clip_rewards=false,episodic_life=false")
    assert env.observation_space(params).shape == (4, 84, 84) and env.action_space(params).n == 4
    key, ids = jax.random.PRNGKey(3), jnp.arange(1)
    batch = vec.reset(env, params, key, ids)
    seed = int(jax.device_get(batch.state.token[0]))  # not the game's seed: that one is per environment
    assert seed >= 0 and batch.obs.dtype == jnp.uint8
    reference = gymnasium_breakout()
    game_seed = int(jax.random.randint(vec.env_keys(key, ids)[0], (), 0, 2**31 - 1, jnp.int32))
    frames, _ = reference.reset(seed=game_seed)
    np.testing.assert_array_equal(np.asarray(batch.obs[0]), frames)
    actions = np.random.default_rng(0).integers(0, 4, 400)
    ended_at = None
    for t, a in enumerate(actions):
        batch, out = vec.step(env, params, batch, jnp.asarray([a], jnp.int32), vec.env_keys(jax.random.PRNGKey(t), ids))
        if ended_at is not None:  # the step after game over: the next game's first frames
            frames, _ = reference.reset(seed=game_seed)
            np.testing.assert_array_equal(np.asarray(batch.obs[0]), frames)
            assert float(out.reward[0]) == 0.0 and not bool(out.terminated[0])
            break
        frames, reward, terminated, truncated, _ = reference.step(int(a))
        np.testing.assert_array_equal(np.asarray(batch.obs[0]), frames, err_msg=f"step {t}")
        assert float(out.reward[0]) == reward and bool(out.terminated[0]) == terminated, t
        if terminated:
            ended_at = t
            assert float(out.done_return[0]) > 0 and int(out.done_length[0]) == t + 1
    assert ended_at is not None, "the game did not end in 400 steps of random play"


@pytest.mark.slow
def test_learning_sees_clipped_rewards_and_lives_while_the_log_counts_the_game_s_score():
    """Space Invaders' aliens score 5 to 30: learning sees each as 1, and each of the 3 lives lost
    as the end of its episode; the logged episode is the whole game, its return the game's score."""
    env, params = envs.make("atari:SpaceInvaders", "noop_max=0")
    ids = jnp.arange(1)
    batch = vec.reset(env, params, jax.random.PRNGKey(0), ids)
    actions = np.random.default_rng(1).integers(0, env.num_actions, 5000)
    clipped, ends = 0.0, 0
    for t, a in enumerate(actions):
        batch, out = vec.step(env, params, batch, jnp.asarray([a], jnp.int32), vec.env_keys(jax.random.PRNGKey(t), ids))
        assert float(out.reward[0]) in (0.0, 1.0)
        clipped += float(out.reward[0])
        ends += int(out.terminated[0])
        if int(out.done_length[0]):
            break
    assert ends == 3 and clipped >= 1  # 2 lives lost, then game over
    assert float(out.done_return[0]) >= 5 * clipped  # every alien scored 5 or more


def atari_run(tmp_path, name, *extra):
    run_dir = tmp_path / name
    # games cut at 160 frames (40 steps), so that episodes end in the run and evaluation is short
    assert run(*["--env", "atari:Breakout", "--env-args", "max_frames=160", "--num-envs", "8", "--num-steps", "16",
                 "--total-timesteps", "512", "--hidden-size", "32", "--num-layers", "1", "--num-minibatches", "2",
                 "--update-epochs", "1", "--log-every", "1", "--checkpoint-every", "2", "--eval-every", "4",
                 "--eval-episodes", "4", "--run-dir", str(run_dir), *extra]) == 0
    return run_dir


@pytest.mark.slow
def test_one_and_eight_devices_play_the_same_games_and_take_the_same_update():
    """8 games on 1 device (one host batch of 8) and on 8 (8 batches of 1): the same frames after
    an update's rollout, and the same update from them. (Where they part later is rounding: the
    conv layers' sums in another order, which Adam's first steps, about lr whatever the
    gradient's size, carry into the next rollout's action probabilities.)"""
    options = dict(env="atari:Pong", num_envs=8, num_steps=8, total_timesteps=128, hidden_size=32, num_layers=1,
                   num_minibatches=1, update_epochs=1)
    seen = {}
    for devices in (1, 8):
        trainer = make_trainer(devices, **options)
        state = trainer.init_state()
        start = np.asarray(state.envs.obs).reshape((8, 4, 84, 84))
        state, chunk = trainer.chunk_fn(1, state)(state)
        seen[devices] = (start, np.asarray(state.envs.obs).reshape((8, 4, 84, 84)),
                         {k: float(np.asarray(v).ravel()[0]) for k, v in chunk.losses.items()})
    np.testing.assert_array_equal(seen[1][0], seen[8][0])
    np.testing.assert_array_equal(seen[1][1], seen[8][1])
    assert not (seen[1][0] == seen[1][1]).all()  # the games moved
    for name, value in seen[1][2].items():
        np.testing.assert_allclose(seen[8][2][name], value, rtol=1e-4, atol=1e-7, err_msg=name)


@pytest.mark.slow
def test_a_batch_stepped_in_halves_plays_and_learns_as_the_whole_batch_and_restarts_alike(monkeypatch):
    """PPO's rollout of a pipelined batch (the default: two halves in turns, each simulating
    while the other's actions are inferred, vec.scan_halves) and of the whole batch at once
    (pipeline=false): the same games and frames, and the same losses up to the rounding of a
    network's batch of half the size, update after update, for each of 2 runs (--num-seeds: their
    own games); and after the host's games are lost (as in a resumed process) the same games
    begun anew."""
    from jaxrl_mgpu.envs import atari
    options = dict(env="atari:Pong", num_envs=8, num_steps=8, total_timesteps=256, hidden_size=32, num_layers=1,
                   num_minibatches=1, update_epochs=1, num_seeds=2)
    calls = {"step": 0}
    whole_step = atari.SIMULATORS.step

    def counted_step(*args):
        calls["step"] += 1
        return whole_step(*args)
    monkeypatch.setattr(atari.SIMULATORS, "step", counted_step)
    seen = {}
    for pipeline in ("false", "true"):
        trainer = make_trainer(1, env_args=f"pipeline={pipeline}", **options)
        assert vec.pipelined(trainer.env, 8, memoryless=True) == (pipeline == "true")
        state, frames, losses = trainer.init_state(), [], []
        calls["step"] = 0
        for update in range(3):
            if update == 2:
                atari.SIMULATORS.close()  # the games are gone: the next step begins them anew
            state, chunk = trainer.chunk_fn(1, state)(state)
            frames.append(np.asarray(state.envs.obs).reshape((2, 8, 4, 84, 84)))  # [runs, games, ...]
            losses.append({k: np.asarray(v).ravel() for k, v in chunk.losses.items()})  # each run's
        assert (calls["step"] > 0) == (pipeline == "false")  # the halves step through send and recv only
        seen[pipeline] = frames, losses
    for whole, halves in zip(*(seen[p][0] for p in ("false", "true"))):
        np.testing.assert_array_equal(whole, halves)
    for whole, halves in zip(*(seen[p][1] for p in ("false", "true"))):  # up to the rounding of half-size batches
        for name, value in whole.items():
            np.testing.assert_allclose(halves[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert not (seen["true"][0][0] == seen["true"][0][1]).all()  # the games moved
    assert not (seen["true"][0][0][0] == seen["true"][0][0][1]).all()  # each run plays its own


@pytest.mark.slow
def test_a_resume_restarts_the_games_and_two_resumes_from_one_checkpoint_agree(tmp_path):
    """The games' state is in C++, out of a checkpoint: a resumed run starts new games (seeded
    from the resumed step), so two resumes of one checkpoint train (and evaluate) the same, and
    the first update after the resume is not the uninterrupted run's. Episodes end and are
    logged with the game's score; the last row has the evaluation's."""
    whole = rows(atari_run(tmp_path, "whole"))
    cut = atari_run(tmp_path, "cut", "--stop-at-update", "2")
    shutil.copytree(cut, tmp_path / "twin")
    resumed = [rows(atari_run(tmp_path, name, "--resume")) for name in ("cut", "twin")]
    strip = lambda rs: [without_timing(r) for r in rs]  # noqa: E731
    assert strip(resumed[0]) == strip(resumed[1])
    unevaluated = lambda r: {k: v for k, v in r.items() if not k.startswith("eval/")}  # noqa: E731 (the stop evaluates)
    assert [unevaluated(r) for r in strip(resumed[0])[:2]] == strip(whole)[:2]
    assert strip(resumed[0])[2]["loss/value"] != strip(whole)[2]["loss/value"]
    assert any(r.get("episodes") for r in whole) and "eval/episode_return" in whole[-1]
    assert resumed[0][-1]["eval/episode_return"] == resumed[1][-1]["eval/episode_return"]


@pytest.mark.parametrize("argv, words", [
    (["--env", "atari:NoSuchGame"], "--env atari:NoSuchGame: no such task; atari offers Adventure, AirRaid"),
    (["--env", "atari:Pong", "--env-args", "frame_stack=0"], "--env-args frame_stack=0: atari:Pong's frame_stack "
                                                              "must be at least 1"),
    (["--env", "atari:Pong", "--env-args", "sticky=1.5"], "sticky must be at most 1"),
])
def test_bad_atari_input_is_one_line_and_writes_nothing(argv, words, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*argv, "--run-dir", str(run_dir)) == 2
    assert words in one_error_line(capsys)
    assert not run_dir.exists()


def atari_config(**options):
    return config_lib.validate(config_lib.build(dict(env="atari:Pong", **options)))


def test_the_host_s_cores_are_shared_by_its_devices_games_unless_threads_are_given():
    """threads=0 (the default) becomes the cores this process may use over its devices, whose
    batches step at once; threads given are kept; an environment on the devices has none."""
    par = parallel.setup("pmap", 2)
    plan = plan_lib.of_config(atari_config(env_args="max_frames=400"))
    threaded = host.with_threads(plan, par)
    assert threaded.env.threads == max(1, parallel.host_cores() // 2) and plan.env.threads == 0
    assert threaded.env.settings.max_frames == 400 and threaded.cfg is plan.cfg  # config.json keeps its --env-args
    given = plan_lib.of_config(atari_config(env_args="threads=3"))
    assert host.with_threads(given, par) is given
    cartpole = plan_lib.of_config(config_lib.validate(config_lib.build({})))
    assert host.with_threads(cartpole, par) is cartpole


def test_more_games_than_the_host_s_memory_holds_are_refused_in_one_line(monkeypatch, tmp_path, capsys):
    """On 8 devices with 90 MiB of budget (1.75 MiB a game): 64 environments and 8 evaluation
    games are 72 games, 126 MiB; 40 (5 per device, and one evaluation game each) are 84 MiB."""
    monkeypatch.setattr(parallel, "host_memory", lambda: (100 * 2**20, "MemAvailable"))
    run_dir = tmp_path / "run"
    assert run("--config", "atari-tiny", "--num-envs", "64", "--run-dir", str(run_dir)) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: --num-envs 64: 72 atari:Breakout games on this host would take about 0.1 GiB of "
                           "its memory, more than 0.9 x the 0.1 GiB of MemAvailable; give at most --num-envs 40"), line
    assert not run_dir.exists()


def test_auto_scale_sizes_the_games_from_the_threads_and_within_the_host_s_memory(monkeypatch):
    """--auto-scale's first sizes are 2 and 16 games per simulator thread (as powers of 2), and
    none past the host's memory budget: 900 MiB hold 514 games, 64 on each of 8 devices."""
    monkeypatch.setattr(parallel, "host_memory", lambda: (1000 * 2**20, "MemAvailable"))
    cfg = atari_config(env_args="threads=3", auto_scale="throughput", total_timesteps=2**30, eval_every=0)
    search = autoscale.Search(plan_lib.of_config(cfg), parallel.this_device(), RunLog(None, 0), parallel.setup("pmap"))
    assert search.first_sizes == (8, 64) and search.top == 64 and search.floor == 8
    assert "up to 64 (more games would not fit the host's memory budget)" in search.header()
    assert "3 simulator thread(s) per device's batch; at most 64 games per device" in search.header()
    assert search.why_not(128) == "128 games per device would not fit the host's memory budget"


def test_a_learner_without_its_collectors_run_directory_is_refused_in_one_line(tmp_path):
    """`--mode learn` needs the directory whose store its collectors fill: without --run-dir it is
    refused before anything is written (and ALE's banner, printed from C++ where a game is
    loaded, stays off the error's stream)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--config", "atari-tiny", "--algo", "dqn",
                          "--mode", "learn"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: --mode learn needs --run-dir: the directory whose store its --mode collect processes fill"], out.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_the_atari_extra_the_error_names_its_install_line(monkeypatch):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else find_spec(name, *a))
    with pytest.raises(envs.EnvError, match=r'--env atari:Pong needs ale_py: pip install -e "\.\[atari\]"'):
        envs.check("atari:Pong")


@pytest.mark.slow
def test_a_collector_on_the_host_feeds_a_learner_through_the_store(tmp_path):
    """AMAGO's asynchronous mode on Atari: a --mode collect process plays the games and writes
    the run's store; the --mode learn process trains DQN from it and finishes."""
    run_dir = tmp_path / "run"
    argv = ["--algo", "dqn", "--env", "atari:Breakout", "--env-args", "max_frames=160", "--num-envs", "4",
            "--num-steps", "1", "--updates-per-step", "1", "--replay-batch-size", "32", "--buffer-size", "1024",
            "--learning-starts", "64", "--hidden-size", "32", "--num-layers", "1", "--total-timesteps", "400",
            "--log-every", "20", "--checkpoint-every", "20", "--samples-per-insert", "4", "--shard-steps", "32",
            "--replay-obs-dtype", "uint8", "--run-dir", str(run_dir)]
    learner = spawn_train([*argv, "--mode", "learn"])
    wait_until(lambda: (run_dir / "checkpoints").is_dir())
    collector = spawn_train([*argv, "--mode", "collect", "--collector-id", "c1"])
    out, _ = learner.communicate(timeout=600)
    assert learner.returncode == 0, out
    c_out, _ = collector.communicate(timeout=120)
    assert collector.returncode == 0, c_out
    last = rows(run_dir)[-1]
    assert last["update"] == 100 and last["async/env_steps_received/c1"] >= 400
    assert "collector done" in c_out


@pytest.mark.slow
def test_evaluate_video_draws_the_atari_frames_of_the_episode_evaluation_plays_first(tmp_path, capsys):
    """`evaluate --video` on an Atari run: the frames are the observations' newest 84 x 84 grey
    frames (drawn 3x), the episode and its score are the first one `evaluate --episodes 1`
    plays, and the GIF is what the recorder kept."""
    import imageio.v3 as iio
    from jaxrl_mgpu import evaluate
    run_dir = atari_run(tmp_path, "run")
    path = tmp_path / "breakout.gif"
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--video", str(path)]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluate.main(["--run-dir", str(run_dir), "--episodes", "1", "--devices", "1"]) == 0
    assert said["return"] == json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mean_return"]
    frames = iio.imread(path, index=None)
    assert len(frames) == said["frames"] == said["episode_length"] + 1 and frames.shape[-1] == 3
    # below the step number's header, a grey picture of the game: 252 x 252, R = G = B, not blank
    picture = frames[:, -252:, 2:254]
    assert (picture[..., 0] == picture[..., 1]).all() and picture.std() > 10


@pytest.mark.slow
def test_the_frame_replay_rebuilds_the_stacks_a_naive_replay_stores():
    """DQN's replay on Atari keeps each frame once (algos/replay.FrameReplay): over games that
    end and restart (cut at 160 frames) and a ring that wraps, every stack it rebuilds, s_t and
    s' (the next row's), is the one a replay of whole observations holds, and its samples' n-step
    targets are that replay's."""
    from jaxrl_mgpu.algos import replay as replay_lib
    env, params = envs.make("atari:Breakout", "max_frames=160")
    ids, rows, steps = jnp.arange(2), 32, 90
    batch = vec.reset(env, params, jax.random.PRNGKey(0), ids)
    naive = replay_lib.replay_init(2, rows, (4, 84, 84), jnp.uint8)
    frames = replay_lib.frame_replay_init(2, rows, (4, 84, 84))
    actions = np.random.default_rng(0).integers(0, 4, (steps, 2))
    ends = 0
    for t in range(steps):
        action = jnp.asarray(actions[t], jnp.int32)
        obs = batch.obs
        batch, out = vec.step(env, params, batch, action, vec.env_keys(jax.random.PRNGKey(t), ids))
        naive = replay_lib.replay_add(naive, jnp.int32(t), obs, action, out)
        frames = replay_lib.frame_replay_add(frames, jnp.int32(t), obs, action, out)
        ends += int((np.asarray(out.done_length) > 0).sum())
    assert ends >= 2  # games ended (and restarted) inside the ring
    held = np.arange(steps - rows + 3, steps - 1)   # steps whose stack and next row the ring holds
    for e in range(2):
        env_ids = jnp.full(len(held), e)
        np.testing.assert_array_equal(replay_lib.frame_stack(frames, env_ids, jnp.asarray(held), 4),
                                      naive.obs[e, held % rows])
        np.testing.assert_array_equal(replay_lib.frame_stack(frames, env_ids, jnp.asarray(held + 1), 4),
                                      naive.next_obs[e, held % rows])
    assert (np.asarray(frames.valid) < 4).any()  # some stacks began a game: zero padding rebuilt
    sample = replay_lib.frame_replay_sample(frames, jnp.int32(steps), jax.random.PRNGKey(5), 64, 3, 0.99, 4)
    # every n-step transition of the naive replay, from each (env, row) it holds
    every = replay_lib.replay_gather(naive, jnp.repeat(jnp.arange(2), rows), jnp.tile(jnp.arange(rows), 2), 3, 0.99)
    every, sample = jax.tree.map(np.asarray, every), jax.tree.map(np.asarray, sample)
    for i in range(64):   # sample i is one of them
        same = np.ones(2 * rows, bool)
        for a, b in zip(every, sample):
            same &= (a == b[i]).reshape(2 * rows, -1).all(1)
        assert same.any(), i


@pytest.mark.slow
def test_dqn_on_atari_learns_from_the_frame_replay_that_halves_fill_as_the_whole_batch():
    """DQN on Atari learns from the frame-stack-aware replay; its games stepped in halves (the
    default, vec.scan_halves) fill that replay with exactly the frames, actions, rewards and ends
    of the whole batch at once (pipeline=false), and the losses agree up to rounding."""
    from jaxrl_mgpu.algos.replay import FrameReplay
    seen = {}
    for pipeline in ("false", "true"):
        trainer = make_trainer(2, algo="dqn", env="atari:Breakout", env_args=f"max_frames=160,pipeline={pipeline}",
                               num_envs=8, num_steps=8, buffer_size=512, replay_batch_size=16, learning_starts=64,
                               total_timesteps=256, hidden_size=16, num_layers=1)
        state = trainer.init_state()
        assert isinstance(state.replay, FrameReplay) and state.replay.frames.shape[-3:] == (64, 84, 84)
        state, chunk = trainer.chunk_fn(4, state)(state)
        seen[pipeline] = state.replay, {k: np.asarray(v).ravel() for k, v in chunk.losses.items()}
    td = float(seen["true"][1]["loss/td"][0])
    assert np.isfinite(td) and td > 0
    jax.tree.map(np.testing.assert_array_equal, seen["false"][0], seen["true"][0])
    for name, value in seen["false"][1].items():
        np.testing.assert_allclose(seen["true"][1][name], value, rtol=1e-5, atol=1e-7, err_msg=name)
