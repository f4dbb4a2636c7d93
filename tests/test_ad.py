"""Algorithm Distillation: data-parallel equivalence, device sync, end to end with in-context
evaluation, and bad datasets (one line, exit code 2, nothing written)."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_trees_close, make_trainer, resolved
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs, evaluate, parallel, train
from jaxrl_mgpu.tools import histories, incontext
from jaxrl_mgpu.algos.ad import ad
from jaxrl_mgpu.data import rlds

# Every episode kept (AD's default keeps every 10th): the fixture's histories are 5 episodes long.
TINY = dict(algo="ad", env="DarkRoom", d_model=16, n_layers=2, n_heads=2, n_transit=24, ad_batch_size=16,
            ad_episode_stride=1, num_updates=4, log_every=2, lr=1e-3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """8 learning histories of 5 DarkRoom episodes each, from the real source learner."""
    out = tmp_path_factory.mktemp("ad") / "histories"
    assert histories.main(["--env", "DarkRoom", "--tasks", "8", "--steps", "100", "--out", str(out)]) == 0
    return out


def test_prepare_tokens_cross_episode_boundaries(dataset):
    h = rlds.read(dataset)
    steps = ad.prepare(h)
    # The first step of the second episode still sees the first episode's last action and reward.
    assert not steps.is_first[:, 20].any() and steps.is_first[:, 0].all()
    np.testing.assert_array_equal(steps.prev_action[:, 20], h.action[:, 19])
    np.testing.assert_array_equal(steps.prev_reward[:, 20], h.reward[:, 19])
    assert (steps.obs[:, ::20, -1] == 1).all() and steps.obs[:, 1:20, -1].sum() == 0  # episode-start feature
    every_other = ad.prepare(h, stride=2)  # episodes 0, 2, 4 kept, and now consecutive
    np.testing.assert_array_equal(every_other.action[:, 20:40], h.action[:, 40:60])
    np.testing.assert_array_equal(every_other.prev_reward[:, 20], h.reward[:, 19])


def one_step(cfg, devices, batch):
    """One AD optimizer step from the same init on `devices` devices, the global `batch` split
    over them; returns device 0's params and stats."""
    env, env_params = envs.make(cfg.env)
    par = parallel.setup("pmap", devices)
    algo = ad.make(cfg, env, env_params, ad.check_batch(resolved(cfg), devices))
    state = par.map(algo.init)(par.replicate(np.asarray(jax.random.PRNGKey(0))))
    split = jax.tree.map(lambda x: np.asarray(x).reshape((devices, -1) + x.shape[1:]), batch)
    learn = par.map(lambda s, b: algo.learn(s.params, s.opt_state, s.loss_scale, b))
    params, _, _, stats = learn(state, par.shard(split))
    return par.first(state.params), par.first(params), par.first(stats)


@pytest.mark.slow
def test_one_update_on_8_devices_equals_one_device(dataset):
    cfg = config_lib.build(dict(dataset=str(dataset), **TINY))
    data = jax.tree.map(jnp.asarray, ad.prepare(rlds.read(dataset)))
    batch = ad.sample(data, jax.random.PRNGKey(1), cfg.ad_batch_size, cfg.n_transit)  # one global batch
    assert batch.obs.shape == (16, 24, 3) and batch.action.shape == (16, 24)
    init, on1, stats1 = one_step(cfg, 1, batch)
    _, on8, stats8 = one_step(cfg, 8, batch)
    assert_trees_close(on1, on8, rtol=1e-5)
    assert_trees_close(stats1, stats8, rtol=1e-5)
    assert not np.allclose(init["params"]["embed"]["kernel"], on1["params"]["embed"]["kernel"])


@pytest.mark.slow
def test_devices_train_on_own_tasks_and_stay_in_sync(dataset):
    trainer = make_trainer(8, dataset=str(dataset), **TINY)
    (data,) = trainer.data
    local = trainer.par.local(data.action)
    assert local.shape == (8, 1, 100)  # 8 tasks over 8 devices: one learning history each
    h = rlds.read(dataset)
    np.testing.assert_array_equal(local[:, 0], h.action)
    state = trainer.init_state()
    state, chunk = trainer.chunk_fn(2, state)(state)
    for leaf in jax.tree.leaves(trainer.par.local(state.params)):
        np.testing.assert_array_equal(leaf[0], leaf[-1])
    losses = trainer.par.first(chunk.losses)
    assert np.isfinite(losses["loss/cross_entropy"]) and 0 <= losses["loss/accuracy"] <= 1


