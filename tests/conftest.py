"""Tests run on CPU with 8 virtual devices; the flag must be set before jax is imported."""

import gc
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def eight_devices():
    assert jax.device_count() == 8, "tests need XLA_FLAGS=--xla_force_host_platform_device_count=8"


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Drop jax's compiled programs after each test module. XLA's CPU backend maps every
    compiled program's code into memory, and the whole suite in one process compiles enough of
    them to pass Linux's default limit of 65,530 memory mappings a process
    (vm.max_map_count), where the next compile dies with a segmentation fault."""
    yield
    jax.clear_caches()
    gc.collect()
