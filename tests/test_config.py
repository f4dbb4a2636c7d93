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


def test_each_algorithm_starts_from_its_own_defaults_under_the_preset_and_the_flags():
    """--algo sac alone takes SAC's usual settings, not PPO's or DQN's (it used to run with
    --tau 1, 32 x 128 steps per update and 64-wide tanh nets, and did not learn); a preset and
    the flags still override them, and PPO keeps the declared defaults."""
    sac = config_lib.parse_args(["--algo", "sac"])
    assert (sac.tau, sac.num_envs, sac.num_steps, sac.hidden_size, sac.activation, sac.anneal_lr, sac.lr) == \
        (0.005, 8, 8, 256, "relu", False, 3e-4)
    assert config_lib.parse_args(["--algo", "sac", "--tau", "0.1"]).tau == 0.1
    preset = config_lib.parse_args(["--config", "pendulum-sac"])  # algo: sac, hidden_size: 128
    assert (preset.hidden_size, preset.buffer_size, preset.log_every) == (128, 16000, 25)
    assert config_lib.parse_args(["--algo", "td3"]).buffer_size == 1_000_000
    assert config_lib.parse_args(["--algo", "dqn"]).target_update_every == 100
    assert config_lib.parse_args(["--algo", "ad"]).env == "DarkRoom"
    ppo = config_lib.parse_args([])
    assert (ppo.num_envs, ppo.hidden_size) == (32, 64) and ppo == config_lib.build({}) and not hasattr(ppo, "tau")
    # the Python API builds its config the same way
    assert config_lib.build(config_lib.given_from({"algo": "sac"})) == sac


def test_another_algo_over_a_preset_leaves_out_the_preset_s_options_of_its_own_algorithm():
    """`--config dmc-cheetah-run-sac --algo td3` (experiments/gpu/sac.sh's FLAGS="--algo td3")
    was refused for the preset's --init-alpha; now the run is TD3 with the preset's other
    options, and the plan says what it left out. A flag the chosen algorithm has not is still
    refused."""
    given = config_lib.parse_given(["--config", "brax-humanoid-sac", "--algo", "td3"])
    td3 = config_lib.build(given)
    assert (td3.algo, td3.tau, td3.critic_hidden, td3.n_step) == ("td3", 0.1, "1024,512,256", 3)
    assert given.dropped == ("init_alpha",) and "init_alpha" not in given
    assert config_lib.parse_given(["--config", "brax-humanoid-sac", "--algo", "sac"]).dropped == ()
    with pytest.raises(ConfigError, match=r"^--init-alpha is only for --algo sac; this run is --algo td3"):
        config_lib.parse_args(["--config", "brax-humanoid-sac", "--algo", "td3", "--init-alpha", "0.1"])


@pytest.mark.parametrize("name", config_lib.preset_names())
def test_every_preset_builds_a_valid_run_whose_options_its_algorithm_reads(name):
    given = config_lib.parse_given(["--config", name])
    cfg, _ = config_lib.follow_log_grid(config_lib.build(given), given.flags)
    config_lib.check_applicable(config_lib.validate(cfg), given)
