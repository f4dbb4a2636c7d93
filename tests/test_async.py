"""Asynchronous collection and learning: one learner, collectors that come and go."""

import dataclasses
import json
import signal
import time

import jax
import numpy as np
import pytest

from helpers import spawn_train, wait_until
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.asynchronous import dqn as async_dqn
from jaxrl_mgpu.asynchronous.store import Store, Transitions
from jaxrl_mgpu.log import RunLog

DQN = ["--config", "cartpole-dqn", "--num-envs", "8", "--num-steps", "1", "--updates-per-step", "4",
       "--replay-batch-size", "64", "--buffer-size", "4096", "--learning-starts", "512", "--hidden-size", "32",
       "--total-timesteps", str(8 * 150), "--log-every", "10", "--checkpoint-every", "10",
       "--max-replay-ratio", "0.5", "--shard-steps", "32", "--devices", "1"]


def spawn(*argv):
    return spawn_train([*DQN, *argv])


def test_learner_with_two_collectors_one_killed(tmp_path):
    run_dir = tmp_path / "run"
    store = Store(run_dir)
    learner = spawn("--mode", "learn", "--run-dir", str(run_dir))
    wait_until(lambda: (run_dir / "checkpoints").is_dir())  # collectors start after the learner
    c1 = spawn("--mode", "collect", "--run-dir", str(run_dir), "--collector-id", "c1")
    c2 = spawn("--mode", "collect", "--run-dir", str(run_dir), "--collector-id", "c2")
    # Kill c2 once it has contributed a few shards.
    wait_until(lambda: sum(s.meta["collector"] == "c2" for s in store.shards()) >= 3)
    c2.send_signal(signal.SIGKILL)
    c2.wait()
    out, _ = learner.communicate(timeout=240)
    assert learner.returncode == 0, out
    c1_out, _ = c1.communicate(timeout=60)  # stops by itself when the learner is done
    assert c1.returncode == 0, c1_out

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["update"] == 150
    assert last["async/env_steps_received/c1"] > 0 and last["async/env_steps_received/c2"] > 0
    assert last["async/env_steps_received"] == last["async/env_steps_received/c1"] + \
        last["async/env_steps_received/c2"]
    assert 0 < last["async/replay_ratio"] <= 0.5 + 1e-9  # the cap held
    assert all(r["async/policy_lag"] is None or r["async/policy_lag"] >= 0 for r in rows)
    assert any(r["async/policy_lag"] is not None for r in rows)
    assert np.isfinite(last["loss/td"])
    # Every listed shard is complete (checksums verified on read). What the killed collector
    # was writing, if anything, stays in a hidden staging directory that is never listed.
    for shard in store.shards():
        assert not shard.path.name.startswith(".")
        store.read(shard)


def test_restarted_learner_resumes_and_refills_from_the_store(tmp_path):
    run_dir = tmp_path / "run"
    learner = spawn("--mode", "learn", "--run-dir", str(run_dir), "--collect-before-checkpoint", "random")
    wait_until(lambda: (run_dir / "checkpoints").is_dir())
    collector = spawn("--mode", "collect", "--run-dir", str(run_dir), "--collector-id", "c1")
    wait_until(lambda: (run_dir / "metrics.jsonl").exists() and
               len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 3)
    learner.send_signal(signal.SIGTERM)  # preempted: saves and exits 0
    out, _ = learner.communicate(timeout=60)
    assert learner.returncode == 0, out
    learner = spawn("--mode", "learn", "--run-dir", str(run_dir), "--resume")
    out, _ = learner.communicate(timeout=240)
    assert learner.returncode == 0, out
    assert "resumed the learner" in out
    collector.communicate(timeout=60)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["update"] == 150
    updates = [r["update"] for r in rows]
    assert updates == sorted(set(updates)), "no update logged twice"


def test_learner_resume_from_another_versions_state_is_one_line(tmp_path, capsys):
    """A learner checkpoint this version cannot read (written with the optimizer laid out per
    leaf, as before it was flattened): --mode learn --resume stops with one line, exit 2, and
    leaves config.json, metrics.jsonl and the checkpoints as they were (it restores before it
    rewrites them)."""
    import subprocess
    import sys
    from jaxrl_mgpu import train
    run_dir = tmp_path / "run"
    argv = [*DQN, "--mode", "learn", "--run-dir", str(run_dir)]
    # A learner of that layout: it publishes its state at iteration 0, then waits for data.
    old = subprocess.Popen([sys.executable, "-c", "import sys, optax; optax.flatten = lambda tx: tx; "
                            "from jaxrl_mgpu import train; sys.exit(train.main(sys.argv[1:]))", *argv],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: (run_dir / "checkpoints" / "0").is_dir())
    old.send_signal(signal.SIGTERM)
    out, _ = old.communicate(timeout=60)
    assert old.returncode == 0, out
    (run_dir / "metrics.jsonl").write_text('{"update": 0}\n')  # a row the resume must not drop
    files = {name: (run_dir / name).read_text() for name in ("config.json", "metrics.jsonl")}
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    try:
        code = train.main([*argv, "--resume", "--keep-checkpoints", "5"])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "does not fit this version's training state" in err and "opt_state" in err, err
    assert err.count("\n") == 1, err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    assert {name: (run_dir / name).read_text() for name in files} == files


