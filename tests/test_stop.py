"""stop.py: SIGTERM and Ctrl-C requests, by hand (a real signal to a training process:
test_checkpoint.py)."""

import signal
import time

import pytest

from jaxrl_mgpu import stop as stop_lib


class Log:
    """The run log's `print`, kept in a list."""

    def __init__(self, said: list):
        self.print = said.append


@pytest.fixture
def said(monkeypatch) -> list:
    """What a StopSignal says; its immediate exit raises SystemExit instead of leaving."""

    def leave(code):
        raise SystemExit(code)

    monkeypatch.setattr(stop_lib, "_leave", leave)
    return []


def test_stop_signal_twice_at_once_is_one_request_later_it_forces(said):
    """`timeout` signals a process and then its process group: the same SIGTERM twice within
    microseconds must still finish the chunk and save; a second signal later stops at once."""
    stop = stop_lib.StopSignal(Log(said), activity=lambda: "after update 7")
    try:
        stop.request(signal.SIGTERM)
        stop.request(signal.SIGTERM)  # the process-group copy: no exit
        assert stop.requested and stop()
        assert said == ["SIGTERM: stopping: after update 7; then a checkpoint is saved and the run exits. SIGTERM "
                        "again exits at once, keeping the last complete checkpoint"]
        time.sleep(stop_lib.REPEAT_S + 0.05)
        with pytest.raises(SystemExit) as exit_:
            stop.request(signal.SIGINT)
        assert exit_.value.code == 128 + signal.SIGINT
    finally:
        stop.restore()


def test_a_second_request_before_any_checkpoint_says_none_is_kept(said):
    stop = stop_lib.StopSignal(Log(said), kept=lambda: False)
    try:
        stop.request(signal.SIGINT)
        time.sleep(stop_lib.REPEAT_S + 0.05)
        with pytest.raises(SystemExit):
            stop.request(signal.SIGINT)
    finally:
        stop.restore()
    assert said[-1] == "SIGINT again: exiting now; no checkpoint was saved yet (--resume auto starts the run over)"
