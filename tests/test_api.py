"""The Python API (api.train): the command line's run, from keyword options, with each log row
given to a callback and the final state returned."""

import json

import jax
import numpy as np
import pytest

from jaxrl_mgpu import api
from jaxrl_mgpu.cli import ConfigError

from helpers import run, without_timing

TINY = {"num_envs": 16, "num_steps": 16, "num_minibatches": 2, "hidden_size": 16, "total_timesteps": 16 * 16 * 4,
        "log_every": 2, "checkpoint_every": 2}


def flags(options: dict) -> list[str]:
    return [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.slow
def test_train_from_python_is_the_command_line_s_run_with_rows_and_state(tmp_path, capsys):
    rows = []
    result = api.train(**TINY, run_dir=str(tmp_path / "api"), on_row=rows.append)
    assert result.code == 0 and result.updates == 4 and result.run_dir == str(tmp_path / "api")
    written = [json.loads(line) for line in (tmp_path / "api" / "metrics.jsonl").read_text().splitlines()]
    assert rows == written and result.last_row == written[-1] and [r["update"] for r in rows] == [2, 4]
    assert jax.tree.leaves(result.state.params)[0].shape[0] == 8  # on the devices: a leading device axis

    assert run(*flags(TINY), "--run-dir", str(tmp_path / "cli")) == 0
    cli = [json.loads(line) for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    assert [without_timing(r) for r in rows] == [without_timing(r) for r in cli]

    more = api.train(run_dir=str(tmp_path / "api"), resume=True, total_timesteps=16 * 16 * 6, on_row=rows.append)
    assert more.code == 0 and more.updates == 6 and rows[-1]["update"] == 6
    jax.tree.map(lambda x: np.testing.assert_array_equal(np.isfinite(x), True), more.state.params)


@pytest.mark.parametrize("options, words", [
    ({"num_envz": 3}, "'num_envz' is not an option"),
    ({"num_envs": "many"}, "option: num_envs must be an integer, got 'many'"),
    ({"lr": -1.0}, "lr"),
    ({"config": "no-such-preset"}, "no-such-preset"),
    ({"on_row": 5}, "on_row must be a function of one log row (a dict), got 5"),
    ({"on_row": lambda: None}, "must take one argument, the log row"),
    ({"on_row": lambda row, extra: None}, "must take one argument, the log row"),
])
def test_bad_options_raise_the_command_line_s_error_and_write_nothing(options, words, tmp_path):
    with pytest.raises(ConfigError) as raised:
        api.train(**options, run_dir=str(tmp_path / "run"))
    assert words in str(raised.value) and "\n" not in str(raised.value), raised.value
    assert not (tmp_path / "run").exists()
