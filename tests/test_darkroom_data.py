"""Dark Room environments, RLDS learning-history datasets, and the histories CLI."""

import importlib.util
import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core import example_serializer
from tensorflow_datasets.proto import tf_example_pb2

from jaxrl_mgpu import envs, parallel
from jaxrl_mgpu.tools import histories
from jaxrl_mgpu.asynchronous import store
from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.envs import darkroom, vec

NOOP, PLUS_Y, MINUS_X, PLUS_X = 4, 0, 3, 2


def play(env, params, actions):
    """Steps one env through `actions` from a reset; returns obs, reward, terminated, truncated [T]."""
    def step(state, xs):
        key, action = xs
        obs, state, reward, terminated, truncated, _ = env.step(key, state, action, params)
        return state, (obs, reward, terminated, truncated)
    _, state = env.reset(jax.random.PRNGKey(0), params)
    actions = jnp.asarray(actions, jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(1), len(actions))
    return jax.jit(lambda s: jax.lax.scan(step, s, (keys, actions))[1])(state)


# ----------------------------------------------------------------------------- environments


@pytest.mark.parametrize("room", [darkroom.DarkRoom, darkroom.DarkRoomHard])
def test_centre_start_walls_and_observation(room):
    env = room()
    params = env.default_params
    obs, _ = env.reset(jax.random.PRNGKey(0), params)
    centre = env.size // 2
    assert obs.dtype == jnp.float32 and obs.tolist() == [centre, centre]
    assert env.observation_space(params).shape == (2,) and env.num_actions == 5
    # Walking into a wall leaves the agent against it.
    obs, *_ = play(env, params, [MINUS_X] * (centre + 3) + [PLUS_Y] * (centre + 3))
    assert obs[centre + 2].tolist() == [0, centre]
    assert obs[-1].tolist() == [0, env.size - 1]


def test_darkroom_pays_every_step_on_goal():
    env = darkroom.DarkRoom()
    params = env.params_for([5, 4])  # one step +x from the centre (4, 4)
    _, reward, terminated, _ = play(env, params, [PLUS_X, NOOP, NOOP, MINUS_X, PLUS_X])
    assert reward.tolist() == [1, 1, 1, 0, 1]
    assert not terminated.any()


def test_darkroom_hard_pays_once_and_continues():
    env = darkroom.DarkRoomHard()
    params = env.params_for([9, 8])  # one step +x from the centre (8, 8)
    _, reward, terminated, truncated = play(env, params, [PLUS_X, NOOP, MINUS_X, PLUS_X] + [NOOP] * 46 + [PLUS_X])
    assert reward[:4].tolist() == [1, 0, 0, 0] and reward[4:50].sum() == 0
    assert not terminated.any() and truncated.tolist().index(True) == 49  # 50-step episodes
    assert reward[50] == 1  # a new episode pays again


@pytest.mark.parametrize("room", [darkroom.DarkRoom, darkroom.DarkRoomHard])
def test_truncation_only(room):
    env = room()
    obs, _, terminated, truncated = play(env, env.default_params, [PLUS_X] * (2 * env.episode_len))
    ends = np.flatnonzero(truncated)
    assert ends.tolist() == [env.episode_len - 1, 2 * env.episode_len - 1] and not terminated.any()
    centre = env.size // 2
    assert obs[env.episode_len - 1].tolist() == [centre, centre]  # auto-reset to the centre


@pytest.mark.parametrize("name,size,num_test", [("DarkRoom", 9, 8), ("DarkRoomHard", 17, 29)])
def test_goal_split(name, size, num_test):
    train, test = darkroom.goals(name, "train", 0), darkroom.goals(name, "test", 0)
    assert len(test) == num_test and len(train) == size * size - num_test
    cells = {tuple(g) for g in train} | {tuple(g) for g in test}
    assert len(cells) == size * size  # disjoint, and together every cell
    assert np.array_equal(darkroom.goals(name, "test", 0), test)
    assert not np.array_equal(darkroom.goals(name, "test", 1), test)
    with pytest.raises(envs.EnvError):
        darkroom.goals("CartPole-v1", "train", 0)