def test_collect_mode_needs_a_run_dir_and_an_off_policy_algo(capsys):
    from jaxrl_mgpu import train
    for argv, words in [(["--mode", "collect", "--algo", "dqn"], "--run-dir"),
                        (["--mode", "learn", "--algo", "ppo", "--run-dir", "/tmp/x-never"], "--algo dqn")]:
        try:
            train.main(argv)
        except SystemExit as e:
            assert e.code == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err


def test_shard_reader_order_refill_skips_and_errors(tmp_path):
    """The learner's background reader: oldest first, each shard once, consumed shards flagged
    as not new after a restart, None skips a shard, and a read error reaches the learner."""
    import time
    from pathlib import Path
    from jaxrl_mgpu.asynchronous.reader import ShardReader
    from jaxrl_mgpu.asynchronous.store import Shard

    class FakeStore:
        def __init__(self):
            self.names = []

        def shards(self):
            return [Shard(Path(tmp_path / n), {}) for n in sorted(self.names)]

    def drain(reader, n):
        got = []
        deadline = time.time() + 10
        while len(got) < n and time.time() < deadline:
            got += reader.ready()
            time.sleep(0.01)
        return got

    store = FakeStore()
    for n in ("a", "b", "c", "skip"):
        (tmp_path / n).mkdir()
    store.names = ["b", "a", "skip"]
    reader = ShardReader(store, consumed={"a"}, refill=True,
                         read=lambda s: None if s.path.name == "skip" else s.path.name)
    got = drain(reader, 2)
    store.names.append("c")  # arrives later
    got += drain(reader, 1)
    reader.close()
    assert [(s.path.name, new, data) for s, new, data in got] == [("a", False, "a"), ("b", True, "b"), ("c", True, "c")]

    fresh = ShardReader(store, consumed={"a"}, refill=False, read=lambda s: s.path.name)
    assert [s.path.name for s, _, _ in drain(fresh, 3)] == ["b", "c", "skip"]  # consumed "a" not read again
    fresh.close()

    def broken(shard):
        raise ValueError("damaged shard")
    failing = ShardReader(store, consumed=set(), refill=False, read=broken)
    deadline = time.time() + 10
    with pytest.raises(ValueError, match="damaged"):
        while time.time() < deadline:
            failing.ready()
            time.sleep(0.01)
    failing.close()


def test_learner_replay_stores_minatar_observations_as_bytes():
    """--mode learn with --replay-obs-dtype uint8: the learner's replay holds bytes, filled from
    the store's float32 transitions unchanged, and learns from them."""
    cfg = config_lib.validate(dataclasses.replace(
        config_lib.Config(), algo="dqn", mode="learn", env="Breakout-MinAtar", num_envs=2, num_steps=2,
        buffer_size=2 * async_dqn.BLOCK, replay_batch_size=8, hidden_size=8, updates_per_step=0.5,
        replay_obs_dtype="uint8"))
    par = parallel.setup("pmap", 2)
    learner = async_dqn.Learner(cfg, par, async_dqn.check(cfg, par.num_devices))
    key = par.replicate(np.asarray(jax.random.PRNGKey(0)))
    replay, state = learner.init_replay(key), learner.init(key)
    rng = np.random.default_rng(0)
    n = 2 * async_dqn.BLOCK
    frames = lambda: (rng.random((n,) + learner.obs_shape) < 0.2).astype(np.float32)  # noqa: E731
    block = Transitions(frames(), rng.integers(0, 3, n).astype(np.int32), rng.normal(size=n).astype(np.float32),
                        np.ones(n, np.float32), frames())
    shaped = Transitions(*(x.reshape((2, async_dqn.BLOCK) + x.shape[1:]) for x in block))
    replay = learner.insert(replay, par.shard(shaped))
    assert replay.obs.dtype == replay.next_obs.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(par.local(replay.obs), np.float32).reshape(block.obs.shape), block.obs)
    state, losses = learner.learn(state, replay)
    assert np.isfinite(float(par.first(losses)["loss/td"]))



def test_a_collector_without_a_learner_says_what_it_waits_for(tmp_path, capsys, monkeypatch):
    """No learner has published a checkpoint: the collector says so every WAITING_LOG_S (here
    shortened), instead of waiting in silence."""
    monkeypatch.setattr(async_dqn, "WAITING_LOG_S", 0.5)
    cfg = config_lib.validate(dataclasses.replace(
        config_lib.Config(), algo="dqn", mode="collect", env="CartPole-v1", num_envs=2, num_steps=2,
        buffer_size=1024, learning_starts=0, run_dir=str(tmp_path / "run")))
    deadline = time.monotonic() + 3.0
    par = parallel.setup("pmap", 2)
    total = async_dqn.collect(cfg, par, async_dqn.check(cfg, par.num_devices), RunLog(None, 0),
                              lambda: time.monotonic() > deadline)
    out = capsys.readouterr().out
    assert total == 0
    waiting = [line for line in out.splitlines() if "still waiting for the learner's first checkpoint" in line]
    assert waiting and "--mode learn" in waiting[0]
