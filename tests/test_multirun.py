"""Many runs in one program (--num-seeds, --sweep: multirun.py), on virtual CPU devices: each run
is the single run it stands for, whatever the device count and layout."""

import json

import jax
import numpy as np
import pytest

from helpers import assert_trees_close, make_trainer, run, tensorboard_scalars

# One minibatch: then the device count does not change an update's numbers (each device
# shuffles its own share of the batch, so with several minibatches it would).
SMALL = dict(num_envs=8, num_steps=8, update_epochs=2, num_minibatches=1, hidden_size=16,
             total_timesteps=8 * 8 * 4, log_every=2)


def run_updates(trainer, n: int = 2):
    state = trainer.init_state()
    return trainer.chunk_fn(n, state)(state)


def per_run(trainer, tree):
    """[runs, ...] host arrays of a multi-run state's leaves."""
    return trainer.par.runs_of(tree)


@pytest.fixture(scope="module")
def two_seeds_on_two_devices():
    """--num-seeds 2 on 2 devices (pmap): one run per device, no collective across them."""
    trainer = make_trainer(2, "pmap", num_seeds=2, seed=3, **SMALL)
    assert (trainer.par.groups, trainer.par.data_devices, trainer.par.runs_per_device) == (2, 1, 1)
    state, chunk = run_updates(trainer)
    return trainer, per_run(trainer, state.params), per_run(trainer, chunk.losses)


@pytest.mark.slow
def test_run_i_equals_the_single_run_with_seed_plus_i(two_seeds_on_two_devices):
    trainer, params, losses = two_seeds_on_two_devices
    for i in range(2):
        single = make_trainer(1, seed=3 + i, **SMALL)
        state, chunk = run_updates(single)
        assert_trees_close(single.par.first(state.params), jax.tree.map(lambda x: x[i], params), rtol=1e-5, atol=1e-6)
        assert_trees_close(single.par.first(chunk.losses), jax.tree.map(lambda x: x[i], losses), rtol=1e-4, atol=1e-6)
    # The runs differ (seeds 3 and 4), so the comparison above could fail.
    assert max(jax.tree.leaves(jax.tree.map(lambda x: float(np.abs(x[0] - x[1]).max()), params))) > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("backend,devices,layout", [
    ("pmap", 1, (1, 1, 2)),       # both runs on the one device
    ("pmap", 4, (1, 4, 2)),       # pmap, 2 runs < 4 devices: every run on every device
    ("shard_map", 4, (2, 2, 1)),  # a 2 x 2 mesh: each run on its own 2 devices
])
def test_a_multi_run_program_does_not_depend_on_the_device_count(two_seeds_on_two_devices, backend, devices, layout):
    _, params, losses = two_seeds_on_two_devices
    trainer = make_trainer(devices, backend, num_seeds=2, seed=3, **SMALL)
    assert (trainer.par.groups, trainer.par.data_devices, trainer.par.runs_per_device) == layout
    state, chunk = run_updates(trainer)
    assert_trees_close(per_run(trainer, state.params), params, rtol=1e-5, atol=1e-6)
    assert_trees_close(per_run(trainer, chunk.losses), losses, rtol=1e-4, atol=1e-6)


SWEEP = "lr=1e-3,3e-4 gamma=0.9,0.99"


@pytest.mark.slow
def test_sweep_values_are_applied_per_run():
    """--sweep lr=a,b gamma=c,d: 4 configurations x 1 seed; run i equals the single run with
    configuration i's values (configuration major: lr varies slowest, as written)."""
    multi = make_trainer(2, "shard_map", sweep=SWEEP, **SMALL)
    assert multi.runs.count == 4 and multi.par.runs_per_device == 2
    state, _ = run_updates(multi)
    params = per_run(multi, state.params)
    assert [multi.runs.hparams(i) for i in range(4)] == [{"lr": 1e-3, "gamma": 0.9}, {"lr": 1e-3, "gamma": 0.99},
                                                          {"lr": 3e-4, "gamma": 0.9}, {"lr": 3e-4, "gamma": 0.99}]
    for i in (1, 2):  # between them every value of each option (a single run compiles its own program)
        lr, gamma = multi.runs.hparams(i).values()
        single = make_trainer(1, lr=lr, gamma=gamma, **SMALL)
        state1, _ = run_updates(single)
        assert_trees_close(single.par.first(state1.params), jax.tree.map(lambda x: x[i], params), rtol=1e-5, atol=1e-6)


