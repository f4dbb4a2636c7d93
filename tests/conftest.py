"""Tests run on CPU with 8 virtual devices; the flag must be set before jax is imported."""

import atexit
import gc
import os
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# MuJoCo picks its OpenGL platform when first imported, and a test that imports brax may come
# before a test of `evaluate --video` in the same process: headless from the start, as the
# evaluator makes it (video.headless).
os.environ.setdefault("MUJOCO_GL", "egl")

# One persistent compilation cache for this test session, fresh each time (so a CI run never
# reads a stale one): the many small training runs the suite starts in processes of their own,
# and the programs recompiled after each module's `jax.clear_caches()`, load from it instead of
# compiling again. The pytest-xdist workers inherit it from the controller, which makes it
# before it starts them, so the two share it. A cache directory given in the environment is used
# instead.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxrl_mgpu-test-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

from jaxrl_mgpu import compile_cache  # noqa: E402

compile_cache.configure(os.environ["JAX_COMPILATION_CACHE_DIR"])


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
