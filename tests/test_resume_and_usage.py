"""What a new user meets: resume keeps the run's settings, counts are honest, stops are exact,
values are checked once, flags a run would ignore are refused, and the end of a run says what
happened."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import envs, evaluate

from helpers import TINY, one_error_line, rows, run


@pytest.mark.slow
def test_resume_keeps_the_runs_own_settings(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--total-timesteps", str(256 * 8), "--lr", "1e-3", "--run-dir", str(run_dir),
               "--stop-at-update", "4") == 0
    saved = json.loads((run_dir / "config.json").read_text())
    # The README's plain resume line: nothing but --run-dir and --resume.
    assert run("--run-dir", str(run_dir), "--resume") == 0
    config = json.loads((run_dir / "config.json").read_text())
    for key in ("total_timesteps", "lr", "num_envs", "num_steps", "hidden_size", "log_every"):
        assert config[key] == saved[key], key
    assert config["stop_at_update"] is None  # one invocation's stop does not stick to the run
    assert rows(run_dir)[-1]["update"] == 8 and rows(run_dir)[-1]["env_steps"] == 256 * 8


@pytest.mark.slow
def test_resume_refuses_a_changed_setting_and_logs_an_allowed_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--total-timesteps", str(256 * 8), "--run-dir", str(run_dir), "--stop-at-update", "4") == 0
    before = (run_dir / "config.json").read_text()
    capsys.readouterr()
    assert run("--run-dir", str(run_dir), "--resume", "--gamma", "0.9") == 2
    line = one_error_line(capsys)
    assert "--gamma 0.9" in line and "0.99" in line and "--total-timesteps" in line
    assert (run_dir / "config.json").read_text() == before
    assert run("--run-dir", str(run_dir), "--resume", "--total-timesteps", str(256 * 6)) == 0
    out = capsys.readouterr().out
    assert f"--total-timesteps {256 * 8} -> {256 * 6}" in out
    assert rows(run_dir)[-1]["update"] == 6


@pytest.mark.slow
def test_resume_with_other_num_envs_counts_the_env_steps_done(tmp_path, capsys):
    run_dir = tmp_path / "run"
    total = 256 * 10
    assert run(*TINY, "--total-timesteps", str(total), "--run-dir", str(run_dir), "--stop-at-update", "4") == 0
    capsys.readouterr()
    assert run("--run-dir", str(run_dir), "--resume", "--num-envs", "32") == 0
    out = capsys.readouterr().out
    assert f"at update 4 ({256 * 4:,} env_steps)" in out
    # 1,024 done with 16 envs; the other 1,536 in updates of 512 env steps: 3 more updates.
    last = rows(run_dir)[-1]
    assert last["update"] == 7 and last["env_steps"] == total
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == total


@pytest.mark.slow
def test_stop_at_update_inside_a_chunk_is_exact(tmp_path):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--total-timesteps", str(256 * 10), "--log-every", "4", "--checkpoint-every", "4",
               "--run-dir", str(run_dir), "--stop-at-update", "5") == 0
    assert [r["update"] for r in rows(run_dir)] == [4, 5]
    assert evaluate.load_params(str(run_dir))[0] == 5
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 5 and summary["status"].startswith("stopped at update 5")


@pytest.mark.slow
def test_a_run_ends_with_a_summary_and_the_losses_on_the_console(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--total-timesteps", str(256 * 4), "--run-dir", str(run_dir)) == 0
    out = capsys.readouterr().out
    progress = [line for line in out.splitlines() if line.startswith("update ")]
    assert progress and all(w in progress[-1] for w in ("return", "policy", "value", "kl", "clip", "steps/s"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["updates"] == 4 and summary["env_steps"] == 256 * 4
    assert summary["final_return"] == pytest.approx(rows(run_dir)[-1]["episode_return"])
    assert summary["best_return"] >= summary["final_return"]
    assert "summary:" in out and str(run_dir) in out


@pytest.mark.slow
def test_a_non_finite_loss_without_a_checkpoint_says_there_is_none(tmp_path, capsys):
    code = run(*TINY, "--total-timesteps", str(256 * 4), "--run-dir", str(tmp_path / "run"), "--lr", "1e30",
               "--max-grad-norm", "1e30", "--checkpoint-every", "0")
    err = capsys.readouterr().err
    assert code == 1 and "non-finite" in err and "no checkpoint was saved" in err and "None" not in err


@pytest.mark.parametrize("argv, words", [
    (["--lr=-1e-3"], ["--lr must be > 0", "-0.001"]),
    (["--lr", "-1e-3"], ["--lr must be > 0", "-0.001"]),
    (["--lr", "nan"], ["--lr must be a finite number"]),
    (["--gamma", "1.5"], ["--gamma must be in [0, 1]"]),
    (["--num-steps", "0"], ["--num-steps must be at least 1"]),
    (["--ent-coef", "-1"], ["--ent-coef must be >= 0"]),
    (["--eval-episodes", "0"], ["--eval-episodes must be at least 1"]),
    (["--dataset", "data/x"], ["--dataset is only for --algo ad", "--algo ppo"]),
    (["--num-updates", "5"], ["--num-updates is only for --algo ad"]),
    (["--algo", "dqn", "--clip-eps", "0.1"], ["--clip-eps is only for --algo ppo", "--algo dqn"]),
    (["--d-model", "64"], ["--d-model is only for a transformer"]),
    (["--collector-id", "a"], ["--collector-id is only for --mode learn or collect"]),
    (["--algo", "dqn", "--store-workers", "2"], ["--store-workers is only for --algo dqn, sac or td3 with --mode learn or collect"]),
    (["--algo", "dqn", "--mode", "learn", "--store-workers", "-1"], ["--store-workers must be >= 0"]),
    (["--env", "MNISTBandit-bsuite"], ["MNISTBandit-bsuite is not supported", "downloads"]),
])
def test_bad_values_and_ignored_flags_are_one_line(tmp_path, capsys, argv, words):
    run_dir = tmp_path / "run"
    assert run(*argv, "--run-dir", str(run_dir)) == 2
    line = one_error_line(capsys)
    for w in words:
        assert w in line, (w, line)
    assert not run_dir.exists()


def test_mnist_bandit_is_not_offered():
    assert "MNISTBandit-bsuite" not in envs.names() and "CartPole-v1" in envs.names()


@pytest.mark.parametrize("module, argv, words", [
    ("jaxrl_mgpu.bench", ["--num-envs", "0"], "--num-envs must be at least 1"),
    ("jaxrl_mgpu.launch", ["--num-processes", "0"], "--num-processes must be at least 1"),
])
def test_other_front_ends_check_their_numbers(module, argv, words):
    out = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"error: {words}, got 0"], out.stderr


def test_help_lists_choices_presets_and_each_default_once():
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "algorithm: ppo, dqn, ad, sac, td3 (default: ppo)" in text and "one of pmap, shard_map" in text
    assert "presets (--config NAME):" in text and "breakout-minatar-dqn" in text
    assert text.count("(default: 3000000; dqn: 500000; sac, td3: 1000000)") == 1 and "(default: None)" not in text


@pytest.mark.slow
def test_a_built_wheel_carries_the_presets(tmp_path):
    """`pip install .` (not only -e) must keep `--config NAME` working."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                          "-w", str(tmp_path), str(root)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    names = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    presets = {Path(n).stem for n in names if n.startswith("jaxrl_mgpu/presets/") and n.endswith(".yaml")}
    assert presets == set(config_lib.preset_names()) and "cartpole" in presets


