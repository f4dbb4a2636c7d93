"""Asynchronous collection and learning: one learner, collectors that come and go."""

import dataclasses
import json
import os
import re
import shutil
import signal
import time
import types

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from helpers import one_error_line, resolved, run, spawn_train, wait_until
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.algos.replay import Transitions
from jaxrl_mgpu.algos.dqn import asynchronous as async_dqn
from jaxrl_mgpu.algos import replay_async
from jaxrl_mgpu.algos import ingest as async_ingest
from jaxrl_mgpu.asynchronous import policy, rate
from jaxrl_mgpu.asynchronous.store import Segments, Store
from jaxrl_mgpu.checkpoint import Checkpoints
from jaxrl_mgpu.log import RunLog

DQN = ["--config", "cartpole-dqn", "--num-envs", "8", "--num-steps", "1", "--updates-per-step", "4",
       "--replay-batch-size", "64", "--buffer-size", "4096", "--learning-starts", "512", "--hidden-size", "32",
       "--total-timesteps", str(8 * 150), "--log-every", "10", "--checkpoint-every", "10",
       "--samples-per-insert", "32", "--shard-steps", "32", "--devices", "1"]


def spawn(*argv):
    return spawn_train([*DQN, *argv])


def most_samples_per_insert(inserted: int) -> float:
    """What DQN's limiter allows at most: 32 samples per transition after the first 512, plus
    its error buffer (0.1 x 32 x 512 samples, at least --max-data-lag 8 iterations of 4 x 64)
    and one iteration."""
    return 32 + (max(0.1 * 32 * 512, 8 * 4 * 64) + 4 * 64) / (inserted - 512)


def consumed_by_collector(run_dir) -> tuple[dict, dict]:
    """From the learner's last checkpoint: env steps of the shards it consumed, and of those
    still unread in the store, by collector."""
    ckpts = Checkpoints(run_dir, read_only=True)
    consumed = set(ckpts.meta(ckpts.latest_step())["async"]["consumed"])
    ckpts.close()
    taken, unread = {}, {}
    for shard in Store(run_dir).shards():
        into = taken if shard.path.name in consumed else unread
        into[shard.meta["collector"]] = into.get(shard.meta["collector"], 0) + shard.meta["env_steps"]
    return taken, unread


@pytest.mark.slow
def test_learner_with_two_collectors_one_killed(tmp_path):
    run_dir = tmp_path / "run"
    store = Store(run_dir)
    # What a collector killed mid-shard leaves: a hidden staging directory, never renamed into
    # place. The learner never lists it, and deletes it once it is stale.
    dead = run_dir / "store" / ".00000000000000000001-c9-dead00.partial-0badc0de"
    dead.mkdir(parents=True)
    (dead / "metadata.json").write_text('{"collector": "c9", "episodes": 1, "env_steps": 5}')
    os.utime(dead, (time.time() - 3600, time.time() - 3600))
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
    # The rate limiter held: 32 samples per insert after the first 512 (--learning-starts), within
    # its buffer and one iteration of 4 x 64 samples.
    assert 0 < last["async/samples_per_insert"] <= most_samples_per_insert(last["async/inserted"])
    assert last["async/samples_per_insert_target"] == 32
    assert all(r["async/policy_lag"] is None or r["async/policy_lag"] >= 0 for r in rows)
    assert any(r["async/policy_lag"] is not None for r in rows)
    # the lag is also logged as the data enters the replay (per transition, after the ingest queue)
    inserted_lags = [r["async/policy_lag_inserted"] for r in rows if r["async/policy_lag_inserted"] is not None]
    assert inserted_lags and min(inserted_lags) >= 0
    # ... and the seconds each stage of the data's way took (one host: one clock, none negative)
    for stage in replay_async.STAGES:
        seconds = [r[f"async/latency_s/{stage}"] for r in rows if r[f"async/latency_s/{stage}"] is not None]
        assert seconds and all(0 <= s < 120 for s in seconds), (stage, seconds)
    assert np.isfinite(last["loss/td"])
    returns = [r["episode_return"] for r in rows if r["episode_return"] is not None]
    assert json.loads((run_dir / "summary.json").read_text())["final_return"] == pytest.approx(returns[-1])
    assert last["async/decode_s_per_shard"] is None or last["async/decode_s_per_shard"] > 0
    assert 0 <= last["async/ingest_fraction"] < 1
    # Chunks run at most --max-data-lag / 2 (4) iterations, fewer than --log-every's 10: data
    # enters the replay and params reach the collectors only between them. The time between
    # chunks is a share of its own window (a row written between chunks splits one such time).
    lengths = [r["async/iterations_per_chunk"] for r in rows if r["async/iterations_per_chunk"] is not None]
    assert lengths and all(1 <= n <= 4 for n in lengths)
    assert all(0 <= r["async/between_chunks_fraction"] <= 1 for r in rows)
    # Every listed shard is complete (checksums verified on read). What the killed collector
    # was writing, if anything, stays in a hidden staging directory that is never listed.
    for shard in store.shards():
        assert not shard.path.name.startswith(".")
        store.read(shard)
    assert not dead.exists() and "async/env_steps_received/c9" not in last
    # No complete shard lost: what the learner received from each collector is what it consumed.
    taken, _ = consumed_by_collector(run_dir)
    assert taken == {c: last[f"async/env_steps_received/{c}"] for c in ("c1", "c2")}
    # Checkpoints are published on a thread of their own while the learner goes on: each holds
    # the state and counts of its own iteration (4 gradient steps each), not a later one's.
    ckpts = Checkpoints(run_dir, read_only=True)
    steps = ckpts.steps()
    assert len(steps) > 1 and steps[-1] == 150
    for step in steps:
        saved = ckpts.latest.restore(step, args=ocp.args.Composite(grad_steps=ocp.args.StandardRestore()))
        assert int(np.asarray(saved["grad_steps"]["grad_steps"])) == 4 * step
        assert ckpts.meta(step)["async"]["iteration"] == step
    ckpts.close()


