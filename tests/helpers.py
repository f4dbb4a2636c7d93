"""Shared test helpers (conftest.py has already forced 8 CPU devices)."""

import dataclasses

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