def test_make_jit_and_vmap_over_goals():
    env, params = envs.make("DarkRoom")
    assert env.name == "DarkRoom" and "DarkRoomHard" in envs.names()
    assert tuple(params.goal.tolist()) in {tuple(g) for g in darkroom.goals("DarkRoom", "train", 0)}
    goals = jnp.array([[5, 4], [3, 4], [0, 0]])
    batch = env.params_for(goals)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    _, states = jax.jit(jax.vmap(env.reset))(keys, batch)
    out = jax.jit(jax.vmap(env.step))(keys, states, jnp.full(3, PLUS_X), batch)
    assert out[2].tolist() == [1, 0, 0]  # only the goal one step +x pays
    # The project's batched rollout helpers take it like any gymnax env.
    batch_envs = vec.reset(env, params, jax.random.PRNGKey(0), jnp.arange(4))
    assert batch_envs.obs.shape == (4, 2)


# ----------------------------------------------------------------------------- datasets


def small_histories(tasks=3, steps=60):
    """Random histories with episodes of uneven length (one terminated) in every task."""
    rng = np.random.default_rng(0)
    done = np.zeros((tasks, steps), bool)
    done[:, [9, 29, steps - 1]] = True
    terminated = np.zeros((tasks, steps), bool)
    terminated[1, 9] = True
    return rlds.Histories(
        observation=rng.normal(size=(tasks, steps, 2)).astype(np.float32),
        action=rng.integers(0, 5, (tasks, steps)).astype(np.int32),
        reward=rng.random((tasks, steps)).astype(np.float32), done=done, terminated=terminated,
        task=rng.integers(0, 9, (tasks, 2)).astype(np.int32),
        metadata={"env": "DarkRoom", "algo": "test", "algo_config": {"lr": 0.5, "names": ["a", "b"]}, "seed": 3})


def assert_same_histories(a, b):
    for field in ("observation", "action", "reward", "done", "terminated", "task"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y), field


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    h = small_histories()
    return h, rlds.write(tmp_path_factory.mktemp("data") / "ds", h)


def test_round_trip_exact(dataset):
    h, path = dataset
    assert_same_histories(rlds.read(path, env="DarkRoom"), h)
    part = rlds.read(path, tasks=[2, 0])
    assert np.array_equal(part.observation, h.observation[[2, 0]])
    assert [p.name for p in path.parent.iterdir()] == ["ds"]  # no staging left behind
    # Neither writing nor reading needed TensorFlow.
    assert importlib.util.find_spec("tensorflow") is None and "tensorflow" not in sys.modules


def test_rlds_episodes_through_public_tfds_api(dataset):
    """The plain TFDS decode path sees RLDS episodes with the right flags, and agrees with `read`."""
    h, path = dataset
    source = tfds.builder_from_directory(path).as_data_source("train")
    assert len(source) == 9  # 3 tasks x 3 episodes, task-major
    for i, (task, episode, start, stop) in enumerate(
            (t, e, s, p) for t in range(3) for e, (s, p) in enumerate([(0, 10), (10, 30), (30, 60)])):
        ex = source[i]
        assert (ex["task_index"], ex["episode_index"]) == (task, episode)
        steps = {k: np.stack([s[k] for s in ex["steps"]]) for k in rlds.STEP_FIELDS}
        n = stop - start
        assert steps["is_first"].tolist() == [True] + [False] * (n - 1)
        assert steps["is_last"].tolist() == [False] * (n - 1) + [True]
        assert np.array_equal(steps["is_terminal"], h.terminated[task, start:stop])
        assert np.array_equal(steps["discount"], 1.0 - h.terminated[task, start:stop])
        assert np.array_equal(steps["observation"], h.observation[task, start:stop])
        assert np.array_equal(ex["task"], h.task[task])


