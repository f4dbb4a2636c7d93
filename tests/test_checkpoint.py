"""Checkpoints: exact resume, crash safety, other device counts, evaluation, bad input."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import NamedTuple

import jax
import numpy as np
import pytest

from jaxrl_mgpu import evaluate
from jaxrl_mgpu.checkpoint import DELETED, REPLICATED, Checkpoints
from jaxrl_mgpu.parallel import setup

from helpers import run

# 16 envs x 16 steps, 8 updates in chunks of 2; small enough to compile and run in seconds.
TINY = ["--num-envs", "16", "--num-steps", "16", "--num-minibatches", "2", "--hidden-size", "16",
        "--total-timesteps", str(16 * 16 * 8), "--log-every", "2", "--checkpoint-every", "2"]


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(row):
    return {k: v for k, v in row.items() if k not in ("sps", "time")}


def saved_params(run_dir, step=None):
    return evaluate.load_params(str(run_dir), step)


def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run(*TINY, "--run-dir", str(straight)) == 0
    assert run(*TINY, "--run-dir", str(resumed), "--stop-at-update", "4") == 0
    assert saved_params(resumed)[0] == 4
    assert run(*TINY, "--run-dir", str(resumed), "--resume") == 0

    step_a, params_a = saved_params(straight)
    step_b, params_b = saved_params(resumed)
    assert step_a == step_b == 8
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)  # bitwise on CPU
    a, b = rows(straight), rows(resumed)
    assert [r["update"] for r in a] == [r["update"] for r in b] == [2, 4, 6, 8]
    assert [without_timing(r) for r in a] == [without_timing(r) for r in b]


def test_checkpoints_move_between_device_counts(tmp_path, capsys):
    on8, on1 = tmp_path / "on8", tmp_path / "on1"
    assert run(*TINY, "--run-dir", str(on8), "--stop-at-update", "4") == 0
    _, params8 = saved_params(on8)
    # evaluation on 1 and 2 devices
    for devices in ("1", "2"):
        capsys.readouterr()
        assert evaluate.main(["--run-dir", str(on8), "--episodes", "6", "--devices", devices]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert result["episodes"] == 6 and result["step"] == 4 and result["mean_return"] > 0
    # continued training on 2 devices: the same global envs are split 2 ways instead of 8
    assert run(*TINY, "--run-dir", str(on8), "--resume", "--devices", "2", "--stop-at-update", "6") == 0
    assert "re-created" not in capsys.readouterr().out
    # the reverse: written on 1 device, continued on 8
    assert run(*TINY, "--run-dir", str(on1), "--devices", "1", "--stop-at-update", "4") == 0
    assert run(*TINY, "--run-dir", str(on1), "--resume") == 0
    assert saved_params(on1)[0] == 8
    # other global env count: environments are re-created, and the log says so
    capsys.readouterr()
    assert run(*TINY[:1], "32", *TINY[2:], "--run-dir", str(on8), "--resume") == 0
    assert "re-created envs" in capsys.readouterr().out


def test_evaluate_best_and_errors(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--run-dir", str(run_dir), "--eval-every", "4", "--eval-episodes", "8") == 0
    evals = [r["eval/episode_return"] for r in rows(run_dir) if "eval/episode_return" in r]
    assert len(evals) == 2
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--best", "--episodes", "4", "--greedy"]) == 0
    best = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert best["step"] in (4, 8) and best["episodes"] == 4
    for argv, words in [(["--run-dir", str(tmp_path / "missing")], "no such directory"),
                        (["--run-dir", str(tmp_path)], "not a run directory"),
                        (["--run-dir", str(run_dir), "--step", "3"], "no such checkpoint")]:
        with pytest.raises(SystemExit) as e:
            evaluate.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and err.count("\n") == 1, err
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.json").write_text((run_dir / "config.json").read_text())
    with pytest.raises(SystemExit):
        evaluate.main(["--run-dir", str(empty)])
    assert "no complete checkpoint" in capsys.readouterr().err


def test_incompatible_resume_names_the_keys(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--run-dir", str(run_dir), "--stop-at-update", "2") == 0
    capsys.readouterr()
    assert run(*TINY, "--run-dir", str(run_dir), "--resume", "--env", "Acrobot-v1", "--hidden-size", "32") == 2
    err = capsys.readouterr().err
    assert "env" in err and "hidden-size" in err and err.count("\n") == 1
    assert run(*TINY, "--run-dir", str(tmp_path / "nothing"), "--resume") == 2
    assert run(*TINY, "--resume") == 2  # no --run-dir


def test_resume_from_another_versions_state_is_one_line(tmp_path, capsys, monkeypatch):
    """A checkpoint whose optimizer state is laid out per leaf (as before the optimizer was
    flattened) does not restore into this version's state: one line, exit 2, nothing written."""
    import optax
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(optax, "flatten", lambda tx: tx)
        assert run(*TINY, "--run-dir", str(run_dir), "--stop-at-update", "2") == 0
    files = {name: (run_dir / name).read_text() for name in ("config.json", "metrics.jsonl")}
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    capsys.readouterr()
    # (--keep-checkpoints: a setting a resume may change, so config.json would show a rewrite)
    assert run(*TINY, "--run-dir", str(run_dir), "--resume", "--keep-checkpoints", "5") == 2
    err = capsys.readouterr().err
    assert "does not fit this version's training state" in err and "opt_state" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    assert {name: (run_dir / name).read_text() for name in files} == files


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--run-dir", str(run_dir), "--stop-at-update", "4") == 0
    capsys.readouterr()
    # A learning rate this large sends the parameters to inf within an update or two.
    assert run(*TINY, "--run-dir", str(run_dir), "--resume", "--lr", "1e38") == 1
    err = capsys.readouterr().err
    assert "non-finite" in err and "at update 5" in err and "update 4" in err
    assert saved_params(run_dir)[0] == 4


