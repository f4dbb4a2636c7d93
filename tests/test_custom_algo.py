"""examples/custom_algo.py: an algorithm registered from outside the package (A2C) trains on all
8 devices, stops and resumes exactly, evaluates, and runs as a user runs it: `python -m
jaxrl_mgpu.train --algo examples.custom_algo:a2c`, its own option swept and in the help."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_mgpu import algos, evaluate

from helpers import assert_resume_is_exact, run

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_algo.py"


@pytest.fixture(scope="module")
def a2c():
    spec = importlib.util.spec_from_file_location("custom_algo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers "a2c"
    return module


def test_its_returns_stop_at_a_termination_and_bootstrap_at_a_truncation(a2c):
    # one environment, 3 steps of reward 1; gamma 0.5; the last value 10
    reward = jnp.ones((3, 1))
    def returns(terminated, truncated, bootstrap):
        return np.asarray(a2c.n_step_returns(reward, jnp.asarray(terminated, jnp.float32)[:, None],
                                             jnp.asarray(truncated)[:, None], jnp.asarray(bootstrap, jnp.float32)[:, None],
                                             jnp.full((1,), 10.0), 0.5))[:, 0]
    np.testing.assert_allclose(returns([0, 0, 0], [0, 0, 0], [0, 0, 0]), [1 + .5 * (1 + .5 * 6), 1 + .5 * 6, 6])
    np.testing.assert_allclose(returns([0, 1, 0], [0, 0, 0], [0, 0, 0]), [1.5, 1, 6])  # the episode ended at step 1
    np.testing.assert_allclose(returns([0, 0, 0], [0, 1, 0], [0, 4, 0]), [2.5, 3, 6])  # cut off at 1: V(final obs) = 4


@pytest.mark.slow
def test_a_registered_algorithm_trains_resumes_exactly_and_evaluates(a2c, tmp_path, capsys):
    assert "a2c" in algos.names()
    flags = ["--algo", "a2c", "--env", "CartPole-v1", "--num-envs", "16", "--num-steps", "8", "--hidden-size", "16",
             "--total-timesteps", str(16 * 8 * 8), "--log-every", "2"]
    straight, _ = assert_resume_is_exact(tmp_path, flags, stop_at=4, end=8)
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [2, 4, 6, 8] and all(np.isfinite(r["loss/value"]) for r in rows)
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(straight), "--episodes", "16"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 16 and result["step"] == 8
    # A2C's own option is taken; PPO's clipping is refused
    assert run(*flags, "--value-weight", "0.25", "--total-timesteps", "128", "--run-dir", str(tmp_path / "vf")) == 0
    capsys.readouterr()
    assert run(*flags, "--clip-eps", "0.1", "--run-dir", str(tmp_path / "bad")) == 2
    assert "--clip-eps is only for --algo ppo" in capsys.readouterr().err and not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_the_command_line_names_it_by_module_trains_sweeps_resumes_and_evaluates_it(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    run_dir, swept = str(tmp_path / "a2c"), str(tmp_path / "swept")
    flags = ["--algo", "examples.custom_algo:a2c", "--env", "CartPole-v1", "--num-envs", "8", "--num-steps", "8",
             "--hidden-size", "16", "--log-every", "2"]

    def command(module, *argv):  # as a user runs it, from the repository's root
        out = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env,
                             timeout=300, cwd=ROOT)
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
        return out.stdout

    command("jaxrl_mgpu.train", *flags, "--total-timesteps", str(8 * 8 * 4), "--run-dir", run_dir)
    command("jaxrl_mgpu.train", "--run-dir", run_dir, "--resume", "--total-timesteps", str(8 * 8 * 6))
    rows = [json.loads(line) for line in (tmp_path / "a2c" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [2, 4, 6]
    result = json.loads(command("jaxrl_mgpu.evaluate", "--run-dir", run_dir, "--episodes", "4").strip().splitlines()[-1])
    assert result["episodes"] == 4 and result["step"] == 6
    # its own option, swept: both values train, in one program
    command("jaxrl_mgpu.train", *flags, "--total-timesteps", str(8 * 8 * 2), "--sweep", "value_weight=0.25,0.5",
            "--run-dir", swept)
    rows = [json.loads(line) for line in (tmp_path / "swept" / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["value_weight"] for r in rows}) == [0.25, 0.5]
    # --help-all of it lists its options, in their group
    text = command("jaxrl_mgpu.train", "--algo", "examples.custom_algo:a2c", "--help-all")
    assert "a2c options: A2C (examples/custom_algo.py)" in text and "--value-weight X" in text
    assert "--clip-eps" not in text


@pytest.mark.slow
def test_an_outside_algorithm_that_uses_jax_when_imported_runs_as_two_processes(tmp_path):
    """--algo MODULE:NAME is imported while the command line is parsed; a module that computes
    with JAX as it is imported would start JAX before jax.distributed, which a multi-process job
    must start first: the trainer starts the job before that parse."""
    (tmp_path / "jaxy_algo.py").write_text(
        "import jax.numpy as jnp\n"
        "ONE = float(jnp.ones(()))  # a JAX computation at import\n"
        "from jaxrl_mgpu import algos\n"
        "import examples.custom_algo  # registers a2c\n"
        "algos.register('a2c_jaxy', algos.get('a2c'))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2", "--devices-per-process",
                          "2", "--", "--algo", "jaxy_algo:a2c_jaxy", "--env", "CartPole-v1", "--num-envs", "8",
                          "--num-steps", "8", "--hidden-size", "16", "--total-timesteps", str(8 * 8 * 2),
                          "--log-every", "1", "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "4 global" in out.stdout + out.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
