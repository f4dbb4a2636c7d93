"""Shared test helpers (conftest.py has already forced 8 CPU devices)."""

import dataclasses
import os
import subprocess
import sys
import time

import jax
import numpy as np

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel, runner


def make_trainer(devices: int, backend: str = "pmap", **overrides) -> runner.Trainer:
    """A Trainer for a small config on the first `devices` CPU devices."""
    cfg = config_lib.validate(dataclasses.replace(config_lib.Config(), **overrides))
    return runner.Trainer(cfg, parallel.setup(backend, devices))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


def spawn_train(argv: list[str], devices: int = 1) -> subprocess.Popen:
    """`python -m jaxrl_mgpu.train ARGV` as its own process on `devices` virtual CPU devices,
    stdout and stderr captured together."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "jaxrl_mgpu.train", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(condition, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")
