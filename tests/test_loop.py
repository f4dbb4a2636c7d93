"""loop.py's pure parts: how long the next chunk may be, and which updates are due for a log
point, a checkpoint or an evaluation. (The loop as a whole runs in every training test; resume,
stop and the asynchronous sources have files of their own.)"""

from jaxrl_mgpu.loop import CHUNK_S, ChunkSizer, due


def test_the_first_chunk_is_one_update_then_what_fits_in_the_target_time():
    sizer = ChunkSizer(target_s=2.0)
    assert sizer.limit() == 1  # nothing measured yet: one update, which compiles
    sizer.done(length=1, dispatched_at=10.0, now=10.5)  # 0.5 s an update
    assert sizer.limit() == 4
    sizer.done(length=4, dispatched_at=10.5, now=11.5)  # 0.25 s an update
    assert sizer.limit() == 8


def test_a_chunk_dispatched_before_the_last_one_ended_is_timed_from_that_end():
    sizer = ChunkSizer(target_s=1.0)
    sizer.done(length=2, dispatched_at=0.0, now=1.0)
    # dispatched at 0.5, while the chunk before ran: it ran from 1.0, not from 0.5
    sizer.done(length=5, dispatched_at=0.5, now=1.5)
    assert abs(sizer.update_s - 0.1) < 1e-12 and sizer.limit() in (9, 10)


def test_a_slow_update_still_runs_alone():
    sizer = ChunkSizer()
    sizer.done(length=1, dispatched_at=0.0, now=3 * CHUNK_S)
    assert sizer.limit() == 1


def test_due_is_every_multiple_and_never_for_zero():
    assert [u for u in range(1, 11) if due(5, u)] == [5, 10]
    assert not any(due(0, u) for u in range(1, 11)) and not due(None, 5)