def test_one_program_serves_every_sweep_value():
    """The swept values are inputs of the compiled chunk, not constants in it: two sweeps with
    different values lower to the same program."""
    def program(sweep):
        trainer = make_trainer(2, "shard_map", sweep=sweep, **SMALL)
        return trainer.lower(trainer.abstract_state()).as_text()

    assert program("lr=1e-3,3e-4 ent_coef=0.0,0.5") == program("lr=7e-3,1e-5 ent_coef=0.25,0.125")


@pytest.mark.parametrize("argv,message", [
    (["--sweep", "foo=1,2"], "--sweep foo: no such option"),
    (["--sweep", "num_envs=4,8"], "--sweep num_envs: --num-envs changes the compiled program"),
    (["--sweep", "hidden_size=8,16"], "--sweep hidden_size: --hidden-size changes the compiled program"),
    (["--sweep", "lr=1e-3,abc"], "--sweep lr=1e-3,abc: the values must be numbers"),
    (["--sweep", "lr=1e-3,-1"], "--sweep lr=1e-3,-1: --lr must be > 0, got -1.0"),
    (["--sweep", "gamma=0.9,1.5"], "--sweep gamma=0.9,1.5: --gamma must be in [0, 1], got 1.5"),
    (["--sweep", "lr"], "--sweep 'lr': write NAME=v1,v2,..."),
    (["--sweep", "lr=1e-3", "lr=1e-4"], "--sweep lr is given twice"),
    (["--sweep", "clip_eps=0.1,0.2", "--algo", "dqn"], "--sweep clip_eps: --clip-eps changes the compiled program"),
    (["--algo", "td3", "--env", "Pendulum-v1", "--critic", "categorical", "--sweep", "v_max=50,-300"],
     "--sweep v_max=-300: --v-min -250 must be below --v-max -300"),  # each configuration is checked whole
    (["--algo", "td3", "--env", "Pendulum-v1", "--noise-std-max", "0.3", "--sweep", "noise_std_min=0.1,0.5"],
     "--sweep noise_std_min=0.5: --noise-std-min 0.5 is above --noise-std-max 0.3"),
    (["--num-seeds", "0"], "--num-seeds must be at least 1, got 0"),
    (["--num-seeds", "2", "--algo", "ad"], "--num-seeds / --sweep: --algo ad distils one dataset"),
    (["--num-seeds", "2", "--auto-scale"], "--num-seeds / --sweep: --auto-scale sizes one run"),
    (["--num-seeds", "2", "--policy", "transformer"], "--num-seeds / --sweep: --policy transformer is not supported"),
    (["--num-seeds", "2", "--eval-every", "10"], "--num-seeds / --sweep: --eval-every is not supported"),
])
def test_bad_multi_run_options_are_one_line_errors(tmp_path, capsys, argv, message):

    assert run(*argv, "--run-dir", str(tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: " + message), err
    assert "\n" not in err
    assert not (tmp_path / "run").exists()


CLI = ["--num-seeds", "2", "--sweep", "ent_coef=0.0,0.1", "--num-envs", "4", "--num-steps", "8", "--num-minibatches", "1",
       "--update-epochs", "1", "--hidden-size", "16", "--total-timesteps", str(4 * 8 * 6), "--log-every", "2",
       "--checkpoint-every", "2", "--devices", "2", "--parallel", "shard_map", "--lr", "0.05",
       "--target-return", "15"]  # a large lr: the runs' policies part ways within a few updates
TIMING = ("sps", "time")


def metrics(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run directory of 4 runs (2 configurations x 2 seeds), trained from the command line."""
    full = tmp_path_factory.mktemp("multirun") / "full"
    assert run(*CLI, "--run-dir", str(full)) == 0
    return full


@pytest.mark.slow
def test_per_run_rows_summary_and_an_exact_resume(trained, tmp_path):
    """The command line: one metrics.jsonl row per run and log point with the run's identity,
    a TensorBoard run each, the across-seed summary; a run stopped at update 2 and resumed
    logs the same numbers as one that never stopped (its checkpoint holds every run)."""
    full, part = trained, tmp_path / "part"
    rows = metrics(full)
    assert len(rows) == 3 * 4  # 6 updates logged every 2, 2 configurations x 2 seeds
    assert {(r["run"], r["seed"], r["ent_coef"]) for r in rows} == {(0, 0, 0.0), (1, 1, 0.0), (2, 0, 0.1), (3, 1, 0.1)}
    assert sorted(p.name for p in (full / "runs").iterdir()) == [
        "run00-seed0-ent_coef=0", "run01-seed1-ent_coef=0", "run02-seed0-ent_coef=0.1",
        "run03-seed1-ent_coef=0.1"]
    summary = json.loads((full / "runs_summary.json").read_text())
    assert [(s["ent_coef"], s["seeds"], s["runs"]) for s in summary] == [(0.0, 2, [0, 1]), (0.1, 2, [2, 3])]
    assert (full / "learning_curves.png").exists()
    # The runs' entropy bonus differs, so their losses do.
    last = {r["run"]: r for r in rows if r["update"] == 6}
    assert last[0]["loss/total"] != last[2]["loss/total"]
    # Each run's TensorBoard run holds its own numbers (one event per log point); the run
    # directory's holds their means.
    for i, name in enumerate(sorted(p.name for p in (full / "runs").iterdir())):
        scalars = tensorboard_scalars(full / "runs" / name)
        mine = [r for r in rows if r["run"] == i]
        assert [step for step, _ in scalars["loss/total"]] == [r["env_steps"] for r in mine]
        assert [v for _, v in scalars["loss/total"]] == pytest.approx([r["loss/total"] for r in mine], rel=1e-6)
        assert "run" not in scalars and "seed" not in scalars
    means = tensorboard_scalars(full)["loss/total"]
    assert means[-1] == (6 * 32, pytest.approx(np.mean([last[i]["loss/total"] for i in range(4)]), rel=1e-5))

    assert run(*CLI, "--run-dir", str(part), "--stop-at-update", "2") == 0
    assert len(metrics(part)) == 4
    assert run(*CLI, "--run-dir", str(part), "--resume") == 0
    assert metrics(part) == rows
    assert json.loads((part / "runs_summary.json").read_text()) == summary

    # Resumed on 4 devices (one run each instead of two): the checkpoint is laid out by run, not
    # by device, so it re-lays out; vmapping one run instead of two may round differently.
    moved = tmp_path / "moved"
    assert run(*CLI, "--run-dir", str(moved), "--stop-at-update", "2") == 0
    assert run(*CLI, "--run-dir", str(moved), "--resume", "--devices", "4") == 0
    for got, want in zip(metrics(moved), rows, strict=True):
        assert got.keys() == want.keys()
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


def evaluate(capsys, *argv) -> list[dict]:
    from jaxrl_mgpu import evaluate as evaluate_lib
    capsys.readouterr()
    assert evaluate_lib.main(["--episodes", "8", "--devices", "2", *map(str, argv)]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
def test_evaluate_every_run_or_one(trained, tmp_path, capsys):
    """`evaluate` gives a line per run, with its identity; `--run i` evaluates run i, which
    equals evaluating the single run it stands for (seed 1, ent_coef 0.1: run 3)."""
    every = evaluate(capsys, "--run-dir", trained)
    assert [(r["run"], r["seed"], r["ent_coef"], r["step"]) for r in every] == [
        (0, 0, 0.0, 6), (1, 1, 0.0, 6), (2, 0, 0.1, 6), (3, 1, 0.1, 6)]
    assert evaluate(capsys, "--run-dir", trained, "--run", 3) == every[3:]
    single = tmp_path / "single"
    argv = CLI[4:-2]  # without --num-seeds, --sweep and --target-return
    assert "--num-seeds" not in argv and "--sweep" not in argv and "--target-return" not in argv
    assert run(*argv, "--seed", "1", "--ent-coef", "0.1", "--run-dir", str(single)) == 0
    (alone,) = evaluate(capsys, "--run-dir", single)
    assert alone["mean_return"] == every[3]["mean_return"] and alone["episodes"] == 8
    # Differently seeded runs sample different episodes, so the comparison could fail.
    assert len({r["mean_return"] for r in every}) > 1
    assert evaluate_lib_fails(capsys, "--run-dir", trained, "--run", 4).startswith("error: --run 4: the run directory "
                                                                                "holds runs 0..3")


def evaluate_lib_fails(capsys, *argv) -> str:
    from jaxrl_mgpu import evaluate as evaluate_lib
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        evaluate_lib.main([*map(str, argv)])
    assert e.value.code == 2
    return capsys.readouterr().err.strip()


def assert_runs_equal_single_runs(options: dict, sweep: str, runs: tuple[int, ...], updates: int, tol: float):
    """2 seeds x `sweep` on a 2-device mesh, `updates` updates: runs `runs` equal their single runs
    (params to `tol`, losses to 10 x `tol`); returns the multi-run program's losses [runs, ...]."""
    multi = make_trainer(2, "shard_map", num_seeds=2, sweep=sweep, **options)
    state, chunk = run_updates(multi, updates)
    params, losses = per_run(multi, state.params), per_run(multi, chunk.losses)
    for i in runs:
        single = make_trainer(1, seed=multi.runs.seed_of(i), **multi.runs.hparams(i), **options)
        state1, chunk1 = run_updates(single, updates)
        assert_trees_close(single.par.first(state1.params), jax.tree.map(lambda x: x[i], params), rtol=tol,
                           atol=tol / 10)
        assert_trees_close(single.par.first(chunk1.losses), jax.tree.map(lambda x: x[i], losses), rtol=10 * tol,
                           atol=tol / 10)
    return losses


DQN = dict(algo="dqn", num_envs=4, num_steps=4, hidden_size=16, buffer_size=64, replay_batch_size=8,
           learning_starts=16, total_timesteps=4 * 4 * 6, log_every=2, target_update_every=4)


@pytest.mark.slow
def test_dqn_runs_equal_their_single_runs():
    """DQN, 2 seeds x a sweep of --eps-end, on a 2-device mesh (2 runs per device): runs with
    either value of each equal their single runs (replay, exploration and gradient steps)."""
    losses = assert_runs_equal_single_runs(DQN, "eps_end=0.05,0.5", (1, 2), updates=4, tol=1e-5)
    assert losses["epsilon"][1] != losses["epsilon"][2]  # the swept value reached the runs


SAC = dict(algo="sac", env="Pendulum-v1", num_envs=4, num_steps=4, hidden_size=16, buffer_size=64,
           replay_batch_size=8, learning_starts=16, updates_per_step=1.0, tau=0.005, anneal_lr=False,
           total_timesteps=4 * 4 * 6, log_every=2)


@pytest.mark.slow
def test_sac_runs_equal_their_single_runs_over_their_first_updates():
    """SAC, 2 seeds x a sweep of --gamma: over the first updates (uniform actions, then 5 of
    gradient steps on the replay) each run's params and losses equal its single run's up to float
    rounding. (Later the rounding compounds through the replay: docs/many-runs.md.)"""
    losses = assert_runs_equal_single_runs(SAC, "gamma=0.99,0.9", (0, 3), updates=6, tol=1e-4)
    assert float(np.asarray(losses["loss/critic"][0])) > 0  # the gradient steps ran, so the comparison could fail


@pytest.mark.slow
def test_a_run_that_diverges_stops_alone():
    """--sweep lr=1e-3,1e30: the second run's first update is non-finite. It keeps its initial
    parameters (where its single run stops with an error), for good: its optimizer state is
    NaN, so every later update is rejected too. The first run is still its single run."""
    multi = make_trainer(2, "shard_map", sweep="lr=1e-3,1e30", **SMALL)
    initial = per_run(multi, multi.init_state().params)
    state, chunk = run_updates(multi, 3)
    assert per_run(multi, chunk.first_bad).tolist() == [-1, 0]
    state, chunk = multi.chunk_fn(2, state)(state)
    assert per_run(multi, chunk.first_bad).tolist() == [-1, 0]  # still: every update of it
    params, opt_state = per_run(multi, state.params), per_run(multi, state.opt_state)
    assert_trees_close(jax.tree.map(lambda x: x[1], initial), jax.tree.map(lambda x: x[1], params), rtol=0, atol=0)
    floats = [x for x in jax.tree.leaves(opt_state) if np.issubdtype(x.dtype, np.floating)]
    assert all(np.isnan(x[1]).all() and np.isfinite(x[0]).all() for x in floats)
    single = make_trainer(1, lr=1e-3, **SMALL)
    state1, _ = run_updates(single, 5)
    assert_trees_close(single.par.first(state1.params), jax.tree.map(lambda x: x[0], params), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_the_command_line_reports_a_diverged_run_and_the_others_finish(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--num-seeds", "2", "--sweep", "lr=0.05,1e30", *CLI[4:], "--run-dir", str(run_dir)]
    argv.remove("--lr"), argv.remove("0.05")
    assert run(*argv) == 0
    out = capsys.readouterr().out
    rows = metrics(run_dir)
    assert {r["run"] for r in rows if "diverged_at" in r} == {2, 3}  # the lr 1e30 runs, and only they
    at = {r["run"]: r["diverged_at"] for r in rows if "diverged_at" in r}
    assert all(r["diverged_at"] == at[r["run"]] for r in rows if r["run"] >= 2)
    for run_ in (2, 3):  # said once, when it happened
        assert out.count(f"run {run_}, seed {run_ - 2}, lr 1e+30: non-finite loss or parameters at update "
                         f"{at[run_]}; this run stops learning there") == 1, out
    assert all(r["episode_return"] is not None and "diverged_at" not in r for r in rows if r["run"] < 2)
    assert "(mean of 2 runs; 2 diverged)" in out
    summary = json.loads((run_dir / "runs_summary.json").read_text())
    assert [s.get("diverged") for s in summary] == [None, {"2": at[2], "3": at[3]}]
    assert f"2 diverged (run 2 at update {at[2]}, run 3 at update {at[3]})" in out
    assert json.loads((run_dir / "summary.json").read_text())["diverged_runs"] == \
        f"run 2 at update {at[2]}, run 3 at update {at[3]}"
    # Stopped before the divergence and resumed after it: the same rows as without the stop.
    part = tmp_path / "part"
    assert run(*argv[:-1], str(part), "--stop-at-update", str(at[2])) == 0
    assert run(*argv[:-1], str(part), "--resume") == 0
    assert metrics(part) == rows
    # Every run non-finite: the run stops with the one-line error of a single run.
    assert run(*[a if a != "lr=0.05,1e30" else "lr=1e30,1e31" for a in argv[:-1]], str(tmp_path / "all")) == 1
    assert "non-finite loss or parameters in every run" in capsys.readouterr().err