@pytest.mark.slow
def test_train_then_evaluate_in_context(dataset, tmp_path, capsys):
    run_dir = tmp_path / "run"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert train.main(flags + ["--dataset", str(dataset), "--run-dir", str(run_dir)]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["update"] == 4 and rows[-1]["tokens"] == 4 * 16 * 24 and rows[-1]["episode_return"] is None
    capsys.readouterr()

    assert evaluate.main(["--run-dir", str(run_dir), "--in-context", "--episodes", "3", "--envs-per-goal", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["step"] == 4 and out["goals"] == "test" and out["envs"] == 8 and len(out["mean_return"]) == 3
    assert {"source_first", "source_final", "random_return"} <= set(out)
    saved = json.loads((run_dir / "incontext-test.json").read_text())
    assert np.asarray(saved["returns"]).shape == (8, 3) and len(saved["source"]["mean_return"]) == 5
    assert saved["goal_cells"] == [list(g) for g in np.asarray(envs.darkroom.goals("DarkRoom", "test", 0)).tolist()]
    assert (run_dir / "incontext-test.png").read_bytes()[:4] == b"\x89PNG"
    # The like-for-like reference: the source run afresh on the same (test) goals, with the
    # dataset's source config and length, one learner per evaluation environment.
    test_goals = np.asarray(saved["goal_cells"])
    same = histories.run("DarkRoom", test_goals, 100, 1, histories.LearnerConfig(), parallel.setup())
    np.testing.assert_allclose(saved["source_same_goals"]["mean_return"],
                               histories.episode_returns(same, 20).mean(0), rtol=1e-6)
    assert out["source_same_goals_final"] == round(float(histories.episode_returns(same, 20).mean(0)[-1]), 3)

    # Greedy acting writes its own files and leaves the sampled ones alone.
    assert evaluate.main(["--run-dir", str(run_dir), "--in-context", "--episodes", "3", "--envs-per-goal", "1",
                          "--greedy"]) == 0
    greedy = json.loads(capsys.readouterr().out.strip())
    assert json.loads((run_dir / "incontext-test-greedy.json").read_text())["greedy"] is True
    assert json.loads((run_dir / "incontext-test.json").read_text())["greedy"] is False
    assert greedy["random_return"] == out["random_return"]  # the same uniform baseline

    # Without --in-context the model would act from an empty context: refused in one line
    # (tests/test_resume_and_usage.py), not a meaningless return.


def corrupt(dataset, tmp_path):
    """A copy of `dataset` with one byte of its shard flipped."""
    copy = tmp_path / "corrupt"
    shutil.copytree(dataset, copy)
    shard = next(copy.glob("*.array_record-*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return copy


BAD = {  # case: (flags over TINY + --dataset, what the one line must say)
    "missing": (lambda ds, tmp: {"dataset": str(tmp / "nothing")}, "no dataset at"),
    "other_env": (lambda ds, tmp: {"env": "DarkRoomHard"}, "histories of 'DarkRoom', not of --env 'DarkRoomHard'"),
    "corrupt": (lambda ds, tmp: {"dataset": str(corrupt(ds, tmp))}, "is corrupt"),
    "no_dataset": (lambda ds, tmp: {"dataset": None}, "--algo ad needs --dataset"),
    "long_window": (lambda ds, tmp: {"n_transit": 1000}, "--n-transit 1000 is longer than the learning histories"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_dataset_is_one_line_exit_2_and_writes_nothing(dataset, tmp_path, capsys, case):
    overrides, message = BAD[case]
    flags = {**TINY, "dataset": str(dataset), **overrides(dataset, tmp_path)}
    run_dir = tmp_path / "run"
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items() if v is not None] + ["--run-dir", str(run_dir)]
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not run_dir.exists()


@pytest.mark.slow
def test_throughput_is_one_json_line(dataset, capsys):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert incontext.main(["--throughput", "--dataset", str(dataset)] + flags) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert out["devices"] == 8 and out["reader_steps"] == 8 * 100
    assert out["reader_windows_per_s"] > 0 and out["train_windows_per_s"] > 0
