"""Shared test helpers (conftest.py has already forced 8 CPU devices)."""

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import chunks, parallel, plan, train

# Command-line runs' smallest settings: 16 envs x 16 steps on 8 devices, an update is 256 env steps.
TINY = ["--num-envs", "16", "--num-steps", "16", "--num-minibatches", "2", "--hidden-size", "16",
        "--log-every", "2", "--checkpoint-every", "2"]


def rows(run_dir) -> list[dict]:
    """The rows of a run's metrics.jsonl (none before it is written)."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# PPO on Pendulum at a CPU size: 16 envs x 16 steps, 8 updates (algos/ppo.py's continuous tests).
PENDULUM = dict(env="Pendulum-v1", num_envs=16, num_steps=16, update_epochs=2, hidden_size=32,
                total_timesteps=16 * 16 * 8)


def pendulum_config(**overrides):
    """PENDULUM's validated config, with `overrides`."""
    return config_lib.validate(config_lib.build({**PENDULUM, **overrides}))


def run(*argv):
    """train.main in this process; returns its exit code (SystemExit codes included)."""
    try:
        return train.main(list(argv))
    except SystemExit as e:
        return e.code


def without_timing(row: dict) -> dict:
    """A log row without what depends on the machine's speed."""
    return {k: v for k, v in row.items() if k not in ("sps", "time")}


def assert_resume_is_exact(tmp_path, flags, stop_at: int, end: int, rows_equal: bool = True,
                           close: tuple[float, float] | None = None, straight_flags=()) -> tuple[Path, Path]:
    """The stop-and-resume check every algorithm passes: `flags` trained straight to update
    `end` (in tmp_path/straight, with `straight_flags` too), and stopped after update `stop_at`
    (--stop-at-update) then resumed (--resume) in tmp_path/resumed, end with the same params
    (bitwise on CPU; `close`: (rtol, atol) where the program sums in another order) and, with
    `rows_equal`, the same log rows (timing aside). Returns (straight, resumed)."""
    from jaxrl_mgpu import evaluate
    straight, resumed = Path(tmp_path) / "straight", Path(tmp_path) / "resumed"
    assert run(*flags, *straight_flags, "--run-dir", str(straight)) == 0
    assert run(*flags, "--run-dir", str(resumed), "--stop-at-update", str(stop_at)) == 0
    assert evaluate.load_params(str(resumed))[0] == stop_at
    assert run(*flags, "--run-dir", str(resumed), "--resume") == 0
    (step_a, params_a), (step_b, params_b) = evaluate.load_params(str(straight)), evaluate.load_params(str(resumed))
    assert step_a == step_b == end
    if close is None:
        jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
    else:
        assert_trees_close(params_a, params_b, *close)
    if rows_equal:
        assert [without_timing(r) for r in rows(straight)] == [without_timing(r) for r in rows(resumed)]
    return straight, resumed


def tensorboard_scalars(directory) -> dict:
    """{tag: [(step, value), ...]} from the event files of one TensorBoard run directory (TFRecord
    framing: length, its CRC, the Event proto, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event
    scalars: dict = {}
    for path in sorted(Path(directory).glob("events.out.tfevents*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (size,) = struct.unpack("<Q", data[at:at + 8])
            event = Event.FromString(data[at + 12:at + 12 + size])
            at += 12 + size + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def resolved(cfg, par: parallel.Parallel | None = None) -> plan.Plan:
    """The run of a validated `cfg` as its algorithm is built from it (algos.base.Resolved): its
    environment made; with `par`, on those devices with its batch split."""
    made = plan.of_config(cfg)
    return made if par is None else made.on(par)


def make_trainer(devices: int, backend: str = "pmap", **overrides) -> chunks.Trainer:
    """A Trainer for a small config on the first `devices` CPU devices."""
    cfg = config_lib.validate(config_lib.build(overrides))
    return chunks.Trainer(plan.on_devices(cfg, parallel.setup(backend, devices)))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


def make_stream(starts, steps, num_actions, obs_size, seed=0):
    """Transformer inputs for len(starts) streams of `steps` steps: obs, prev_action, prev_reward,
    is_first (True at the steps listed in each stream's entry of `starts`)."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((len(starts), steps), bool)
    for b, s in enumerate(starts):
        is_first[b, list(s)] = True
    return (jnp.asarray(rng.normal(size=(len(starts), steps, obs_size)), jnp.float32),
            jnp.asarray(rng.integers(0, num_actions, size=(len(starts), steps)), jnp.int32),
            jnp.asarray(rng.normal(size=(len(starts), steps)), jnp.float32),
            jnp.asarray(is_first))


def random_transformer_params(model, obs_size, seed=0):
    """Random values for every leaf of a TransformerActorCritic (float32, like the real init),
    not the real init: the PPO init (0.01 actor head, zero biases, unit LayerNorms) makes the
    outputs nearly input-independent, which would let mask bugs pass unnoticed. eval_shape: no
    compile, no device work."""
    xs = make_stream([()], 2, model.num_actions, obs_size)
    shapes = jax.eval_shape(model.init, jax.random.key(0), None, *xs)
    rng = np.random.default_rng(seed)

    def leaf(path, x):
        if len(x.shape) >= 2:
            return jnp.asarray(rng.normal(size=x.shape) / np.sqrt(np.prod(x.shape[:-1])), x.dtype)
        centre = 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else 0.0
        return jnp.asarray(centre + 0.2 * rng.normal(size=x.shape), x.dtype)

    return jax.tree_util.tree_map_with_path(leaf, shapes)


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


def one_error_line(capsys) -> str:
    """The one line a user error printed to stderr (and nothing else)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]
