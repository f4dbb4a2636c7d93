"""The tiny continuous-control preset learns on a laptop CPU within CI's budget (issue 50: a short
run of it that learns)."""

import json

import pytest

from helpers import run

pytestmark = pytest.mark.slow  # every test here is slow: none is in the fast tier


def test_the_brax_inverted_pendulum_preset_learns_in_a_fraction_of_its_run(tmp_path):
    pytest.importorskip("brax")
    run_dir = tmp_path / "run"
    # A third of the preset's 614,400 steps: 20 updates of 256 envs x 40 steps, on one device.
    assert run("--config", "brax-inverted-pendulum", "--total-timesteps", str(20 * 256 * 40), "--devices", "1",
               "--checkpoint-every", "0", "--run-dir", str(run_dir)) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0]["episode_return"], rows[-1]["episode_return"]
    # The pole falls within a few steps at first (about 8 steps of reward 1); after 200k steps
    # the policy holds it for well over a hundred.
    assert first < 30 and last > 150 and last > 5 * first, (first, last)
