"""evaluate.py: `python -m jaxrl_mgpu.evaluate` on a run directory: the best checkpoint, and one
line for every run it cannot evaluate (the episodes themselves: test_video.py, the suites' tests)."""

import json

import pytest

from helpers import TINY, one_error_line, rows, run
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import evaluate


@pytest.mark.slow
def test_evaluate_best_and_errors(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--total-timesteps", str(256 * 8), "--run-dir", str(run_dir), "--eval-every", "4",
               "--eval-episodes", "8") == 0
    evals = [r["eval/episode_return"] for r in rows(run_dir) if "eval/episode_return" in r]
    assert len(evals) == 2
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--best", "--episodes", "4", "--greedy"]) == 0
    best = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert best["step"] in (4, 8) and best["episodes"] == 4
    for argv, words in [(["--run-dir", str(tmp_path / "missing")], "no such directory"),
                        (["--run-dir", str(tmp_path)], "not a run directory"),
                        (["--run-dir", str(run_dir), "--step", "3"], "no such checkpoint")]:
        with pytest.raises(SystemExit) as e:
            evaluate.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and err.count("\n") == 1, err
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.json").write_text((run_dir / "config.json").read_text())
    with pytest.raises(SystemExit):
        evaluate.main(["--run-dir", str(empty)])
    assert "no complete checkpoint" in capsys.readouterr().err


def test_evaluate_refuses_an_ad_run_without_in_context(tmp_path, capsys):
    run_dir = tmp_path / "ad"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text(config_lib.dump(config_lib.build(dict(algo="ad", env="DarkRoom",
                                                                          num_updates=10))))
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--run-dir", str(run_dir)])
    assert e.value.code == 2 and "--in-context" in one_error_line(capsys)
    (run_dir / "config.json").write_text("{garbled")
    with pytest.raises(SystemExit):
        evaluate.main(["--run-dir", str(run_dir)])
    assert "not readable JSON" in one_error_line(capsys)