def test_serializer_gives_tfds_examples_and_checks_shapes():
    """rlds.serializer (whole arrays at a time) gives the tf.Example TFDS's own serializer gives
    (equal protos), for a history's episode and for a store shard of MinAtar-like byte
    observations; a field of the wrong shape is a DatasetError."""
    h = small_histories()
    steps = {"observation": h.observation[0, :10], "action": h.action[0, :10], "reward": h.reward[0, :10],
             "discount": np.ones(10, np.float32), "is_first": np.arange(10) == 0, "is_last": np.arange(10) == 9,
             "is_terminal": np.zeros(10, bool)}
    history = (rlds._features(h), {"steps": steps, "task": h.task[0], "task_index": 0, "episode_index": 0})
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 2, (12, 10, 10, 4), dtype=np.uint8)
    shard = (store._features(obs[0], np.int32(0)),
             {"steps": {**{k: np.resize(v, 12) for k, v in steps.items() if k != "observation"}, "observation": obs,
                        "action": np.arange(12, dtype=np.int32)},
              "segments": {"length": np.array([5, 7]), "lookahead": np.array([0, 2]), "final_observation": obs[:2]}})
    for features, example in (history, shard):
        ours = tf_example_pb2.Example.FromString(rlds.serializer(features)(example))
        tfds_bytes = example_serializer.ExampleSerializer(features.get_serialized_info()).serialize_example(
            features.encode_example(example))
        assert ours == tf_example_pb2.Example.FromString(tfds_bytes)
    bad = dict(shard[1], segments=dict(shard[1]["segments"], length=np.array([[5, 7]])))
    with pytest.raises(rlds.DatasetError, match="feature 'segments/length' has shape"):
        rlds.serializer(shard[0])(bad)


def test_metadata_round_trip(dataset):
    h, path = dataset
    meta = rlds.info(path)
    assert {k: meta[k] for k in h.metadata} == h.metadata
    assert (meta["num_tasks"], meta["steps_per_task"], meta["episodes_per_task"]) == (3, 60, [3, 3, 3])
    assert tfds.builder_from_directory(path).info.metadata["env"] == "DarkRoom"


def test_write_refuses_bad_input(tmp_path, dataset):
    h, path = dataset
    with pytest.raises(rlds.DatasetError, match="not an empty directory"):
        rlds.write(path, h)
    unfinished = small_histories()
    unfinished.done[0, -1] = False
    with pytest.raises(rlds.DatasetError, match="end on a done step"):
        rlds.write(tmp_path / "x", unfinished)
    assert not (tmp_path / "x").exists()
    (tmp_path / "empty").mkdir()  # an existing empty directory is fine
    assert_same_histories(rlds.read(rlds.write(tmp_path / "empty", h)), h)


def test_shard():
    blocks = [rlds.shard(10, 4, i) for i in range(4)]
    assert [list(b) for b in blocks] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # equal sizes, remainder dropped
    with pytest.raises(rlds.DatasetError):
        rlds.shard(3, 4, 0)


def test_errors_missing_and_wrong_env(tmp_path, dataset):
    with pytest.raises(rlds.DatasetError, match="no dataset at"):
        rlds.read(tmp_path / "nothing")
    with pytest.raises(rlds.DatasetError, match="'DarkRoom', not 'DarkRoomHard'"):
        rlds.read(dataset[1], env="DarkRoomHard")


def corrupt_copy(tmp_path, dataset, damage):
    """A written dataset with its shard file damaged by `damage(path)`."""
    path = rlds.write(tmp_path / "ds", dataset[0])
    shard_file = next(path.glob("*.array_record-*"))
    damage(shard_file)
    return path, shard_file


def test_error_truncated_shard(tmp_path, dataset):
    path, shard_file = corrupt_copy(tmp_path, dataset, lambda f: f.write_bytes(f.read_bytes()[:1000]))
    with pytest.raises(rlds.DatasetError, match=re.escape(f"shard {shard_file} is truncated")):
        rlds.read(path)


def test_error_flipped_byte(tmp_path, dataset):
    def flip(f):
        data = bytearray(f.read_bytes())
        data[200] ^= 0xFF
        f.write_bytes(bytes(data))
    path, shard_file = corrupt_copy(tmp_path, dataset, flip)
    with pytest.raises(rlds.DatasetError, match=re.escape(f"shard {shard_file} is corrupt")):
        rlds.read(path)


def test_error_garbled_metadata_is_a_dataset_error(tmp_path, dataset):
    """A metadata.json that is not JSON: TFDS reads it lazily, so it must fail at open, as one
    DatasetError, not as a JSONDecodeError later."""
    path = rlds.write(tmp_path / "ds", dataset[0])
    (path / "metadata.json").write_text("{garbled")
    for read in (rlds.info, rlds.read):
        with pytest.raises(rlds.DatasetError, match="cannot open the dataset"):
            read(path)