@pytest.mark.slow
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
    c_out, _ = collector.communicate(timeout=60)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["update"] == 150
    updates = [r["update"] for r in rows]
    assert updates == sorted(set(updates)), "no update logged twice"
    # The restarted learner went on from its checkpoint's counts: the refill was not counted
    # again, its rate held over the whole run, and no complete shard was lost (what the
    # collector wrote is what the learner received plus what is still unread in the store).
    assert 0 < last["async/samples_per_insert"] <= most_samples_per_insert(last["async/inserted"])
    written = int(re.search(r"collector done: ([0-9,]+) env steps written", c_out).group(1).replace(",", ""))
    taken, unread = consumed_by_collector(run_dir)
    assert taken["c1"] == last["async/env_steps_received/c1"] == last["async/env_steps_received"]
    assert taken["c1"] + unread.get("c1", 0) == written


@pytest.mark.slow
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


def files_under(path) -> dict:
    """Every file under `path` with its bytes (nothing written: the same before and after)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", ["a/b", "../up", ".hidden", "", "two words", "x" * 65, "tab\tid"])
def test_a_collector_id_that_is_no_file_name_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, bad):
    """--collector-id becomes part of every shard's file name: one with a '/' nested the shards in
    folders the learner never lists (it starved while the store grew). Refused at validation,
    before the run directory exists; ids that are one file-name component pass."""
    from jaxrl_mgpu import train

    def started(*_):
        raise AssertionError("the collector started")

    monkeypatch.setattr(train, "collect", started)
    run_dir = tmp_path / "run"
    assert run("--config", "pendulum-sac", "--mode", "collect", "--run-dir", str(run_dir), "--collector-id", bad) == 2
    line = one_error_line(capsys)
    assert "--collector-id" in line and "file name" in line, line
    assert not run_dir.exists()
    for good in ("c1", "gpu-1.a_b", "X" * 64):
        config_lib.validate(config_lib.build(dict(algo="dqn", mode="collect", collector_id=good)))


@pytest.mark.parametrize("run_of, words", [
    ("finished ppo", "holds a run of --algo ppo"),
    ("sac both", "holds a --mode both run"),
    ("sac learner done", "its learner is done"),
])
def test_a_collector_for_a_run_no_learner_will_serve_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch,
                                                                                   run_of, words):
    """A collector pointed at a run of another algorithm (a finished PPO run), at a --mode both
    run (it never reads a store) or at a run whose learner is done waited for params that never
    come; now one line, exit 2, and the run directory as it was."""
    from jaxrl_mgpu import train

    def started(*_):
        raise AssertionError("the collector started")

    monkeypatch.setattr(train, "collect", started)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    algo, mode = {"finished ppo": ("ppo", "both"), "sac both": ("sac", "both"),
                  "sac learner done": ("sac", "learn")}[run_of]
    (run_dir / "config.json").write_text(config_lib.dump(config_lib.build(dict(algo=algo, mode=mode, env="Pendulum-v1"))))
    (run_dir / "summary.json").write_text(json.dumps({"status": "complete"}))
    if mode == "learn":
        (run_dir / "learner_done").write_text(json.dumps({"iteration": 100}))
    before = files_under(run_dir)
    assert run("--config", "pendulum-sac", "--mode", "collect", "--run-dir", str(run_dir)) == 2
    line = one_error_line(capsys)
    assert words in line and str(run_dir) in line, line
    assert files_under(run_dir) == before and not (run_dir / "store").exists()


def test_store_entries_that_are_not_shards_are_strays_and_the_learner_says_so_once(tmp_path):
    """What a collector whose id held a '/' wrote (its shards nested in folders of their own) and
    a stray file are no shards: the store lists each once as a stray (never reads nor deletes
    it), and a learner that has held strays STRAY_S says so in one line, naming the store and
    what it sees, and whether it has received nothing meanwhile."""
    from jaxrl_mgpu.asynchronous import source
    store = Store(tmp_path)
    episode = {"observation": np.zeros((3, 2), np.float32), "action": np.zeros(3, np.int32),
               "reward": np.ones(3, np.float32), "terminated": True, "final_observation": np.zeros(2, np.float32)}
    good = store.write(Segments.whole([episode]), "c0", 0, "CartPole-v1")
    nested = store.write(Segments.whole([episode]), "a/b", 0, "CartPole-v1")  # what the old version wrote
    (store.root / "notes.txt").write_text("left by hand")
    assert [s.path for s in store.shards()] == [good]
    strays = store.strays()
    assert list(strays) == sorted([nested.parent.name, "notes.txt"])
    listing = store._listing
    assert store.shards() and store._listing is listing  # strays are not looked at again
    first = min(strays.values())
    assert source.stray_warning(store.root, strays, idle_s=0.0, now=first + source.STRAY_S - 1) is None
    line = source.stray_warning(store.root, strays, idle_s=45.0, now=first + source.STRAY_S)
    assert line.startswith("warning: the learner has received nothing for 45s, and its store ") and "\n" not in line
    assert f"{store.root} holds 2 entries that are not shards" in line
    assert f"{nested.parent.name}/, a folder without a shard's metadata.json, holding {nested.name}" in line
    fed = source.stray_warning(store.root, strays, idle_s=1.0, now=first + source.STRAY_S)
    assert fed.startswith(f"warning: the store {store.root} holds 2 entries")

    # The learner's source says it once, from its store's last listing.
    said = []
    learner = types.SimpleNamespace(store=store, received_at=time.monotonic() - 100, _said_strays=False,
                                    log=types.SimpleNamespace(print=said.append))
    source.StoreSource.say_strays(learner)  # strays first listed just now: not yet
    assert said == []
    store._listing = store._listing._replace(strays={n: t - source.STRAY_S for n, t in strays.items()})
    for _ in range(3):
        source.StoreSource.say_strays(learner)
    assert len(said) == 1 and "received nothing for 100s" in said[0]
    # Gone from the directory, gone from the listing.
    shutil.rmtree(nested.parent)
    (store.root / "notes.txt").unlink()
    assert [s.path for s in store.shards()] == [good] and store.strays() == {}


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
            return [Shard(Path(tmp_path / n), {"env_steps": 10}) for n in sorted(self.names)]

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

    # What collectors count as unread starts after the newest shard the reader has taken up,
    # and the reader takes up no more once its learner stops taking shards from it (max_ready
    # read): the store's unread shards then grow, and collectors pause.
    store.names = [f"s{i}" for i in range(6)]
    for n in store.names:
        (tmp_path / n).mkdir()
    idle = ShardReader(store, consumed=set(), refill=False, read=lambda s: s.path.name, max_ready=2)
    wait_until(lambda: idle.newest_taken == "s2", timeout=10)  # two ready, the third waiting for room
    time.sleep(0.3)
    assert idle.newest_taken == "s2" and idle.untaken_steps == 30  # s3-s5, as the learner logs them
    # taken up and not yet handed over (two ready, one read and waiting): on its way, for the
    # collectors' bound, with what the store holds unread
    assert idle.pipeline_steps == 30
    assert [s.path.name for s, _, _ in drain(idle, 6)] == store.names and idle.newest_taken == "s5"
    wait_until(lambda: idle.untaken_steps == 0, timeout=10)
    assert idle.pipeline_steps == 0
    idle.close()

    def broken(shard):
        raise ValueError("damaged shard")
    failing = ShardReader(store, consumed=set(), refill=False, read=broken)
    deadline = time.time() + 10
    with pytest.raises(ValueError, match="damaged"):
        while time.time() < deadline:
            failing.ready()
            time.sleep(0.01)
    failing.close()


@pytest.mark.slow
def test_learner_replay_stores_minatar_observations_as_bytes():
    """--mode learn with --replay-obs-dtype uint8: the learner's replay holds bytes, filled from
    the store's float32 transitions unchanged, and learns from them."""
    cfg = config_lib.validate(config_lib.build(dict(algo="dqn", mode="learn", env="Breakout-MinAtar", num_envs=2, num_steps=2,
        buffer_size=2 * async_ingest.BLOCK, replay_batch_size=8, hidden_size=8, updates_per_step=0.5,
        replay_obs_dtype="uint8")))
    par = parallel.setup("pmap", 2)
    learner = async_dqn.algorithm(resolved(cfg, par)).parts
    key = par.replicate(np.asarray(jax.random.PRNGKey(0)))
    replay, state = learner.init_replay(key), learner.init(key)
    rng = np.random.default_rng(0)
    n = 2 * async_ingest.BLOCK
    frames = lambda: (rng.random((n,) + learner.obs_shape) < 0.2).astype(np.float32)  # noqa: E731
    block = Transitions(frames(), rng.integers(0, 3, n).astype(np.int32), rng.normal(size=n).astype(np.float32),
                        np.ones(n, np.float32), frames())
    shaped = Transitions(*(x.reshape((2, async_ingest.BLOCK) + x.shape[1:]) for x in block))
    replay = learner.insert(replay, par.shard(shaped))
    assert replay.obs.dtype == replay.next_obs.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(par.local(replay.obs), np.float32).reshape(block.obs.shape), block.obs)
    state, losses = learner.learn(state, replay)
    assert np.isfinite(float(par.first(losses)["loss/td"]))



