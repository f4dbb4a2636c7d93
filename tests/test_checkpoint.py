"""Checkpoints: exact resume, crash safety, other device counts, evaluation, bad input."""

import json
import os
import random
import re
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

from helpers import TINY, assert_resume_is_exact, rows, run, without_timing

# 8 updates in chunks of 2; small enough to compile and run in seconds.
EIGHT_UPDATES = [*TINY, "--total-timesteps", str(16 * 16 * 8)]


def saved_params(run_dir, step=None):
    return evaluate.load_params(str(run_dir), step)


@pytest.mark.slow
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path):
    straight, _ = assert_resume_is_exact(tmp_path, EIGHT_UPDATES, stop_at=4, end=8)
    assert [r["update"] for r in rows(straight)] == [2, 4, 6, 8]


@pytest.mark.slow
def test_a_stop_during_the_compile_saves_the_initial_state_and_resumes(tmp_path, monkeypatch, capsys):
    """SIGTERM before the first update (while the training chunk compiles): what the run says
    ("with a checkpoint") holds, and --resume, as a requeue script runs it, finishes the run."""
    from jaxrl_mgpu import chunks
    prepare = chunks.Trainer.prepare

    def prepare_then_signal(self, *args, **kwargs):
        state = prepare(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # the run's StopSignal has the handler now
        time.sleep(0.5)  # its watcher thread takes the request
        return state

    monkeypatch.setattr(chunks.Trainer, "prepare", prepare_then_signal)
    run_dir = tmp_path / "run"
    assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir)) == 0
    out = capsys.readouterr().out
    assert "stopped at update 0 of 8 with a checkpoint" in out, out
    assert Checkpoints(run_dir, read_only=True).latest_step() == 0
    monkeypatch.setattr(chunks.Trainer, "prepare", prepare)
    assert run("--run-dir", str(run_dir), "--resume") == 0
    assert "resumed from the checkpoint at update 0" in capsys.readouterr().out
    assert saved_params(run_dir)[0] == 8


def test_any_complete_sees_only_renamed_steps(tmp_path):
    ckpts = Checkpoints(tmp_path, read_only=True)
    assert not ckpts.any_complete()
    (tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)
    (tmp_path / "checkpoints" / DELETED).mkdir()
    assert not ckpts.any_complete()
    (tmp_path / "checkpoints" / "3").mkdir()
    assert ckpts.any_complete()


@pytest.mark.slow
def test_checkpoints_move_between_device_counts(tmp_path, capsys):
    on8, on1 = tmp_path / "on8", tmp_path / "on1"
    assert run(*EIGHT_UPDATES, "--run-dir", str(on8), "--stop-at-update", "4") == 0
    _, params8 = saved_params(on8)
    # evaluation on 1 and 2 devices
    for devices in ("1", "2"):
        capsys.readouterr()
        assert evaluate.main(["--run-dir", str(on8), "--episodes", "6", "--devices", devices]) == 0
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert result["episodes"] == 6 and result["step"] == 4 and result["mean_return"] > 0
    # continued training on 2 devices: the same global envs are split 2 ways instead of 8
    assert run(*EIGHT_UPDATES, "--run-dir", str(on8), "--resume", "--devices", "2", "--stop-at-update", "6") == 0
    assert "re-created" not in capsys.readouterr().out
    # the reverse: written on 1 device, continued on 8
    assert run(*EIGHT_UPDATES, "--run-dir", str(on1), "--devices", "1", "--stop-at-update", "4") == 0
    assert run(*EIGHT_UPDATES, "--run-dir", str(on1), "--resume") == 0
    assert saved_params(on1)[0] == 8
    # other global env count: environments are re-created, and the log says so
    capsys.readouterr()
    assert run(*EIGHT_UPDATES[:1], "32", *EIGHT_UPDATES[2:], "--run-dir", str(on8), "--resume") == 0
    assert "re-created envs" in capsys.readouterr().out


