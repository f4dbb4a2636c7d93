"""What the project guarantees holds for other suites' environments and a user's own: 1 device ==
8 devices with the same global batch, pmap == shard_map, many runs in one program, auto-scale,
several processes, and a user's environment trained with every feature (examples/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from helpers import assert_resume_is_exact, assert_trees_close, make_trainer, run
from jaxrl_mgpu import evaluate, parallel
from jaxrl_mgpu import autoscale
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import plan as plan_lib

pytestmark = pytest.mark.slow  # every test here is slow: none is in the fast tier

ROOT = Path(__file__).resolve().parents[1]
# One task of each contract: a TimeStep suite (discrete actions) and the Brax State contract
# (continuous actions, with the continuous-control options).
TASKS = {
    "navix:Navix-Empty-5x5-v0": dict(),
    "dmc:CartpoleBalance": dict(normalize_obs=True, action_dist="tanh_normal", reward_scale=10.0),
}
SMALL = dict(num_envs=16, num_steps=8, update_epochs=2, hidden_size=16, total_timesteps=16 * 8 * 4)


def needs(task):
    module = {"navix": "navix", "dmc": "mujoco_playground"}[task.split(":")[0]]
    return pytest.importorskip(module)


def one_update(trainer):
    state = trainer.init_state()
    return trainer.chunk_fn(1, state)(state)


@pytest.mark.parametrize("task", TASKS)
def test_one_update_on_8_devices_equals_1_device_and_pmap_equals_shard_map(task):
    needs(task)
    options = dict(env=task, num_minibatches=1, **SMALL, **TASKS[task])
    one, eight = make_trainer(1, **options), make_trainer(8, "shard_map", **options)
    pmapped = make_trainer(8, "pmap", **options)
    (state1, _), (state8, chunk8), (state_p, chunk_p) = one_update(one), one_update(eight), one_update(pmapped)
    # (MJX's physics batched 16 wide or 2 wide rounds differently: observations near 0 differ by
    # about 1e-5, which the observation statistics in the params show, and which the learner,
    # normalising by those statistics, carries into the first layer's weights: up to 3e-4)
    atol = 1e-3 if task.startswith("dmc:") else 1e-4
    assert_trees_close(one.par.first(state1.params), eight.par.first(state8.params), rtol=1e-4, atol=atol)
    assert_trees_close(eight.par.local(state8.params), pmapped.par.local(state_p.params), rtol=1e-6)
    assert_trees_close(eight.par.first(chunk8.losses), pmapped.par.first(chunk_p.losses), rtol=1e-5)
    init = one.par.first(one.init_state().params)
    moved = jax.tree.map(lambda a, b: np.abs(a - b).max(), init, one.par.first(state1.params))
    assert max(jax.tree.leaves(moved)) > 1e-5  # the update moved the params: the comparison means something


def test_many_runs_in_one_program_equal_their_single_runs():
    needs("navix:Navix-Empty-5x5-v0")
    # (one minibatch: each device shuffles its own share of the batch, so with several the
    # minibatches differ between layouts)
    options = dict(env="navix:Navix-Empty-5x5-v0", num_minibatches=1, **SMALL)
    many = make_trainer(2, "shard_map", num_seeds=2, **options)
    state, _ = many.chunk_fn(2, many.init_state())(many.init_state())
    params = many.par.runs_of(state.params)
    for run_index in range(2):
        single = make_trainer(2, "shard_map", seed=run_index, **options)
        single_state, _ = single.chunk_fn(2, single.init_state())(single.init_state())
        assert_trees_close(single.par.first(single_state.params), jax.tree.map(lambda x: x[run_index], params),
                           rtol=1e-5, atol=1e-6)


def test_auto_scale_sizes_a_suites_task(capsys):
    needs("navix:Navix-Empty-5x5-v0")
    cfg = config_lib.validate(config_lib.build(dict(env="navix:Navix-Empty-5x5-v0", auto_scale="memory",
                                                num_steps=8, hidden_size=16, total_timesteps=10 ** 9,
                                                auto_scale_memory=2 ** 22 / autoscale.memory_limit(
                                                    parallel.this_device().devices[0])[0])))
    chosen, rows = autoscale.choose(plan_lib.of_config(cfg), parallel.setup("pmap", 1))
    assert chosen.num_envs >= 256 and any(r.chosen for r in rows)
    assert "auto-scale (memory)" in capsys.readouterr().out


def test_two_processes_equal_one_process_with_8_devices(tmp_path):
    needs("navix:Navix-Empty-5x5-v0")
    flags = ["--env", "navix:Navix-Empty-5x5-v0", "--num-envs", "16", "--num-steps", "8", "--num-minibatches", "1",
             "--hidden-size", "16", "--total-timesteps", str(16 * 8 * 4), "--log-every", "2"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert run(*flags, "--run-dir", str(one)) == 0
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2", "--devices-per-process",
                          "4", "--", *flags, "--run-dir", str(two)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    (_, p1), (_, p2) = evaluate.load_params(str(one)), evaluate.load_params(str(two))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), p1, p2)


def test_a_users_own_environment_trains_with_every_feature(tmp_path, capsys, monkeypatch):
    """examples/custom_env.py, named as MODULE:NAME (the trainer imports the module, which
    registers the name): trained on all 8 devices, stopped and resumed exactly, many seeds in
    one program, evaluated, drawn into a video; its argument checked."""
    monkeypatch.syspath_prepend(str(ROOT))  # where `examples` imports from, as for `python -m` in the root
    flags = ["--env", "examples.custom_env:Corridor-v0", "--env-args", "size=6", "--num-envs", "16", "--num-steps", "16",
             "--hidden-size", "16", "--total-timesteps", str(16 * 16 * 8), "--log-every", "2"]
    straight, _ = assert_resume_is_exact(tmp_path, flags, stop_at=4, end=8)
    assert run(*flags, "--num-seeds", "2", "--run-dir", str(tmp_path / "seeds")) == 0
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(straight), "--episodes", "16", "--greedy"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["episodes"] == 16 and result["step"] == 8
    assert evaluate.main(["--run-dir", str(straight), "--video", str(tmp_path / "corridor.gif"), "--greedy"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])   # drawn by its render_rgb
    assert shown["frames"] == shown["episode_length"] + 1 and (tmp_path / "corridor.gif").stat().st_size > 0
    assert run(*flags[:2], "--env-args", "size=1", "--run-dir", str(tmp_path / "bad")) == 2
    assert "size must be at least 2" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    # A fresh process finds the environment again from the run's config, as a user's evaluate does.
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.evaluate", "--run-dir", str(straight), "--episodes", "4"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and json.loads(out.stdout.strip().splitlines()[-1])["episodes"] == 4, out.stderr
