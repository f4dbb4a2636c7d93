"""log.py: what the console says while a run waits, and the across-seed summary of many runs
(rliable's conventions), on made-up rows."""

import json
import time

import numpy as np
import pytest
from scipy import stats

from jaxrl_mgpu import log as log_lib


def test_a_slow_wait_says_it_is_still_working(capsys, monkeypatch):
    monkeypatch.setattr(log_lib, "HEARTBEAT_S", 0.5)
    log = log_lib.RunLog(None, 0)
    with log.waiting("compiling the training chunk"):
        time.sleep(2.6)
    lines = [line for line in capsys.readouterr().out.splitlines() if "compiling the training chunk" in line]
    assert len(lines) >= 2 and lines[0].endswith("s so far")


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 11])
def test_iqm_is_the_25_percent_trimmed_mean(n):
    x = np.random.default_rng(n).normal(size=n) * 10
    assert log_lib.iqm(x) == pytest.approx(stats.trim_mean(x, 0.25))


def test_bootstrap_interval_is_reproducible_and_brackets_the_statistic():
    x = np.random.default_rng(0).normal(50.0, 10.0, size=20)
    low, high = log_lib.bootstrap_ci(x, np.mean)
    assert (low, high) == log_lib.bootstrap_ci(x, np.mean)
    assert low < x.mean() < high
    # About 1.96 standard errors either side, as a normal interval would be.
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert (high - low) / 2 == pytest.approx(half, rel=0.25)


def rows_of(finals: dict, swept=("lr",)):
    """Two log points per run: run -> (lr, seed, [return at 1, return at 2])."""
    rows = []
    for run, (lr, seed, returns) in finals.items():
        for update, ret in enumerate(returns, 1):
            rows.append({"update": update, "env_steps": 100 * update, "run": run, "seed": seed, "lr": lr,
                         "episode_return": ret})
    return rows


def test_summary_per_configuration(tmp_path):
    rows = rows_of({0: (0.1, 0, [1.0, 10.0]), 1: (0.1, 1, [2.0, 30.0]), 2: (0.1, 2, [3.0, None]),
                    3: (0.2, 0, [5.0, 100.0]), 4: (0.2, 1, [6.0, 200.0]), 5: (0.2, 2, [7.0, 300.0])})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = log_lib.write_runs_summary(tmp_path, ("lr",), "env_steps", target=25.0)
    first, second = summary
    assert (first["lr"], first["seeds"], first["runs"]) == (0.1, 3, [0, 1, 2])
    # A run whose last row has no return keeps its last logged one (run 2: 3.0).
    assert first["final_returns"] == [10.0, 30.0, 3.0]
    assert first["final_return_mean"] == pytest.approx(43 / 3)
    assert first["fraction_above_target"] == pytest.approx(1 / 3)
    assert second["final_return_iqm"] == pytest.approx(200.0)
    assert second["fraction_above_target"] == 1.0
    low, high = second["final_return_mean_ci95"]
    assert 100.0 <= low < 200.0 < high <= 300.0
    assert json.loads((tmp_path / "runs_summary.json").read_text()) == summary
    assert (tmp_path / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lr=0.1: 3 seeds, final return mean 14.3" in log_lib.runs_summary_lines(summary, ("lr",))[0]