# -- real processes: SIGKILL at random moments, SIGTERM -----------------------------------
LONG = ["--num-envs", "8", "--num-steps", "8", "--num-minibatches", "1", "--hidden-size", "16",
        "--total-timesteps", str(8 * 8 * 100_000), "--log-every", "1", "--checkpoint-every", "1",
        "--keep-checkpoints", "2", "--devices", "2"]


def spawn(run_dir, *extra):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "jaxrl_mgpu.train", *LONG, "--run-dir", str(run_dir), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_checkpoint(run_dir, newer_than=0, timeout=120):
    """Until a checkpoint of an update after `newer_than` is complete (so the process trains)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = [int(p.name) for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()]
        if max(done, default=0) > newer_than:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint after update {newer_than} appeared")


def test_old_steps_are_dropped_whole_by_a_rename(tmp_path):
    """A recursive delete killed half-way would leave a listed step with items missing; Orbax
    must instead move a dropped step out of the listing in one rename, and the writer must
    empty that place before its next save so the disk does not fill."""
    class State(NamedTuple):
        params: dict

    par = setup("pmap", 2)
    state = State(par.replicate({"w": np.arange(3, dtype=np.float32)}))
    ckpts = Checkpoints(tmp_path, keep=2)
    checkpoints = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        ckpts.save(step, state, {"params": REPLICATED}, par, {"update": step})
    ckpts.wait()
    assert ckpts.steps() == [2, 3]
    moved = checkpoints / DELETED / "1"
    assert moved.is_dir() and (moved / "params").is_dir()  # whole: items and all
    ckpts.save(4, state, {"params": REPLICATED}, par, {"update": 4})
    ckpts.close()
    assert ckpts.steps() == [3, 4]
    assert not (checkpoints / DELETED).exists() or not any((checkpoints / DELETED).iterdir())


def test_sigkill_never_leaves_a_broken_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    rng = random.Random(0)
    last = 0
    for attempt in range(3):
        proc = spawn(run_dir, "--resume", "auto")
        wait_for_checkpoint(run_dir, newer_than=last)  # the resumed run is training
        # Checkpoints are saved (and the oldest dropped) after every update, so a random
        # moment often falls in a save or a deletion.
        time.sleep(rng.uniform(0.2, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        step, params = saved_params(run_dir)  # the latest complete one restores
        assert step > last
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
        ckpts = Checkpoints(run_dir, read_only=True)
        for s in ckpts.steps():  # and so does every other listed one
            ckpts.restore_params(s, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params))
        last = step
    # A restart resumes from the latest complete checkpoint.
    proc = spawn(run_dir, "--resume", "auto", "--stop-at-update", str(last + 3))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert f"resumed from the checkpoint at update {last}" in out
    assert saved_params(run_dir)[0] == last + 3


def test_sigterm_finishes_the_chunk_saves_and_exits_0(tmp_path):
    run_dir = tmp_path / "run"
    proc = spawn(run_dir)
    wait_for_checkpoint(run_dir)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "SIGTERM" in out and "continue with --resume" in out
    step, _ = saved_params(run_dir)
    assert rows(run_dir)[-1]["update"] == step  # the checkpoint is at the last logged update