@pytest.mark.slow
def test_a_collector_without_a_learner_says_what_it_waits_for(tmp_path, capsys, monkeypatch):
    """No learner has published its params: the collector says so every WAITING_LOG_S (here
    shortened), instead of waiting in silence."""
    monkeypatch.setattr(replay_async, "WAITING_LOG_S", 0.5)
    cfg = config_lib.validate(config_lib.build(dict(algo="dqn", mode="collect", env="CartPole-v1", num_envs=2, num_steps=2,
        buffer_size=1024, learning_starts=0, run_dir=str(tmp_path / "run"))))
    par = parallel.setup("pmap", 2)
    looking = []  # when the collector's loop first asked whether to stop (its set-up compiles first)

    def stop() -> bool:
        looking.append(time.monotonic())
        return looking[-1] - looking[0] > 3.0

    total = async_dqn.ASYNCHRONOUS.collect(resolved(cfg, par), RunLog(None, 0), stop)
    out = capsys.readouterr().out
    assert total == 0
    waiting = [line for line in out.splitlines() if "still waiting for the learner's first params" in line]
    assert waiting and "--mode learn" in waiting[0]


def test_rate_limiter_semantics():
    cfg = config_lib.build(dict(algo="dqn", num_envs=8, updates_per_step=4, replay_batch_size=64, learning_starts=512))
    acme = 0.1 * 32 * 512  # Acme's error buffer, in samples: --samples-per-insert-tolerance x 32 x 512
    # ... at least the samples of what collectors may have on its way: --max-data-lag iterations'
    assert rate.Limiter(cfg, samples_per_iteration=256, min_inserts=512).buffer == 8 * 256 > acme
    cfg = dataclasses.replace(cfg, max_data_lag=4.0)
    limiter = rate.Limiter(cfg, samples_per_iteration=256, min_inserts=512)
    assert rate.samples_per_insert(cfg) == 32 == limiter.target  # --mode both's ratio: 4 x 64 / 8
    assert limiter.buffer == acme > 4 * 256
    assert limiter.iterations(0, 10_000, in_replay=500) == 0     # before --learning-starts
    # Counted from --learning-starts on, as --mode both counts: at the start, the buffer's worth
    # and one, not the samples that all 512 transitions would pay for (64 iterations).
    assert limiter.iterations(samples=0, inserted=512, in_replay=512) == int(limiter.buffer // 256) + 1 == 7
    # Ahead of the target by more than the buffer: wait; at the buffer's edge, one more.
    paid = 32 * (1000 - 512)
    assert limiter.iterations(samples=paid + 1639, inserted=1000, in_replay=1000) == 0  # buffer: 1638.4
    assert limiter.iterations(samples=paid + 1638, inserted=1000, in_replay=1000) == 1
    # Behind: as many iterations as bring it up to the buffer's edge.
    assert limiter.iterations(samples=0, inserted=1000, in_replay=1000) == int((paid + limiter.buffer) // 256) + 1
    assert limiter.achieved(samples=paid, inserted=1000) == 32 and limiter.achieved(0, 512) is None
    # Collectors: back-pressured while the learner has inserted more than its samples pay for
    # beyond the buffer, or while more is on its way to it than --max-data-lag iterations' worth
    # (at least two of its largest shards).
    assert limiter.max_in_flight == 4 * 256 / 32                  # --max-data-lag 4 of 8 transitions an iteration
    assert limiter.in_flight_bound(largest_shard=8) == 32 and limiter.in_flight_bound(100) == 200
    # ... plus what the learner's ingest may hold back until more arrives (a partial block)
    assert rate.Limiter(cfg, 256, 512, min_in_flight=256).in_flight_bound(100) == 456
    samples = 32 * (10_000 - 512)
    progress = {"samples_per_insert": 32, "error_buffer": limiter.buffer, "learning_starts": 512,
                "samples": samples, "inserted": 10_000, "pipeline": 0, "max_in_flight": 1024}
    edge = 10_000 + int(limiter.buffer / 32)
    assert rate.hold_back({**progress, "inserted": edge}, 0, 256, 512) is None
    assert rate.hold_back({**progress, "inserted": edge + 1}, 0, 256, 512) == rate.SAMPLES
    # in flight: written and unread, plus what the learner has taken up and not inserted
    assert rate.hold_back(progress, in_flight=1024, shard_steps=256, learning_starts=512) is None
    assert rate.hold_back(progress, in_flight=1025, shard_steps=256, learning_starts=512) == rate.READING
    assert rate.hold_back({**progress, "pipeline": 600}, in_flight=425, shard_steps=256,
                          learning_starts=512) == rate.READING
    # No learner yet: the store fills up to what learning starts with, plus a few shards, no more.
    assert rate.hold_back(None, in_flight=512 + 4 * 256, shard_steps=256, learning_starts=512) is None
    assert rate.hold_back(None, in_flight=512 + 4 * 256 + 1, shard_steps=256, learning_starts=512) == rate.START


def test_ingest_is_bounded_and_in_large_blocks():
    def transitions(n):
        return Transitions(np.zeros((n, 2), np.float32), np.arange(n, dtype=np.int32), np.zeros(n, np.float32),
                           np.ones(n, np.float32), np.zeros((n, 2), np.float32))

    big = async_ingest.LARGE_BLOCK
    shard = transitions(5 * big + 300)
    blocks, rest = async_ingest._host_blocks([shard, transitions(10)], devices=2, budget=async_ingest.INSERT_BUDGET)
    sizes = [len(b.reward) for b in blocks]
    assert sum(sizes) <= async_ingest.INSERT_BUDGET * 2 and set(sizes) <= {2 * big, 2 * async_ingest.BLOCK}
    assert sizes[0] == 2 * big
    # Order is kept and nothing is lost: the blocks and the rest are the queue, in order.
    actions = np.concatenate([b.action for b in blocks] + [r.action for r in rest])
    np.testing.assert_array_equal(actions, np.concatenate([np.arange(5 * big + 300), np.arange(10)]))
    # A block within one queued array is a view of it (a new shard is not copied whole).
    assert np.shares_memory(blocks[0].obs, shard.obs)
    # A block across queued arrays joins them, in order; small leftovers wait for more.
    small = async_ingest.BLOCK
    blocks, rest = async_ingest._host_blocks([transitions(small - 10), transitions(30)], devices=1, budget=4 * small)
    assert [len(b.reward) for b in blocks] == [small] and [len(r.reward) for r in rest] == [20]
    np.testing.assert_array_equal(blocks[0].action, np.concatenate([np.arange(small - 10), np.arange(10)]))
    np.testing.assert_array_equal(rest[0].action, np.arange(10, 30))
    blocks, rest = async_ingest._host_blocks([transitions(small - 1)], devices=1, budget=4 * small)
    assert blocks == [] and [len(r.reward) for r in rest] == [small - 1]


def test_ingest_uses_its_whole_budget_each_step_keeps_order_and_bounds_its_queue():
    """The learner's ingest: while a chunk runs it starts copying all it holds to the devices;
    between chunks it inserts a whole budget of the copies that arrived (with a checkpoint per
    chunk, and less inserted per chunk, a 3-collector queue once grew to 700k transitions,
    H200); order is kept; and it stops taking shards past QUEUE_STEPS budgets."""
    def transitions(start, n):
        return Transitions(np.zeros((n, 2), np.float32), np.arange(start, start + n, dtype=np.int32),
                           np.zeros(n, np.float32), np.ones(n, np.float32), np.zeros((n, 2), np.float32))

    inserted = []
    ingest = async_ingest.Ingest(2, to_devices=lambda block: block, insert=lambda block: inserted.append(block.action))
    budget = async_ingest.INSERT_BUDGET * 2  # transitions, both devices
    shard = 3 * budget // 2
    added = 0
    while ingest.has_room:
        ingest.add(transitions(added, shard), tag=f"shard {added // shard}")
        added += shard
    assert added == 2 * shard  # QUEUE_STEPS = 2 budgets, taken a shard at a time
    ingest.stage()  # (while a chunk runs) every whole block's copy starts
    assert ingest.copying == added == ingest.queued and ingest.landed == []
    wait_until(lambda: all(f.done() for _, f in ingest.copies), timeout=10)
    for _ in range(3):
        assert ingest.insert_arrived() == budget  # (between chunks) a budget of the copies goes in
    assert ingest.queued == 0 and ingest.has_room
    # Each add's tag came back with its transitions as they went in (the learner's lag at insert).
    assert ingest.landed == [(budget, "shard 0"), (shard - budget, "shard 0"), (2 * budget - shard, "shard 1"),
                             (budget, "shard 1")]
    # Nothing goes in before its copy has arrived; then all of it, at the next insert.
    ingest.landed, block = [], 2 * async_ingest.LARGE_BLOCK
    ingest.add(transitions(added, block), tag="next")
    assert ingest.insert_arrived() == 0 and ingest.landed == []
    ingest.stage()
    wait_until(lambda: all(f.done() for _, f in ingest.copies), timeout=10)
    assert ingest.insert_arrived() == block and ingest.queued == 0 and ingest.landed == [(block, "next")]
    ingest.close()
    np.testing.assert_array_equal(np.concatenate(inserted), np.arange(added + block))  # all of it, in order


@pytest.mark.slow
def test_ten_collectors_started_before_the_learner_do_not_flood_it(tmp_path):
    """Ten collectors (acting at random until the first checkpoint) against one learner: the
    store they fill before it starts stays bounded, the learner keeps its samples per insert,
    and no complete shard is lost (every shard was either taken by the learner or is still in
    the store)."""
    run_dir = tmp_path / "run"
    store = Store(run_dir)
    # 8 envs x 16 steps: 128 transitions a shard; the learner needs twice what the store holds
    # before it starts, so that it receives shards written after the collectors' waits
    args = ["--shard-steps", "16", "--total-timesteps", "2400"]
    collectors = [spawn(*args, "--mode", "collect", "--run-dir", str(run_dir), "--collector-id", f"c{i}",
                        "--collect-before-checkpoint", "random") for i in range(10)]
    wait_until(lambda: store.unread_steps(None) >= 512, timeout=300)
    time.sleep(5)  # they keep running, and must stop at the bound
    before = store.unread_steps(None)
    # + one shard each in flight past its last check (a shard's transitions vary around 128 with
    # the lookahead steps it repeats or leaves: each collector's largest)
    largest = {}
    for shard in store.shards():
        who = shard.meta["collector"]
        largest[who] = max(largest.get(who, 0), shard.meta["env_steps"])
    assert before <= 512 + rate.START_SHARDS * 128 + sum(largest.values()), (before, largest)
    learner = spawn(*args, "--mode", "learn", "--run-dir", str(run_dir))
    out, _ = learner.communicate(timeout=400)
    assert learner.returncode == 0, out
    outs = []
    for c in collectors:
        c_out, _ = c.communicate(timeout=120)
        assert c.returncode == 0, c_out
        outs.append(c_out)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["update"] == 300
    assert last["async/samples_per_insert"] <= most_samples_per_insert(last["async/inserted"])
    # They waited for the learner to start, and their waits add up by reason.
    assert sum(r["async/collector_wait_s/start"] for r in rows) > 0
    for r in rows:
        assert r["async/collector_wait_s"] == pytest.approx(
            sum(r[f"async/collector_wait_s/{why}"] for why in rate.HOLD_REASONS))
    # Nothing lost: what each collector wrote is what the learner received from it plus its
    # shards still in the store that the learner never took.
    taken, unread = consumed_by_collector(run_dir)
    for i, c_out in enumerate(outs):
        written = int(re.search(r"collector done: ([0-9,]+) env steps written", c_out).group(1).replace(",", ""))
        assert last.get(f"async/env_steps_received/c{i}", 0) == taken.get(f"c{i}", 0)
        assert taken.get(f"c{i}", 0) + unread.get(f"c{i}", 0) == written, (i, c_out[-500:])


def test_store_listing_follows_the_directory_oldest_first(tmp_path):
    """Store.shards keeps its last listing while the directory's names are unchanged (each
    shard's metadata read once, its first-listed time kept), and follows additions, also one
    that lands out of order, and removals; unread_steps counts the shards after a name."""
    store = Store(tmp_path)

    def add(i, steps):
        path = store.root / f"{i:020d}-c-x"
        path.mkdir(parents=True)
        (path / "metadata.json").write_text(json.dumps({"env_steps": steps, "episodes": 1}))
        return path.name

    names = [add(i, 10 * i) for i in (1, 2, 4)]
    (store.root / ".staging-partial").mkdir()  # hidden: never listed
    first = store.shards()
    assert [s.path.name for s in first] == names and all(s.listed is not None for s in first)
    assert store.shards() == first  # unchanged: the same entries, the same first-listed times
    late = add(3, 30)  # a writer that finished after a later-started one
    shutil.rmtree(store.root / names[0])
    listed = store.shards()
    assert [s.path.name for s in listed] == [names[1], late, names[2]]
    assert listed[0] == first[1]  # its entry kept, not re-read
    assert store.unread_steps(None) == 20 + 30 + 40 and store.unread_steps(late) == 40
    assert store.unread_steps(names[2]) == 0 and store.unread_steps(names[0]) == 90


def test_eviction_deletes_only_consumed_shards_oldest_first(tmp_path, monkeypatch):
    """The learner evicts beyond --store-max-episodes, but never a shard it has not read: a
    complete shard is never lost (the rate limiter bounds how many wait unread)."""
    from jaxrl_mgpu.asynchronous.checkpoints import CheckpointPublisher
    from jaxrl_mgpu.asynchronous.ledger import Ledger
    store = Store(tmp_path)
    episode = {"observation": np.zeros((3, 2), np.float32), "action": np.zeros(3, np.int32),
               "reward": np.ones(3, np.float32), "terminated": True, "final_observation": np.zeros(2, np.float32)}
    # 2 episodes each
    names = [store.write(Segments.whole([episode] * 2), "c0", 0, "CartPole-v1").name for _ in range(5)]
    ledger = Ledger.fresh(replay_async.COUNTS)
    ledger.consumed = set(names[:3])
    cfg = config_lib.build(dict(algo="dqn", mode="learn", store_max_episodes=6))
    publisher = CheckpointPublisher(cfg, None, None, {}, store)
    monkeypatch.setattr(publisher, "publish", lambda *a: None)
    evicted = publisher.publish_and_evict(1, None, ledger)
    # 10 episodes, 4 of them unread: the consumed ones may keep 6 - 4 = 2, the newest consumed shard.
    assert [s.path.name for s in store.shards()] == names[2:] and evicted == set(names[:2])
    ledger.consumed = set()  # a learner restarted before reading any: nothing may go
    publisher.cfg = dataclasses.replace(cfg, store_max_episodes=1)
    assert publisher.publish_and_evict(2, None, ledger) == set()
    assert [s.path.name for s in store.shards()] == names[2:]
    # A shard of an unfinished episode's segment ends none, and counts one all the same: with
    # episodes that rarely end, the store stays bounded.
    piece = Segments(np.zeros((4, 2), np.float32), np.zeros(4, np.int32), np.zeros(4, np.float32), np.array([4]),
                     np.array([True]), np.array([False]), np.array([False]), np.array([2]),
                     np.zeros((1, 2), np.float32), np.zeros(1, np.float32), np.zeros(1, np.int64))
    pieces = [store.write(piece, "c1", 0, "CartPole-v1") for _ in range(3)]
    shards = [s for s in store.shards() if s.path in pieces]
    assert [s.meta["episodes"] for s in shards] == [0, 0, 0] and shards[0].meta["env_steps"] == 2
    assert [s.path for s in store.evict(shards, max_episodes=1)] == pieces[2:]


@pytest.mark.slow
def test_shards_decoded_by_worker_processes_equal_the_thread_read_in_order_and_errors_come_back(tmp_path):
    """The DQN learner decodes shards in child processes (workers.Pool): the same transitions as
    a read on the thread, delivered oldest first by several workers at once; a damaged shard's
    error is raised in the parent; a dead child is an error, not a hang."""
    from jaxrl_mgpu.algos.replay_async import read_transitions
    from jaxrl_mgpu.asynchronous.reader import ShardReader
    from jaxrl_mgpu.asynchronous.workers import Pool, WorkerError
    from jaxrl_mgpu.data.rlds import DatasetError
    store = Store(tmp_path)
    rng = np.random.default_rng(0)
    episodes = [{"observation": rng.random((n, 3)).astype(np.float32), "action": np.arange(n, dtype=np.int32),
                 "reward": rng.random(n).astype(np.float32), "terminated": n % 2 == 0,
                 "final_observation": rng.random(3).astype(np.float32)} for n in (4, 1, 6)]
    for i in range(5):  # shards of 3, 2, 1, 3, 2 episodes
        store.write(Segments.whole(episodes[:3 - i % 3]), f"c{i}", 0, "CartPole-v1")
    shards = store.shards()
    expected = [read_transitions(s) for s in shards]
    np.testing.assert_array_equal(expected[0].next_obs[:4], np.concatenate([episodes[0]["observation"][1:],
                                                                            episodes[0]["final_observation"][None]]))
    np.testing.assert_array_equal(expected[0].discount, [1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0])

    reader = ShardReader(store, consumed=set(), refill=False, read=None, decode=read_transitions, workers=3)
    got, deadline = [], time.time() + 60
    while len(got) < 5 and time.time() < deadline:
        got += reader.ready()
        time.sleep(0.01)
    reader.close()
    assert [s.path.name for s, _, _ in got] == [s.path.name for s in shards]
    for (_, _, data), want in zip(got, expected):
        for a, b in zip(data, want):
            np.testing.assert_array_equal(a, b)

    pool = Pool(read_transitions, 2)
    try:
        damaged = store.write(Segments.whole(episodes), "c9", 0, "CartPole-v1")
        record = next(p for p in damaged.rglob("*array_record*"))
        record.write_bytes(record.read_bytes()[:-20])
        broken = next(s for s in store.shards() if s.path == damaged)
        assert not pool.oldest_answered  # nothing in flight
        pool.submit(shards[0], 0)
        pool.submit(broken, 1)
        wait_until(lambda: pool.oldest_answered)  # the collector receives its shards once written
        assert pool.full and pool.receive()[0] == 0
        with pytest.raises(DatasetError):
            pool.receive()
        pool.submit(shards[1], 2)
        tag, data = pool.receive()  # the pool goes on after an error
        assert tag == 2 and np.array_equal(data.obs, expected[1].obs)
        pool._workers[1]._proc.kill()
        pool._workers[1]._proc.wait()
        with pytest.raises(WorkerError, match="worker process stopped"):
            pool.submit(shards[0])  # the dead one is next in turn
            pool.receive()
    finally:
        pool.close()


@pytest.mark.slow
def test_collector_segments_give_each_step_once_with_mode_boths_n_step_targets(tmp_path):
    """A collector writes every environment's steps once a rollout ends (episodes in segments),
    not once their episode ends. Decoded with the learner's --n-step, the shards give every step
    exactly once, as soon as its n-step window is complete, with --mode both's reward, discount
    and next observation (only an episode's end cuts a window, a time limit bootstrapping from
    the final observation); and each ended episode's return and length, once."""
    import jax.numpy as jnp
    from jaxrl_mgpu.algos.replay import Replay, n_step_return
    from jaxrl_mgpu.algos.replay_async import read_transitions
    rng = np.random.default_rng(1)
    T, E, n_step, gamma = 7, 4, 3, 0.9
    par = types.SimpleNamespace(local=lambda tree: tree)  # one device's rollout, already on the host
    store, open_, R = Store(tmp_path), {}, 6
    # observations numbered in step order (unique ids); the one after the last rollout's end too
    stream = np.arange((R * T + 1) * E, dtype=np.float32).reshape(R * T + 1, E, 1) + np.zeros((1, 1, 2), np.float32)
    seen = {k: [] for k in ("obs", "action", "reward", "terminated", "truncated", "final")}
    ep_return, ep_length, ended = np.zeros(E, np.float32), np.zeros(E, np.int32), []
    for rollout in range(R):
        obs = stream[rollout * T:(rollout + 1) * T]
        terminated, truncated = rng.random((T, E)) < 0.15, rng.random((T, E)) < 0.05
        if rollout in (1, 2):
            terminated[:, 2] = truncated[:, 2] = False  # an episode across three rollouts
        if rollout == 3:  # an episode ending at a rollout's last step, and one left with fewer steps than the lookahead
            terminated[:, 0], truncated[:, 0], terminated[-1, 0] = False, False, True
            terminated[:, 1], truncated[:, 1], terminated[-2, 1] = False, False, True
        truncated &= ~terminated
        action, reward = rng.integers(0, 3, (T, E)), rng.random((T, E)).astype(np.float32)
        # the observation after each step: the next one, or where an episode ended, its own final one
        final = np.where((terminated | truncated)[..., None], obs + 0.5, stream[rollout * T + 1:(rollout + 1) * T + 1])
        done_return, done_length = np.zeros((T, E), np.float32), np.zeros((T, E), np.int32)
        for t in range(T):  # as vec.step counts episodes
            ep_return += reward[t]
            ep_length += 1
            done = terminated[t] | truncated[t]
            done_return[t], done_length[t] = np.where(done, ep_return, 0), np.where(done, ep_length, 0)
            ended += [(float(ep_return[e]), int(ep_length[e])) for e in np.flatnonzero(done)]
            ep_return[done], ep_length[done] = 0, 0
        traj = tuple(x[None] for x in (obs, action, reward, terminated, truncated, final, done_return, done_length))
        segments = replay_async._segments(par, traj, open_, n_step - 1)
        if segments is not None:
            store.write(segments, "c0", rollout, "CartPole-v1")
        for k, x in zip(seen, (obs, action, reward, terminated, truncated, final)):
            seen[k].append(x)
        assert all(len(o.steps[0]) <= n_step - 1 for o in open_.values() if o.steps)
    # The reference: each environment's steps as one row of --mode both's replay, padded with
    # n_step steps not taken yet: a window is complete where it does not reach them
    pad = lambda x: np.concatenate([x, np.zeros((n_step,) + x.shape[1:], x.dtype)])  # noqa: E731
    obs, action, reward, terminated, truncated, final = (pad(np.concatenate(x)).swapaxes(0, 1) for x in seen.values())
    N = obs.shape[1] - n_step
    replay = Replay(*(jnp.asarray(x) for x in (obs, action, reward, terminated, truncated, final)))
    env, row = np.repeat(np.arange(E), N), np.tile(np.arange(N), E)
    want_reward, want_discount, last = (np.asarray(x) for x in n_step_return(replay, jnp.asarray(env),
                                                                             jnp.asarray(row), n_step, gamma))
    window_end = row + last
    complete = window_end < N
    got = [read_transitions(s, n_step=n_step, gamma=gamma) for s in store.shards()]
    got = Transitions(*(np.concatenate(x) for x in zip(*got)))
    order = np.argsort(got.obs[:, 0])
    want_ids = np.sort(obs[env[complete], row[complete], 0])
    np.testing.assert_array_equal(got.obs[order, 0], want_ids)  # every complete step once
    by_id = np.argsort(obs[env, row, 0][complete])
    np.testing.assert_allclose(got.reward[order], want_reward[complete][by_id], rtol=1e-6)
    np.testing.assert_allclose(got.discount[order], want_discount[complete][by_id], rtol=1e-6)
    np.testing.assert_array_equal(got.next_obs[order], final[env, window_end][complete][by_id])
    np.testing.assert_array_equal(got.action[order], action[env, row][complete][by_id])
    assert (~complete).sum() <= E * (n_step - 1)  # only the unfinished episodes' last steps wait
    metas = [s.meta for s in store.shards()]
    assert sum(m["episodes"] for m in metas) == len(ended)
    assert sum(m["episode_steps"] for m in metas) == sum(n for _, n in ended)
    np.testing.assert_allclose(sum(m["return_sum"] for m in metas), sum(r for r, _ in ended), rtol=1e-5)
    assert sum(m["env_steps"] for m in metas) == complete.sum()


@pytest.mark.slow
def test_learner_transitions_are_the_n_step_transitions_of_mode_both(tmp_path):
    """--mode learn trains on what --mode both's replay samples: a shard's episodes decoded with
    --n-step and --gamma give, from every step, replay.n_step_return's reward, bootstrap discount
    and next observation (windows cut at episode ends, time limits bootstrapping from the final
    observation, terminations not at all)."""
    import jax.numpy as jnp
    from jaxrl_mgpu.algos.replay import Replay, n_step_return
    from jaxrl_mgpu.algos.replay_async import read_transitions
    rng = np.random.default_rng(2)
    episodes = [{"observation": rng.random((n, 2)).astype(np.float32), "action": rng.integers(0, 3, n),
                 "reward": rng.random(n).astype(np.float32), "terminated": term,
                 "final_observation": rng.random(2).astype(np.float32)}
                for n, term in ((5, True), (1, False), (7, False), (1, True), (4, True))]
    store = Store(tmp_path)
    store.write(Segments.whole(episodes), "c0", 0, "CartPole-v1")
    shard = store.shards()[0]
    n_step, gamma = 3, 0.9
    got = read_transitions(shard, n_step=n_step, gamma=gamma)
    # --mode both's replay of the same steps, one environment, one row per step
    flat = Segments.whole(episodes)
    N = len(flat.reward)
    is_last = np.zeros(N, bool)
    is_last[np.cumsum(flat.length) - 1] = True
    terminated = is_last.copy()
    terminated[is_last] = flat.terminated
    next_obs = np.concatenate([flat.observation[1:], flat.observation[:1]])
    next_obs[is_last] = flat.final_observation
    replay = Replay(jnp.asarray(flat.observation)[None], jnp.asarray(flat.action)[None],
                    jnp.asarray(flat.reward)[None], jnp.asarray(terminated)[None],
                    jnp.asarray(is_last & ~terminated)[None], jnp.asarray(next_obs)[None])
    rows = jnp.arange(N - n_step + 1)  # the windows --mode both can sample: wholly written
    reward, discount, last = n_step_return(replay, jnp.zeros_like(rows), rows, n_step, gamma)
    np.testing.assert_allclose(got.reward[:len(rows)], reward, rtol=1e-6)
    np.testing.assert_allclose(got.discount[:len(rows)], discount, rtol=1e-6)
    np.testing.assert_array_equal(got.next_obs[:len(rows)], next_obs[rows + last])
    np.testing.assert_array_equal(got.obs, flat.observation)
    # the last steps: cut by their episode's end, which --mode both would see once written
    np.testing.assert_allclose(got.reward[-1], flat.reward[-1])
    assert got.discount[-1] == 0 and np.array_equal(got.next_obs[-1], flat.final_observation[-1])
    one = read_transitions(shard)  # defaults: one-step transitions, 0 where the episode terminated
    np.testing.assert_array_equal(one.reward, flat.reward)
    np.testing.assert_array_equal(one.discount, ~terminated)
    np.testing.assert_array_equal(one.next_obs, next_obs)


@pytest.mark.slow
def test_collector_and_learner_stop_cleanly_when_their_process_group_is_signalled(tmp_path):
    """Ctrl-C, `timeout` and schedulers signal the whole process group, shard workers included:
    the collector still finishes the shards it handed to its writers and exits 0, and the
    learner (with its decoders) stops with a checkpoint, as when only they are signalled."""
    import subprocess
    import sys
    run_dir = tmp_path / "run"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    spawn_group = lambda *argv: subprocess.Popen(  # noqa: E731
        [sys.executable, "-m", "jaxrl_mgpu.train", *DQN, "--run-dir", str(run_dir), *argv], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    learner = spawn_group("--mode", "learn", "--total-timesteps", str(8 * 100_000), "--store-workers", "2")
    collector = spawn_group("--mode", "collect", "--collector-id", "c0", "--store-workers", "2")
    wait_until(lambda: (run_dir / "metrics.jsonl").exists() and len(Store(run_dir).shards()) >= 3, timeout=300)
    for p in (collector, learner):
        os.killpg(p.pid, signal.SIGTERM)
    outs = [p.communicate(timeout=120)[0] for p in (collector, learner)]
    for p, out in zip((collector, learner), outs):
        assert p.returncode == 0 and "Traceback" not in out, out[-2000:]
    written = int(re.search(r"collector done: ([0-9,]+) env steps written", outs[0]).group(1).replace(",", ""))
    assert written == sum(s.meta["env_steps"] for s in Store(run_dir).shards() if s.meta["collector"] == "c0")
    ckpts = Checkpoints(run_dir, read_only=True)
    assert ckpts.latest_step() is not None
    ckpts.close()



def test_params_published_for_collectors_are_read_once_each_and_exactly(tmp_path, monkeypatch):
    """The learner's params reach the collectors through policy.msgpack: what a follower reads
    is what was offered (its iteration and env-step count too), and it reads each publication
    once; a publication within PUBLISH_S of the last is skipped unless forced."""
    monkeypatch.setattr(policy, "PUBLISH_S", 60.0)  # the second offer below is always within it
    par = parallel.setup("pmap", 2)
    params = {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}}
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    publisher, follower = policy.ParamsPublisher(tmp_path), policy.ParamsFollower(tmp_path, template)
    assert follower.newer() is None  # nothing published yet
    before = time.time()
    publisher.offer(3, par.replicate(params), 1000, force=True)
    publisher.wait()
    got, iteration, received, published = follower.newer()
    assert (iteration, received) == (3, 1000) and before <= published <= time.time()
    jax.tree.map(np.testing.assert_array_equal, got, params)
    assert follower.newer() is None  # the same publication is not read twice
    doubled = jax.tree.map(lambda x: 2 * x, params)
    publisher.offer(4, par.replicate(doubled), 2000)  # within PUBLISH_S of the last: skipped
    publisher.wait()
    assert follower.newer() is None
    publisher.offer(5, par.replicate(doubled), 3000, force=True)
    publisher.close()
    got, iteration, received, _ = follower.newer()
    assert (iteration, received) == (5, 3000)
    jax.tree.map(np.testing.assert_array_equal, got, doubled)
    assert not [p for p in tmp_path.iterdir() if p.name != policy.POLICY]  # no temporary file left
