"""Several processes on localhost joined by jax.distributed (CPU collectives through gloo)."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxrl_mgpu import evaluate, train

pytestmark = pytest.mark.slow  # every test here is slow: none is in the fast tier

# A single minibatch: 2 processes x 4 devices must then equal 1 process x 8 devices exactly.
SMALL = ["--num-envs", "16", "--num-steps", "16", "--num-minibatches", "1", "--hidden-size", "16",
         "--total-timesteps", str(16 * 16 * 4), "--log-every", "2", "--checkpoint-every", "2"]


def launch(*argv, timeout=240):
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2",
                          "--devices-per-process", "4", "--", *argv],
                         capture_output=True, text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_two_processes_equal_one_process_with_8_devices(tmp_path, backend):
    one, two = tmp_path / "one", tmp_path / "two"
    assert train.main([*SMALL, "--run-dir", str(one), "--parallel", backend]) == 0
    code, out = launch(*SMALL, "--run-dir", str(two), "--parallel", backend)
    assert code == 0, out
    assert "2 (this is process 0)" in out and "8 global" in out
    # Only process 0 prints the banner and progress (gloo's own C++ lines may come from both).
    ours = ("processes", "update ", "done:", "results in")
    assert not [line for line in out.splitlines() if line.startswith("[1]") and any(w in line for w in ours)]
    _, p1 = evaluate.load_params(str(one))
    _, p2 = evaluate.load_params(str(two))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p1, p2)
    # Only process 0 wrote the logs.
    assert len(list(two.glob("events.out.tfevents*"))) == 1
    assert (two / "metrics.jsonl").read_text().count("\n") == 2


def test_two_processes_checkpoint_and_resume(tmp_path):
    run_dir = tmp_path / "run"
    code, out = launch(*SMALL, "--run-dir", str(run_dir), "--stop-at-update", "2")
    assert code == 0, out
    code, out = launch(*SMALL, "--run-dir", str(run_dir), "--resume")
    assert code == 0, out
    assert "resumed from the checkpoint at update 2" in out
    assert evaluate.load_params(str(run_dir))[0] == 4


def test_a_dead_process_stops_the_others_in_bounded_time(tmp_path):
    """Without the launcher: kill one process; the other must exit by itself, not hang."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONUNBUFFERED": "1"}
    port = __import__("jaxrl_mgpu.tools.launch", fromlist=["free_port"]).free_port()
    args = ["--num-envs", "4", "--num-steps", "8", "--num-minibatches", "1", "--hidden-size", "8",
            "--total-timesteps", str(10**9), "--log-every", "1", "--checkpoint-every", "0",
            "--run-dir", str(tmp_path / "run"), "--coordinator-address", f"localhost:{port}",
            "--num-processes", "2", "--failure-timeout", "10"]
    procs = [subprocess.Popen([sys.executable, "-m", "jaxrl_mgpu.train", *args, "--process-id", str(i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    # wait until training is under way
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "run" / "metrics.jsonl").exists():
        time.sleep(0.2)
    time.sleep(1)
    procs[1].send_signal(signal.SIGKILL)
    start = time.time()
    out, _ = procs[0].communicate(timeout=90)
    elapsed = time.time() - start
    assert procs[0].returncode != 0
    assert elapsed < 60, elapsed
    assert "distributed" in out.lower() or "heartbeat" in out.lower() or "task" in out.lower(), out[-2000:]


def test_unreachable_coordinator_is_a_clear_error(tmp_path):
    port = __import__("jaxrl_mgpu.tools.launch", fromlist=["free_port"]).free_port()
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--coordinator-address", f"localhost:{port}",
                          "--num-processes", "2", "--process-id", "1", "--failure-timeout", "3",
                          "--run-dir", str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "coordinator" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "r").exists()


def test_the_launcher_stops_the_job_when_any_process_dies(tmp_path):
    """Process 1 killed: the launcher names it at once, the survivor leaves within seconds (not
    after the heartbeat timeout), and the launcher exits with the dead process's status."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2",
                             "--devices-per-process", "1", "--", "--num-envs", "4", "--num-steps", "8",
                             "--num-minibatches", "1", "--hidden-size", "8", "--total-timesteps", str(10**9),
                             "--log-every", "1", "--checkpoint-every", "0", "--run-dir", str(run_dir),
                             "--failure-timeout", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not (run_dir / "metrics.jsonl").exists():
            time.sleep(0.2)
        time.sleep(1)
        pids = subprocess.run(["pgrep", "-f", "--", f"--run-dir {run_dir} .*--process-id 1"], capture_output=True,
                              text=True).stdout.split()
        assert len(pids) == 1, pids
        os.kill(int(pids[0]), signal.SIGKILL)
        start = time.time()
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["pkill", "-9", "-f", "--", f"--run-dir {run_dir}"])
    assert time.time() - start < 30, out[-3000:]  # well inside --failure-timeout 120
    assert proc.returncode == 128 + signal.SIGKILL, out[-3000:]
    assert "[launch] process 1 was killed by SIGKILL; stopping process(es) 0" in out
    assert "another process of this job failed" in out
    assert "[Gloo]" not in out and "Check failure stack trace" not in out


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_off_policy_two_processes_equal_one_and_resume(tmp_path, algo):
    """SAC and TD3: each process's devices keep their environments' replay, and the gradient
    all-reduce spans both processes, so 2 processes x 4 devices learn 1 x 8's params; a
    2-process run stopped at update 2 resumes (the replay, partly full, from the checkpoint)
    to the same params."""
    tiny = ["--algo", algo, "--env", "Pendulum-v1", "--num-envs", "16", "--num-steps", "4", "--updates-per-step",
            "0.5", "--replay-batch-size", "64", "--buffer-size", "1024", "--learning-starts", "128",
            "--hidden-size", "16", "--tau", "0.05", "--normalize-obs", "--total-timesteps", "384", "--log-every", "2",
            "--checkpoint-every", "2"]
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    assert train.main([*tiny, "--run-dir", str(one)]) == 0
    code, out = launch(*tiny, "--run-dir", str(two))
    assert code == 0, out
    code, out = launch(*tiny, "--run-dir", str(resumed), "--stop-at-update", "2")
    assert code == 0, out
    code, out = launch(*tiny, "--run-dir", str(resumed), "--resume")
    assert code == 0 and "resumed from the checkpoint at update 2" in out, out
    (_, p1), (_, p2), (_, p3) = (evaluate.load_params(str(d)) for d in (one, two, resumed))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p1, p2)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p2, p3)
