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
