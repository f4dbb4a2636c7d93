"""tracing.py: --profile traces the two log intervals after the first, or says why not."""

import pytest

from helpers import TINY, one_error_line, run


@pytest.mark.slow
def test_profile_traces_the_two_log_intervals_after_the_first(tmp_path, capsys):
    trace = tmp_path / "trace"
    assert run(*TINY, "--total-timesteps", str(256 * 8), "--run-dir", str(tmp_path / "run"),
               "--profile", str(trace)) == 0
    out = capsys.readouterr().out
    assert f"profile of updates 3-6 written under {trace}" in out
    assert list(trace.glob("plugins/profile/*/*.xplane.pb")), sorted(p.name for p in trace.rglob("*"))
    # A run that ends before the profiled updates says so; one that cannot write there is refused.
    assert run(*TINY, "--total-timesteps", str(256 * 2), "--run-dir", str(tmp_path / "short"),
               "--profile", str(tmp_path / "none")) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "--profile" in line]
    assert said == ["  --profile: this run ends at update 2, before the updates to profile (3-6): nothing will be "
                    "traced (see --profile-from)"] and not (tmp_path / "none").exists()
    assert run(*TINY, "--total-timesteps", str(256 * 2), "--run-dir", str(tmp_path / "from1000"),
               "--profile", str(tmp_path / "none"), "--profile-from", "1000") == 0
    assert "before the updates to profile (1001-1004)" in capsys.readouterr().out
    (tmp_path / "afile").write_text("x")
    assert run(*TINY, "--run-dir", str(tmp_path / "refused"), "--profile", str(tmp_path / "afile" / "t")) == 2
    assert "--profile" in one_error_line(capsys) and not (tmp_path / "refused").exists()
    assert run("--algo", "dqn", "--mode", "collect", "--run-dir", str(tmp_path / "collect"), "--profile",
               str(trace)) == 2
    assert "--profile is only for training" in one_error_line(capsys)
    assert run(*TINY, "--profile-from", "4") == 2
    assert "--profile-from is only for --profile" in one_error_line(capsys)
    # --profile-from moves the window: after update 4, two intervals of 2 (the run ends first).
    assert run(*TINY, "--total-timesteps", str(256 * 6), "--run-dir", str(tmp_path / "later"),
               "--profile", str(tmp_path / "later-trace"), "--profile-from", "4") == 0
    assert "profile of updates 5-6 written under" in capsys.readouterr().out