@pytest.mark.slow
def test_incompatible_resume_names_the_keys(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir), "--stop-at-update", "2") == 0
    capsys.readouterr()
    assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir), "--resume", "--env", "Acrobot-v1", "--hidden-size", "32") == 2
    err = capsys.readouterr().err
    assert "env" in err and "hidden-size" in err and err.count("\n") == 1
    assert run(*EIGHT_UPDATES, "--run-dir", str(tmp_path / "nothing"), "--resume") == 2
    assert run(*EIGHT_UPDATES, "--resume") == 2  # no --run-dir


@pytest.mark.slow
def test_resume_from_another_versions_state_is_one_line(tmp_path, capsys, monkeypatch):
    """A checkpoint whose optimizer state is laid out per leaf (as before the optimizer was
    flattened) does not restore into this version's state: one line, exit 2, nothing written."""
    import optax
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(optax, "flatten", lambda tx: tx)
        assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir), "--stop-at-update", "2") == 0
    files = {name: (run_dir / name).read_text() for name in ("config.json", "metrics.jsonl")}
    before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    capsys.readouterr()
    # (--keep-checkpoints: a setting a resume may change, so config.json would show a rewrite)
    assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir), "--resume", "--keep-checkpoints", "5") == 2
    err = capsys.readouterr().err
    assert "does not fit this version's training state" in err and "opt_state" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == before
    assert {name: (run_dir / name).read_text() for name in files} == files


@pytest.mark.slow
def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir), "--stop-at-update", "4") == 0
    capsys.readouterr()
    # A learning rate this large sends the parameters to inf within an update or two.
    assert run(*EIGHT_UPDATES, "--run-dir", str(run_dir), "--resume", "--lr", "1e38") == 1
    err = capsys.readouterr().err
    # The message names what went non-finite: the losses that did, else the parameters.
    assert re.search(r"non-finite (loss/[a-z_]+(, loss/[a-z_]+)*|parameters) at update 5", err), err
    assert "update 4" in err
    assert saved_params(run_dir)[0] == 4