def test_error_unreadable_shard_despite_matching_checksums(tmp_path, dataset):
    """Even when the recorded checksums are rewritten to match, array_record's own read error
    becomes a DatasetError."""
    path, shard_file = corrupt_copy(tmp_path, dataset, lambda f: f.write_bytes(f.read_bytes()[:1000]))
    record = json.loads((path / rlds.CHECKSUMS).read_text())
    record["files"][shard_file.name] = {"bytes": 1000, "sha256": rlds._sha256(shard_file)}
    (path / rlds.CHECKSUMS).write_text(json.dumps(record))
    with pytest.raises(rlds.DatasetError, match="cannot read"):
        rlds.read(path)


# ----------------------------------------------------------------------------- histories


def random_return(env, goals, episodes=50):
    """Mean episode return of uniformly random actions on `goals`."""
    def one(goal, key):
        params = env.params_for(goal)
        keys = jax.random.split(key, episodes * env.episode_len)
        actions = jax.random.randint(key, (len(keys),), 0, env.num_actions)
        _, state = env.reset(key, params)

        def step(state, xs):
            _, state, reward, *_ = env.step(xs[0], state, xs[1], params)
            return state, reward
        return jax.lax.scan(step, state, (keys, actions))[1].sum() / episodes
    return float(jax.jit(jax.vmap(one))(jnp.asarray(goals), jax.random.split(jax.random.PRNGKey(0), len(goals))).mean())


@pytest.mark.slow
def test_histories_cli_learns_and_writes(tmp_path, capsys):
    out = tmp_path / "hist"
    assert histories.main(["--env", "DarkRoom", "--tasks", "8", "--steps", "1000", "--out", str(out)]) == 0
    assert "mean source return first episode" in capsys.readouterr().out
    h = rlds.read(out, env="DarkRoom")
    assert h.observation.shape == (8, 1000, 2) and h.done.sum() == 8 * 50
    meta = h.metadata
    assert (meta["algo"], meta["tasks"], meta["steps"], meta["seed"], meta["split"]) == \
        ("tabular-q-ucb", 8, 1000, 0, "train")
    assert meta["algo_config"]["algo"] == "ucb" and meta["algo_config"]["gamma"] == 0.9
    train = {tuple(g) for g in darkroom.goals("DarkRoom", "train", 0)}
    assert all(tuple(g) in train for g in h.task)
    returns = histories.episode_returns(h, 20).mean(0)
    baseline = random_return(darkroom.DarkRoom(), h.task)
    assert returns[-5:].mean() > returns[:5].mean() + 3 and returns[-5:].mean() > baseline + 3, (returns, baseline)


@pytest.mark.slow
def test_histories_do_not_depend_on_device_count():
    goals = darkroom.goals("DarkRoomHard", "test", 0)[:3]  # 3 tasks: padded on 8 devices
    cfg = histories.LearnerConfig(algo="q")
    on8 = histories.run("DarkRoomHard", goals, 100, 0, cfg, parallel.setup("pmap"))
    on1 = histories.run("DarkRoomHard", goals, 100, 0, cfg, parallel.setup("pmap", devices=1))
    assert_same_histories(on8, on1)
    assert on8.done[:, 49::50].all() and on8.done.sum() == 3 * 2


@pytest.mark.parametrize("args,message", [
    (["--env", "CartPole-v1"], "--env 'CartPole-v1'"),
    (["--steps", "210"], "--steps 210 must be a positive multiple"),
    (["--algo", "sarsa"], "--algo"),
    (["--tasks", "0"], "--tasks 0"),
])
def test_histories_cli_bad_input(tmp_path, capsys, args, message):
    out = tmp_path / "hist"
    base = {"--env": "DarkRoom", "--tasks": "2", "--steps": "200", "--out": str(out)}
    base.update(dict(zip(args[::2], args[1::2])))
    assert histories.main([x for kv in base.items() for x in kv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_histories_cli_refuses_non_empty_out(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    assert histories.main(["--tasks", "2", "--steps", "200", "--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err and [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