@pytest.mark.slow
def test_log_every_alone_moves_the_default_intervals_onto_its_grid(tmp_path, capsys):
    """--log-every 7 by itself is not refused over a --checkpoint-every the user never set."""
    run_dir = tmp_path / "run"
    assert run("--num-envs", "16", "--num-steps", "16", "--hidden-size", "16", "--total-timesteps", str(256 * 7),
               "--log-every", "7", "--run-dir", str(run_dir)) == 0
    assert ("--checkpoint-every 105: its value 100 is not a multiple of --log-every 7, so it follows the log points"
            in capsys.readouterr().out)
    assert json.loads((run_dir / "config.json").read_text())["checkpoint_every"] == 105
    # a value the user gave that is off the grid is still an error
    assert run(*TINY, "--log-every", "7", "--checkpoint-every", "10", "--run-dir", str(tmp_path / "no")) == 2
    assert "--checkpoint-every 10 must be 0 or a multiple of --log-every 7" in one_error_line(capsys)
    assert run(*TINY, "--log-every", "3", "--checkpoint-every", "3", "--eval-every", "4", "--run-dir",
               str(tmp_path / "no")) == 2
    assert "--eval-every 4 must be 0 or a multiple of --log-every 3" in one_error_line(capsys)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("field, value, words", [
    ("num_envs", "many", "num_envs must be an integer, got 'many'"),
    ("lr", -1e-3, "lr must be > 0, got -0.001"),
    ("gamma", 1.5, "gamma must be in [0, 1], got 1.5"),
    ("anneal_lr", "yes", "anneal_lr must be true or false, got 'yes'"),
    ("parallel", "threads", "parallel 'threads' is not valid; choose from: pmap, shard_map"),
    ("num_steps", None, "num_steps must be an integer, got null"),
    ("lr", float("nan"), "lr must be a finite number, got nan"),
    ("colour", "blue", "unknown option(s) colour (written by another version of jaxrl_mgpu?)"),
])
def test_a_hand_edited_config_json_is_checked_like_the_command_line(tmp_path, capsys, field, value, words):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = config_lib.build(dict(num_envs=16, num_steps=16, hidden_size=16, total_timesteps=256 * 4,
                               run_dir=str(run_dir))).to_dict()
    config[field] = value
    (run_dir / "config.json").write_text(json.dumps(config))
    files = sorted(p.name for p in run_dir.iterdir())
    assert run("--run-dir", str(run_dir), "--resume") == 2
    assert one_error_line(capsys) == f"error: {run_dir / 'config.json'}: {words}"
    (run_dir / "checkpoints").mkdir()
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--run-dir", str(run_dir)])
    assert e.value.code == 2 and words in one_error_line(capsys)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(files + ["checkpoints"])