# -- damaged checkpoints ---------------------------------------------------------------------
def _truncate(files):
    for f in files:
        os.truncate(f, os.path.getsize(f) // 2)


def _arrays(step_dir, item):
    """The array data files of one item (params, opt_state, ...) of a checkpoint, largest first."""
    return sorted((p for p in (step_dir / item).rglob("*") if p.is_file() and p.parent.name == "d" and p.parent.parent.name.startswith("ocdbt.process")),
                  key=lambda p: -p.stat().st_size)


# how: (the damage, whether evaluation (which reads the params only) meets it)
DAMAGE = {
    "one params file truncated": (lambda d: _truncate(_arrays(d, "params")[:1]), True),
    "every params file truncated": (lambda d: _truncate(_arrays(d, "params")), True),
    "one opt_state file truncated": (lambda d: _truncate(_arrays(d, "opt_state")[:1]), False),
    "Orbax's metadata emptied": (lambda d: (d / "_CHECKPOINT_METADATA").write_text(""), True),
}


# Arrays of some size (OCDBT keeps small values inside its tree nodes instead of data files).
WIDE = [*EIGHT_UPDATES, "--devices", "2", "--hidden-size", "64"]


@pytest.fixture(scope="module")
def six_updates(tmp_path_factory):
    """A run stopped at update 6, with checkpoints at 2, 4 and 6."""
    run_dir = tmp_path_factory.mktemp("damaged") / "base"
    assert run(*WIDE, "--run-dir", str(run_dir), "--stop-at-update", "6") == 0
    return run_dir


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(six_updates, tmp_path,
                                                                                          capsys):
    import shutil
    by_hand = tmp_path / "by_hand"
    shutil.copytree(six_updates, by_hand)
    shutil.move(by_hand / "checkpoints" / "6", tmp_path / "moved_by_hand")
    assert run(*WIDE, "--run-dir", str(by_hand), "--resume") == 0
    expected_rows, (step, expected) = [without_timing(r) for r in rows(by_hand)], saved_params(by_hand)
    assert step == 8
    capsys.readouterr()
    for i, (how, (damage, in_params)) in enumerate(DAMAGE.items()):
        run_dir = tmp_path / f"damaged{i}"
        shutil.copytree(six_updates, run_dir)
        damage(run_dir / "checkpoints" / "6")
        # evaluate passes over it where it needs what is damaged (and changes nothing), with one
        # line that says so
        assert evaluate.main(["--run-dir", str(run_dir), "--episodes", "2"]) == 0, how
        out, err = capsys.readouterr()
        assert json.loads(out.splitlines()[-1])["step"] == (4 if in_params else 6), how
        if in_params:
            assert err.count("\n") == 1 and "the checkpoint at update 6 cannot be read" in err, (how, err)
        assert (run_dir / "checkpoints" / "6").is_dir()
        # a resume sets it aside, says so in one line, and goes on from update 4
        assert run(*WIDE, "--run-dir", str(run_dir), "--resume") == 0, how
        out, err = capsys.readouterr()
        assert "ERROR" not in out + err and "Traceback" not in out + err, (how, out, err)
        said = [line for line in out.splitlines() if "cannot be read" in line]
        assert len(said) == 1 and "checkpoint at update 6" in said[0] and "resuming from update 4" in said[0], out
        assert (run_dir / "damaged" / "checkpoints-6").is_dir()  # (checkpoints/6 is the resumed run's own)
        step, params = saved_params(run_dir)
        assert step == 8, how
        jax.tree.map(np.testing.assert_array_equal, params, expected)
        assert [without_timing(r) for r in rows(run_dir)] == expected_rows, how


@pytest.mark.slow
def test_with_no_whole_checkpoint_left_resume_and_evaluate_are_one_line(six_updates, tmp_path, capsys):
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(six_updates, run_dir)
    for step in (2, 4, 6):
        DAMAGE["one params file truncated"][0](run_dir / "checkpoints" / str(step))
    capsys.readouterr()
    for argv, words in [([], "no checkpoint reads back whole (updates 6, 4, 2; the latest: damaged params ("),
                        (["--step", "4"], "--step 4: the checkpoint at update 4 cannot be read (damaged params (")]:
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--run-dir", str(run_dir), *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and words in err, err
    files = (run_dir / "config.json").read_text(), (run_dir / "metrics.jsonl").read_text()
    assert run(*WIDE, "--run-dir", str(run_dir), "--resume") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume: no checkpoint of") and err.count("\n") == 1, err
    assert files == ((run_dir / "config.json").read_text(), (run_dir / "metrics.jsonl").read_text())
    assert sorted(p.name for p in (run_dir / "damaged").iterdir()) == ["checkpoints-2", "checkpoints-4",
                                                                      "checkpoints-6"]


@pytest.mark.slow
def test_a_resume_with_every_metadata_file_emptied_prints_only_its_own_line(six_updates, tmp_path):
    """Orbax logs each unreadable metadata file through absl as it lists the steps; the run's own
    line says it all."""
    import shutil
    run_dir = tmp_path / "run"
    shutil.copytree(six_updates, run_dir)
    for step in (2, 4, 6):
        DAMAGE["Orbax's metadata emptied"][0](run_dir / "checkpoints" / str(step))
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--run-dir", str(run_dir), "--resume"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: --resume: no checkpoint of") and out.stderr.count("\n") == 1, out.stderr


# SAC with its replay on 2 devices, checkpoints at updates 2 and 4. Each replay chunk is then
# over the 1 KiB that OCDBT keeps inside its tree nodes, so it lies in the data files damaged.
SAC = ["--algo", "sac", "--env", "Pendulum-v1", "--num-envs", "16", "--num-steps", "8", "--buffer-size", "512",
       "--replay-batch-size", "64", "--learning-starts", "128", "--updates-per-step", "0.25", "--hidden-size", "16",
       "--total-timesteps", str(16 * 8 * 6), "--log-every", "2", "--checkpoint-every", "2", "--devices", "2"]


