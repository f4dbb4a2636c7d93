"""The command line: bad input gives one line and exit code 2; a short run learns."""

import json
import os
import subprocess
import sys

import jax
import pytest

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import train


def run_main(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        train.main(list(argv))
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("argv, names", [
    (["--env", "NoSuchEnv-v0"], ["--env", "CartPole-v1"]),
    (["--algo", "sarsa"], ["--algo", "ppo"]),
    (["--num-envs", "12"], ["--num-envs", "8 devices"]),
    (["--num-envs", "16", "--num-steps", "10", "--num-minibatches", "3"], ["--num-minibatches"]),
    (["--devices", "9"], ["--devices", "1..8"]),
    (["--config", "no-such-preset"], ["--config", "cartpole"]),
    (["--parallel", "threads"], ["--parallel", "shard_map"]),
    (["--lr", "fast"], ["--lr must be a number", "fast"]),
    (["--no-such-flag", "1"], ["--no-such-flag"]),
    (["--policy", "transformer", "--mlp", "pallas"], ["--mlp pallas", "--precision bf16"]),
    (["--policy", "transformer", "--mlp", "pallas", "--precision", "bf16", "--d-model", "96", "--n-heads", "4"],
     ["--mlp pallas", "96"]),
    (["--policy", "transformer", "--attention", "pallas", "--precision", "bf16"], ["--attention pallas", "--algo ad"]),
    (["--algo", "ad", "--attention", "pallas", "--precision", "bf16", "--n-transit", "160"],
     ["--attention pallas", "160 tokens"]),
    pytest.param(["--policy", "transformer", "--attention", "cudnn", "--precision", "bf16"],
                 ["--attention cudnn", "cpu", "--attention xla"],
                 marks=pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN is there on GPUs")),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, names):
    run_dir = tmp_path / "run"
    code, err = run_main(capsys, *argv, "--run-dir", str(run_dir))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert not run_dir.exists()


def test_error_has_no_traceback_in_a_real_process(tmp_path):
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--env", "Nope", "--run-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, env={**os.environ})
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1


def test_help_explains_every_flag():
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--algo", "--env", "--policy", "--total-timesteps", "--num-envs", "--num-steps", "--num-minibatches",
                 "--update-epochs", "--lr", "--gamma", "--gae-lambda", "--clip-eps", "--ent-coef", "--vf-coef",
                 "--max-grad-norm", "--seed", "--run-dir", "--parallel", "--devices", "--log-every", "--config"):
        assert flag in out.stdout, flag


def test_help_is_the_common_options_and_the_groups_in_80_lines_of_100_columns():
    lines = config_lib.help_text(width=100).splitlines()
    assert len(lines) <= 80 and max(map(len, lines)) <= 100, (len(lines), max(map(len, lines)))
    text = "\n".join(lines)
    assert all(f"  {group} " in text for group in config_lib.groups())
    common = {name for name, o in config_lib.known_options().items() if o.common}
    for name, o in config_lib.known_options().items():
        if not o.internal:
            assert (f"  {config_lib.flag(name)} " in text or f"]{name.replace('_', '-')} " in text) == (name in common), name


def test_help_of_a_group_shows_its_options_and_help_all_every_one(capsys):
    for group in config_lib.groups():
        text = config_lib.help_text(group, width=100)
        assert all(config_lib.flag(n)[2:] in text for n, o in config_lib.known_options().items()
                   if o.group == group and not o.internal), group
    flags = {a for action in config_lib.parser()._actions for a in action.option_strings} - {"-h", "--help", "--help-all"}
    everything = config_lib.help_text("all", width=100).replace("--[no-]", "--")
    assert all(f.replace("--no-", "--") in everything for f in flags)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help", "ppo"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--reward-scale" in out and "--buffer-size" not in out
    code, err = run_main(capsys, "--help", "tuning")
    assert code == 2 and err.strip() == ("error: --help tuning: no such group; groups: run, env, learning, network, ppo, "
                                         "dqn, ad, sac-td3, multirun, async, devices, track (or all)")


def test_a_resume_may_change_num_envs_unless_it_shapes_the_algorithms_state():
    """--num-envs may change on a resume; DQN's replay is laid out per environment, so its runs keep it."""
    cfg, changes = config_lib.resumed(config_lib.build(dict(algo="ppo")).to_dict(), {"num_envs": 64})
    assert cfg.num_envs == 64 and changes == ["--num-envs 32 -> 64"]
    with pytest.raises(config_lib.ConfigError, match=r"changes --num-envs 64 \(the run has 8\)"):
        config_lib.resumed(config_lib.build(dict(algo="dqn")).to_dict(), {"num_envs": 64})
    assert "num_envs" in config_lib.state_keys(config_lib.config_class("dqn"))
    assert "num_envs" not in config_lib.state_keys(config_lib.config_class("ppo"))


@pytest.mark.slow
def test_a_short_run_on_8_devices_learns_cartpole(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = train.main(["--config", "cartpole", "--total-timesteps", "300000", "--run-dir", str(run_dir)])
    assert code == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("update", "env_steps", "episode_return", "episode_length", "sps", "time", "loss/total"):
        assert key in rows[-1], key
    # A random policy averages about 22 on CartPole.
    assert rows[0]["episode_return"] < 60
    assert rows[-1]["episode_return"] > 150, rows[-1]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["run_dir"] == str(run_dir) and config["env"] == "CartPole-v1"
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    assert "8 global" in capsys.readouterr().out
