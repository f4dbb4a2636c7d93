"""compile_cache.py and start-up: one compiled program per run, kept in JAX's persistent
compilation cache."""

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import make_trainer

pytestmark = pytest.mark.slow  # every test here is slow: none is in the fast tier

SMALL = ["--num-envs", "8", "--num-steps", "8", "--num-minibatches", "1", "--hidden-size", "8", "--log-every", "4",
         "--checkpoint-every", "0"]


def train_in_process(tmp_path, name, *argv, devices=2):
    """`python -m jaxrl_mgpu.train` in a process of its own (the cache is per process)."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", *SMALL, "--run-dir", str(tmp_path / name), *argv],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout + out.stderr


def entries(cache):
    return sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache")) if cache.exists() else []


def test_a_second_run_loads_the_chunk_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = train_in_process(tmp_path, "a", "--total-timesteps", str(64 * 10), "--compile-cache", str(cache))
    assert f"compile cache  {cache}" in first
    assert "training chunk compiled; kept in the compilation cache" in first
    written = entries(cache)
    assert written, "nothing was cached"
    second = train_in_process(tmp_path, "b", "--total-timesteps", str(64 * 10), "--compile-cache", str(cache))
    assert "training chunk loaded from the compilation cache" in second
    assert entries(cache) == written  # nothing new to compile


def test_compile_cache_off_writes_nothing(tmp_path):
    cache_home = tmp_path / "xdg"
    env_out = subprocess.run(
        [sys.executable, "-m", "jaxrl_mgpu.train", *SMALL, "--total-timesteps", "128", "--compile-cache", "off",
         "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
        env={k: v for k, v in {**os.environ, "XDG_CACHE_HOME": str(cache_home),
                               "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}.items()
             if k != "JAX_COMPILATION_CACHE_DIR"})
    assert env_out.returncode == 0, env_out.stderr[-2000:]
    assert "compile cache  off" in env_out.stdout and "training chunk compiled in" in env_out.stdout
    # Nothing of the compilation cache; gymnax's environments import matplotlib, which keeps its
    # font list in the cache home (its own, not jaxrl_mgpu's).
    written = {p.name for p in cache_home.iterdir()} if cache_home.exists() else set()
    assert written <= {"matplotlib"}, written


def test_an_unwritable_cache_is_a_warning_and_the_run_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = train_in_process(tmp_path, "run", "--total-timesteps", "128", "--compile-cache", str(blocker / "cache"))
    warnings = [line for line in out.splitlines() if line.startswith("warning: --compile-cache")]
    assert len(warnings) == 1 and "running without the compilation cache" in warnings[0]
    assert "compile cache  off" in out and (tmp_path / "run" / "summary.json").exists()


def test_one_program_runs_chunks_of_every_length():
    trainer = make_trainer(2, num_envs=8, num_steps=8, num_minibatches=1, hidden_size=8, total_timesteps=64 * 5,
                           log_every=2)
    assert trainer.chunk_lengths(0) == [2, 2, 1] and trainer.chunk_lengths(0, stop_at=3) == [2, 1]
    state = trainer.init_state()
    for length in (2, 1, 3):
        before = int(trainer.par.first(state.update))
        state, _ = trainer.chunk_fn(length, state)(state)
        assert int(trainer.par.first(state.update)) == before + length
    compiled = trainer.compiled
    trainer.chunk_fn(5, state)
    assert trainer.compiled is compiled  # one program, whatever the length


def test_a_total_that_is_not_a_multiple_of_log_every_compiles_once(tmp_path):
    out = train_in_process(tmp_path, "run", "--total-timesteps", str(64 * 10), "--compile-cache", "off")
    assert out.count("training chunk compiled") == 1
    import json
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [4, 8, 10]
    assert np.isfinite(rows[-1]["loss/total"])