def _scramble(files):
    for f in files:
        f.write_bytes(b"\xff" * f.stat().st_size)


@pytest.mark.slow
def test_a_damaged_replay_is_named_in_one_line_and_passed_over_like_damaged_params(tmp_path, capsys):
    """Issue 70: a replay's damage was reported as Orbax's wrapper of TensorStore's error (a
    TensorStore repr, cut at its first line), after some 65 lines of 'Exception ignored in:
    <coroutine ...>' per read left in flight. The line names the part and its file instead."""
    import shutil
    base = tmp_path / "base"
    assert run(*SAC, "--run-dir", str(base), "--stop-at-update", "4") == 0
    # every checkpoint's replay damaged: the resume is one line, exit 2, the run directory as it was
    every = tmp_path / "every"
    shutil.copytree(base, every)
    for step in (2, 4):
        _scramble(_arrays(every / "checkpoints" / str(step), "replay"))
    files = (every / "config.json").read_text(), (every / "metrics.jsonl").read_text()
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--run-dir", str(every), "--resume"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: --resume: no checkpoint of {every} reads back whole: checkpoint at update 2 "
                                 f"cannot be read (damaged replay ("), out.stderr
    assert f"{every / 'checkpoints' / '2' / 'replay'}: " in out.stderr, out.stderr
    assert "TensorStore" not in out.stderr and "tensorstore_spec" not in out.stderr, out.stderr
    assert files == ((every / "config.json").read_text(), (every / "metrics.jsonl").read_text())
    # the newest one's replay damaged: set aside, said in one line, the run goes on from the one before
    newest = tmp_path / "newest"
    shutil.copytree(base, newest)
    _scramble(_arrays(newest / "checkpoints" / "4", "replay"))
    capsys.readouterr()
    assert run(*SAC, "--run-dir", str(newest), "--resume") == 0
    out, err = capsys.readouterr()
    said = [line for line in out.splitlines() if "cannot be read" in line]
    assert len(said) == 1 and "checkpoint at update 4 cannot be read (damaged replay (" in said[0], out
    assert "resuming from update 2" in said[0] and "TensorStore" not in out + err, out + err
    assert (newest / "damaged" / "checkpoints-4").is_dir() and rows(newest)[-1]["update"] == 6


class _Pending:
    def __await__(self):
        yield  # suspends the coroutine, as a read waiting for TensorStore


async def _read():
    try:
        await _Pending()
    except BaseException as e:  # as Orbax's read does, GeneratorExit included
        raise Exception("Encountered error while reading array index") from e


def test_the_reads_a_failed_restore_leaves_behind_are_not_reported_when_collected(tmp_path):
    """Orbax's loop closes on a failed read with its other reads suspended or not yet started.
    When a suspended one is collected, Python closes it, Orbax's read turns the GeneratorExit
    into an Exception, and Python reports that as unraisable (some 65 lines each); one not
    started is a 'never awaited' warning: both dropped. The same error from a coroutine that is
    not Orbax's is still reported."""
    import gc
    import types
    import warnings

    import orbax.checkpoint as ocp

    from jaxrl_mgpu.checkpoint import DamagedCheckpoint
    # the same read as if it were Orbax's: its code in Orbax's package
    orbax_file = os.path.join(os.path.dirname(ocp.__file__), "read.py")
    orbax_read = types.FunctionType(_read.__code__.replace(co_filename=orbax_file), globals())
    reported, previous = [], sys.unraisablehook
    sys.unraisablehook = lambda unraisable: reported.append(unraisable.object.cr_code.co_filename)
    ckpts = Checkpoints(tmp_path, read_only=True)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            with pytest.raises(DamagedCheckpoint), ckpts._reading(1, ckpts.latest):
                raise ValueError("a read that fails")
            for read in (orbax_read, _read):
                coroutine = read()
                coroutine.send(None)
                del coroutine  # collected while suspended: closed
            coroutine = orbax_read()
            del coroutine  # collected before it started
            gc.collect()
    finally:
        sys.unraisablehook = previous
        ckpts.close()
    assert reported == [__file__] and not [str(w.message) for w in warned]


