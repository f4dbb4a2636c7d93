"""log.py: what the console says while a run waits."""

import time

from jaxrl_mgpu import log as log_lib


def test_a_slow_wait_says_it_is_still_working(capsys, monkeypatch):
    monkeypatch.setattr(log_lib, "HEARTBEAT_S", 0.5)
    log = log_lib.RunLog(None, 0)
    with log.waiting("compiling the training chunk"):
        time.sleep(2.6)
    lines = [line for line in capsys.readouterr().out.splitlines() if "compiling the training chunk" in line]
    assert len(lines) >= 2 and lines[0].endswith("s so far")
