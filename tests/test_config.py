"""config/: a Python caller's options (api.train) are read as the command line's are."""

import pytest

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu.cli import ConfigError


@pytest.mark.parametrize("options, argv", [
    ({"num_envs": 64, "lr": 1e-3}, ["--num-envs", "64", "--lr", "1e-3"]),
    ({"config": "cartpole", "seed": 3}, ["--config", "cartpole", "--seed", "3"]),
    ({"resume": True, "run_dir": "r"}, ["--resume", "--run-dir", "r"]),
    ({"resume": "auto", "run_dir": "r"}, ["--resume", "auto", "--run-dir", "r"]),
    ({"auto_scale": True}, ["--auto-scale"]),
    ({"anneal_lr": False}, ["--no-anneal-lr"]),
])
def test_keyword_options_are_the_command_line_s(options, argv):
    given, parsed = config_lib.given_from(options), config_lib.parse_given(argv)
    assert given == parsed and given.flags == parsed.flags


def test_an_option_left_false_or_none_is_not_given():
    assert config_lib.given_from({"resume": False, "run_dir": None}) == {}


@pytest.mark.parametrize("options, words", [
    ({"num_env": 3}, "'num_env' is not an option"),
    ({"num_envs": 0}, "option: num_envs must be at least 1, got 0"),
    ({"policy": "rnn"}, "option: policy 'rnn' is not valid"),
    ({"auto_scale": True, "num_envs": 64}, "--auto-scale chooses --num-envs itself"),
])
def test_bad_keyword_options_are_one_line(options, words):
    with pytest.raises(ConfigError) as raised:
        config_lib.given_from(options)
    assert words in str(raised.value) and "\n" not in str(raised.value), raised.value
