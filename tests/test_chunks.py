"""chunks.py's host side: what the loop reads of a chunk (`ChunkReader`) with one run and with
many, where some go non-finite. A stand-in for the devices: `par.first` / `par.runs_of` give
the numbers as numpy, as parallel.Parallel does for arrays on the devices."""

import types

import numpy as np
import pytest

from jaxrl_mgpu.chunks import Chunk, ChunkReader, NonFinite
from jaxrl_mgpu.envs.vec import EpisodeStats


def chunk(first_bad, loss, returns):
    """A chunk of `len(first_bad)` runs (one: a single run) with these numbers."""
    n = len(first_bad)
    episodes = EpisodeStats(np.asarray(returns, np.float32), np.full(n, 20.0, np.float32), np.full(n, 2.0, np.float32))
    return Chunk({"loss": np.asarray(loss, np.float32)}, episodes, np.asarray(first_bad, np.int32), {},
                 np.full(n, 4, np.int32))


def single():
    return types.SimpleNamespace(runs=None, first=lambda tree: __import__("jax").tree.map(lambda x: x[0], tree))


def many(runs):
    return types.SimpleNamespace(runs=runs, runs_of=lambda tree: tree)


def test_one_run_reads_its_row_and_a_non_finite_update_is_named():
    reader = ChunkReader(single())
    row = reader.read(chunk([-1], [0.5], [30.0]), 11, row=True)
    assert row["loss"] == pytest.approx(0.5) and row["episode_return"] == pytest.approx(15.0)
    assert reader.read(chunk([-1], [0.5], [30.0]), 11, row=False) is None  # the check alone
    with pytest.raises(NonFinite, match="non-finite loss at update 13"):
        reader.read(chunk([2], [np.nan], [30.0]), 11, row=False)


def test_many_runs_keep_who_diverged_tell_it_once_and_stop_when_all_have():
    told = []
    reader = ChunkReader(many(3), diverged={2: 5}, on_diverged=lambda *a: told.append(a))  # run 2: a resume's
    row = reader.read(chunk([-1, 1, -1], [1.0, np.nan, 3.0], [10.0, 0.0, 50.0]), 21, row=True)
    assert reader.diverged == {2: 5, 1: 22} and told == [(1, 22, 2)]
    assert row["runs"][1]["diverged_at"] == 22 and row["runs"][2]["diverged_at"] == 5
    assert row["loss"] == pytest.approx(1.0)  # the mean over the runs still learning: run 0 alone
    reader.read(chunk([-1, 0, 0], [2.0, np.nan, np.nan], [0.0, 0.0, 0.0]), 25, row=False)
    assert told == [(1, 22, 2)] and reader.diverged[1] == 22  # told once; its first update kept
    with pytest.raises(NonFinite, match="every run"):
        reader.read(chunk([3, 0, 0], [np.nan] * 3, [0.0] * 3), 29, row=False)


def test_a_loss_grown_a_million_times_is_told_once_per_run():
    told = []
    reader = ChunkReader(single(), on_growth=told.append)
    for loss in (0.0, 3.0, 300.0, 2.9e6):  # zero: before learning starts; then 3, then growth within bounds
        reader.read(chunk([-1], [loss], [1.0]), 1, row=True)
    assert told == []
    reader.read(chunk([-1], [3.1e6], [1.0]), 41, row=True)
    reader.read(chunk([-1], [6.5e18], [1.0]), 51, row=True)
    assert len(told) == 1 and "loss is 3.1e+06 in the log interval from update 41 (first logged: 3)" in told[0], told
    assert "\n" not in told[0]
    # many runs: each run's own first size; the mean row is not what is watched; a loss past
    # LOSS_LIMIT is told even where it was that large from the first row (run 2)
    told.clear()
    reader = ChunkReader(many(3), on_growth=told.append)
    reader.read(chunk([-1, -1, -1], [0.5, 1e3, 6e19], [1.0] * 3), 1, row=True)
    assert told == ["run 2: loss is 6e+19 in the log interval from update 1 (first logged: 6e+19): training is "
                    "diverging though still finite (a smaller --lr?)"], told
    reader.read(chunk([-1, -1, -1], [2e6, 2e8, 6e19], [1.0] * 3), 11, row=True)
    assert len(told) == 2 and told[1].startswith("run 0: loss is 2e+06"), told


def test_a_run_whose_loss_explodes_says_so_once_and_finishes(tmp_path, capsys):
    """PPO at --lr 1e9: its value loss is finite but enormous from the first row; the run says so
    in one warning line, once, and completes (it is the user's call)."""
    from helpers import TINY, run
    assert run(*TINY, "--lr", "1e9", "--total-timesteps", str(16 * 16 * 6), "--run-dir", str(tmp_path / "run")) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "loss/value is" in warnings[0] and "diverging though still finite" in warnings[0]


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_the_evaluation_compiled_beside_training_is_the_one_compiled_at_the_first_evaluation(backend):
    import jax
    from helpers import make_trainer
    overrides = dict(num_envs=8, num_steps=8, num_minibatches=1, hidden_size=8, total_timesteps=64, eval_episodes=4)
    ahead, lazy = make_trainer(2, backend, **overrides), make_trainer(2, backend, **overrides)
    ahead.compile_evaluation()
    assert isinstance(ahead._eval_ready.result(), jax.stages.Compiled)
    params = ahead.init_state().params
    assert ahead.evaluate(params, 3) == lazy.evaluate(params, 3)
