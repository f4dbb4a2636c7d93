"""rundir.py: the run directory. A fresh run never clobbers one, a directory that cannot be
made is one line, and resuming a finished run changes nothing."""

from pathlib import Path

import pytest

from helpers import TINY, one_error_line, run


@pytest.mark.slow
def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run(*TINY, "--total-timesteps", str(256 * 2), "--run-dir", str(run_dir)) == 0
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    capsys.readouterr()
    assert run("--run-dir", str(run_dir), "--resume") == 0
    assert "already complete" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_run_dirs_that_cannot_be_made_are_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for run_dir, words in [(afile / "run", "is a file"), (Path("/proc/jaxrl_mgpu_test"), "cannot create")]:
        assert run("--run-dir", str(run_dir), "--total-timesteps", "4096") == 2
        assert words in one_error_line(capsys)
    assert afile.read_text() == "x"


def test_an_existing_run_dir_is_not_clobbered(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("precious\n")
    code = run("--run-dir", str(tmp_path))
    assert code == 2 and "--run-dir" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == "precious\n"