def test_a_resume_cannot_change_a_swept_option(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(config_lib.dump(config_lib.build(dict(num_envs=16, num_steps=16, total_timesteps=256 * 4, sweep="lr=0.001,0.0005", run_dir=str(run_dir)))))
    assert run("--run-dir", str(run_dir), "--resume", "--lr", "1e-4") == 2
    assert one_error_line(capsys) == ("error: --resume: --lr is swept in this run (lr=0.001,0.0005); a resume cannot "
                                      "change a swept option")
    # and an option the run never set says so, rather than "None"
    (run_dir / "config.json").write_text(config_lib.dump(config_lib.build(dict(num_envs=16, num_steps=16, total_timesteps=256 * 4, run_dir=str(run_dir)))))
    assert run("--run-dir", str(run_dir), "--resume", "--samples-per-insert", "2") == 2
    assert "(the run does not set it)" in one_error_line(capsys)


@pytest.mark.parametrize("argv, line", [
    (["--num-envs", "many"], "error: --num-envs must be an integer, got 'many'"),
    (["--attention", "cudnn", "--policy", "transformer"],
     "error: --attention cudnn is cuDNN's flash attention, for NVIDIA GPUs; this run's devices are cpu: use "
     "--attention xla"),
    (["--devices", "1", "--num-envs", "2", "--num-steps", "2", "--num-minibatches", "8"], "(--num-envs 2 / 1 device x"),
])
def test_messages_a_new_user_meets(argv, line, capsys):
    assert run(*argv) == 2
    assert line in one_error_line(capsys)


def test_launch_without_the_separator_says_where_training_options_go():
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2", "--num-envs", "8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: unrecognized arguments: --num-envs 8 (the training options go after --: python -m jaxrl_mgpu.launch "
        "--num-processes 2 -- --num-envs 64)"]


@pytest.mark.slow
def test_launch_relays_a_childs_error_to_stderr_once():
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2", "--devices-per-process",
                          "1", "--", "--num-envs", "3"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 2, out.stdout + out.stderr
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--num-envs" in errors[0], out.stderr
    assert "error:" not in out.stdout, out.stdout


def test_the_default_run_directory_names_a_suite_s_task_without_its_colon(tmp_path, monkeypatch):
    """runs/<env>-<algo>-<time>, a suite's `dmc:HumanoidWalk` as `dmc-HumanoidWalk` (TensorBoard
    reads NAME:PATH in --logdir as a named directory); nothing is created by finding it."""
    from jaxrl_mgpu import rundir
    monkeypatch.chdir(tmp_path)
    cfg = config_lib.build(dict(env="brax:inverted_pendulum"))
    path, step = rundir._find(cfg)
    assert path.parent == Path("runs") and path.name.startswith("brax-inverted_pendulum-ppo-") and step is None
    assert not Path("runs").exists()
