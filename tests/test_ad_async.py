"""Algorithm Distillation on a growing store: the fixed-capacity history buffer, and one
learner with history collectors that come and go (real processes)."""

import json
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import rows, spawn_train, wait_until
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import train
from jaxrl_mgpu.tools import incontext
from jaxrl_mgpu.algos.ad import asynchronous as async_ad
from jaxrl_mgpu.algos.ad import ad
from jaxrl_mgpu.asynchronous.store import Store

AD = ["--algo", "ad", "--env", "DarkRoom", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
      "--n-transit", "20", "--ad-batch-size", "8", "--num-updates", "40", "--log-every", "10",
      "--checkpoint-every", "10", "--ad-history-steps", "60", "--ad-history-tasks", "4",
      "--store-max-episodes", "60", "--samples-per-insert", "6.4"]


def history(mark: int, length: int = 6) -> ad.Steps:
    """One prepared history whose every action is `mark` (so a sample tells its slot)."""
    return ad.Steps(obs=jnp.full((length, 3), float(mark)), prev_action=jnp.zeros(length, jnp.int32),
                    prev_reward=jnp.zeros(length), is_first=jnp.arange(length) == 0,
                    action=jnp.full(length, mark, jnp.int32))


def test_buffer_inserts_into_a_ring_and_samples_only_filled_slots():
    buffer = async_ad.new_buffer(history(0), 3)
    insert = jax.jit(async_ad.insert)
    sample = jax.jit(lambda b, k: ad.sample(b.steps, k, 256, 4, async_ad.filled(b)))
    buffer = insert(buffer, history(1), jnp.bool_(True))
    buffer = insert(buffer, history(9), jnp.bool_(False))  # no history for this device: nothing changes
    assert int(async_ad.filled(buffer)) == 1
    assert set(np.unique(sample(buffer, jax.random.PRNGKey(0)).action)) == {1}  # never the empty slots' 0
    buffer = insert(buffer, history(2), jnp.bool_(True))
    assert set(np.unique(sample(buffer, jax.random.PRNGKey(1)).action)) == {1, 2}
    for mark in (3, 4):  # the ring is full after 3; 4 overwrites the oldest (1)
        buffer = insert(buffer, history(mark), jnp.bool_(True))
    assert int(async_ad.filled(buffer)) == 3 and int(buffer.written) == 4
    np.testing.assert_array_equal(buffer.steps.action[:, 0], [4, 2, 3])
    assert set(np.unique(sample(buffer, jax.random.PRNGKey(2)).action)) == {2, 3, 4}


def spawn(*argv, devices=1):
    return spawn_train([*AD, *argv], devices)


@pytest.mark.slow
def test_ad_learner_with_history_collectors_one_killed_and_a_restart(tmp_path):
    run_dir = tmp_path / "run"
    store = Store(run_dir)
    # Preempted long before the end of its first run (one chunk stays in flight, so it stops
    # a chunk or two after the signal); the restart finishes the run at 40 updates. With data
    # arriving fast, three chunks could run before the signal took effect, and the restart then
    # had nothing to do: --stop-at-update 20 stops it there at the latest.
    learner = spawn("--mode", "learn", "--run-dir", str(run_dir), "--num-updates", "1000", "--stop-at-update", "20",
                    devices=2)
    wait_until(lambda: (run_dir / "checkpoints").is_dir())  # collectors start after the learner
    c1 = spawn("--mode", "collect", "--run-dir", str(run_dir), "--collector-id", "c1")
    c2 = spawn("--mode", "collect", "--run-dir", str(run_dir), "--collector-id", "c2")
    wait_until(lambda: any(s.meta["collector"] == "c2" for s in store.shards()))
    c2.send_signal(signal.SIGKILL)  # killed midway: possibly mid-shard
    c2.wait()
    wait_until(lambda: len(rows(run_dir)) >= 1)
    learner.send_signal(signal.SIGTERM)  # preempted: saves and exits 0
    out, _ = learner.communicate(timeout=60)
    assert learner.returncode == 0, out
    assert "waiting for learning histories" in out
    learner = spawn("--mode", "learn", "--run-dir", str(run_dir), "--resume", "--num-updates", "40", devices=2)
    out, _ = learner.communicate(timeout=120)
    assert learner.returncode == 0, out
    assert "resumed the learner" in out
    c1_out, _ = c1.communicate(timeout=60)  # stops by itself when the learner is done
    assert c1.returncode == 0, c1_out

    log = rows(run_dir)
    updates = [r["update"] for r in log]
    assert updates == sorted(set(updates)) and updates[-1] == 40, "no update logged twice, all done"
    received = [r["async/tasks_received"] for r in log]
    assert received == sorted(received) and received[-1] > received[0], "histories kept arriving"
    last = log[-1]
    assert last["async/tasks_received/c1"] > 0 and last["async/tasks_received/c2"] > 0
    assert last["async/env_steps_received"] == 60 * last["async/tasks_received"]
    assert last["async/env_steps_received"] == last["async/env_steps_received/c1"] + \
        last["async/env_steps_received/c2"]
    # The rate limiter held: 6.4 window steps sampled per history step received (0.04 updates of
    # 8 windows x 20 steps) after the first history of each of 2 devices (120 steps), within its
    # error buffer (0.1 x 6.4 x 120 samples, at least --max-data-lag 8 updates of 160 samples)
    # and one update.
    buffer = max(0.1 * 6.4 * 120, 8 * 160)
    assert 0 < last["async/samples_per_insert"] <= 6.4 + (buffer + 160) / (last["async/inserted"] - 120)
    assert last["async/samples_per_insert_target"] == 6.4
    assert last["async/dropped_histories"] == 0
    assert 2 <= last["async/buffer_histories"] <= 20  # a device's buffer holds 60 episodes / 3 / 2 histories
    assert all(np.isfinite(r["loss/cross_entropy"]) for r in log)
    # Every listed shard is complete (checksums verified on read); a shard the killed collector
    # was writing stays in a hidden staging directory that is never listed.
    for shard in store.shards():
        assert not shard.path.name.startswith(".") and shard.meta["algo"] == "tabular-q-ucb"
    cfg = config_lib.from_dict(json.loads((run_dir / "config.json").read_text()))
    meta, h = async_ad.store_histories(cfg, run_dir)
    assert h.num_steps == 60 and meta["split"] == "train"
    # The learner's checkpoints are what in-context evaluation reads.
    assert incontext.evaluate(["--run-dir", str(run_dir), "--in-context", "--episodes", "2",
                               "--envs-per-goal", "1"]) == 0
    assert (run_dir / "incontext-test.json").is_file()


@pytest.mark.parametrize("argv, words", [
    (["--mode", "learn", "--env", "CartPole-v1"], "--env DarkRoom or DarkRoomHard"),
    (["--mode", "learn", "--dataset", "/tmp/x-never"], "--dataset is only for --algo ad with --mode both"),
    (["--mode", "collect", "--ad-history-steps", "30"], "multiple of the DarkRoom episode length 20"),
    (["--mode", "learn", "--store-max-episodes", "2"], "every device needs room for one"),
    (["--mode", "learn", "--store-workers", "2"], "--store-workers is only for --algo dqn, sac or td3 with --mode learn or collect"),
    (["--mode", "collect", "--shard-steps", "8"], "--shard-steps is only for --algo dqn, sac or td3 with --mode learn or collect"),
])
def test_async_ad_bad_options_are_one_line_errors(tmp_path, capsys, argv, words):
    run_dir = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        train.main([*AD, "--run-dir", str(run_dir), *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not run_dir.exists()