def test_after_a_failed_read_asyncio_s_unretrieved_exceptions_are_not_logged(caplog):
    import logging

    from jaxrl_mgpu import checkpoint
    checkpoint._quiet_failed_read()
    with caplog.at_level(logging.ERROR):
        logging.getLogger("asyncio").error("Task exception was never retrieved")
        logging.getLogger("asyncio").error("Future exception was never retrieved")
        logging.getLogger("asyncio").error("_GatheringFuture exception was never retrieved")
        logging.getLogger("absl").error("Failed to json parse Metadata file: x")
        logging.getLogger("asyncio").error("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


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


@pytest.mark.slow
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


@pytest.mark.slow
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


# -- a stop request in the middle of a long log interval ------------------------------------
# One log interval of 1,000 updates, each a few hundredths of a second on a CPU: before chunks
# were sized to a wall time, a stop waited for the whole interval (and the one dispatched
# after it).
SLOW = ["--num-envs", "64", "--num-steps", "64", "--num-minibatches", "2", "--hidden-size", "64",
        "--total-timesteps", str(64 * 64 * 100_000), "--log-every", "1000", "--checkpoint-every", "0",
        "--devices", "1"]
STOP_BOUND_S = 10.0  # README: a stop is honoured within seconds (two chunks of about 2 s, then the save)


class Lines:
    """A process's output, read on a thread as it comes."""

    def __init__(self, proc):
        import threading
        self.proc, self.lines = proc, []
        threading.Thread(target=lambda: self.lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()

    def wait_for(self, text, timeout=240):
        deadline = time.time() + timeout
        while not any(text in line for line in self.lines):
            assert time.time() < deadline and self.proc.poll() is None, "".join(self.lines)[-3000:]
            time.sleep(0.05)

    def text(self):
        return "".join(self.lines)


def spawn_slow(run_dir, *extra):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_mgpu.train", *SLOW, "--run-dir", str(run_dir), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, Lines(proc)


@pytest.mark.slow
def test_sigterm_in_a_long_log_interval_saves_within_the_bound_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    proc, out = spawn_slow(run_dir)
    out.wait_for("training chunk")
    time.sleep(4.0)  # well into the first log interval, several chunks on
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 0, out.text()
    assert took < STOP_BOUND_S, (took, out.text())
    assert "SIGTERM: stopping" in out.text()
    step, _ = saved_params(run_dir)
    assert 0 < step < 1000  # between log points
    assert rows(run_dir)[-1]["update"] == step  # the interval's row so far
    assert f"stopped at update {step} of" in out.text()
    resumed, more = spawn_slow(run_dir, "--resume", "--stop-at-update", str(step + 2))
    assert resumed.wait(timeout=240) == 0, more.text()
    assert f"resumed from the checkpoint at update {step}" in more.text()
    assert saved_params(run_dir)[0] == step + 2


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_keeping_the_complete_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    # Updates of seconds each: the first Ctrl-C waits for the one in flight, the second does not.
    proc, out = spawn_slow(run_dir, "--num-envs", "4096", "--num-steps", "128", "--log-every", "1",
                           "--checkpoint-every", "1")
    wait_for_checkpoint(run_dir, timeout=240)
    proc.send_signal(signal.SIGINT)
    out.wait_for("SIGINT: stopping")
    time.sleep(1.2)  # a second request, not the process group's copy of the first
    assert proc.poll() is None, out.text()
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert time.monotonic() - sent < 3.0, out.text()
    assert proc.returncode == 128 + signal.SIGINT, out.text()
    assert "SIGINT again: exiting now" in out.text()
    step, params = saved_params(run_dir)  # what was complete still restores
    assert step >= 1 and all(np.isfinite(x).all() for x in jax.tree.leaves(params))
