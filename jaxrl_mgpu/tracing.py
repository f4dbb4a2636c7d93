"""--profile: a jax.profiler trace of some updates of a training run."""

from __future__ import annotations

import jax


class Profile:
    """--profile DIR: a jax.profiler trace of the updates after `start` up to `stop`, two log
    intervals (by default those after the first, so that compiling and warming up stay out of
    it; --profile-from moves them); each process writes its own (DIR/process_<i> where there
    are several). The trace starts and stops between chunks, with the device caught up (this
    drains the pipeline of chunks twice: profiling only)."""

    def __init__(self, directory: str, start: int, stop: int, first_update: int, end: int, log):
        # (run() checked that the directory can be made)
        self.directory = directory if jax.process_count() == 1 else f"{directory}/process_{jax.process_index()}"
        self.start, self.stop, self.first_update, self.log = start, stop, first_update, log
        self.on, self.started_at = False, None
        self.said = start >= end  # the run ends before the window: said now, not again at the end
        if self.said:
            log.print(f"  --profile: this run ends at update {end}, before the updates to profile ({start + 1}-{stop}): "
                      f"nothing will be traced (see --profile-from)")

    def at(self, update: int, state) -> None:
        """Called before the chunk that begins after `update` is dispatched."""
        if self.started_at is None and self.start <= update < self.stop:
            jax.block_until_ready(state)
            jax.profiler.start_trace(self.directory)
            self.on, self.started_at = True, update
        elif self.on and update >= self.stop:
            self.close(update, state)

    def close(self, update: int, state) -> None:
        if self.on:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.on = False
            self.log.print(f"  profile of updates {self.started_at + 1}-{update} written under {self.directory}")
        elif self.started_at is None and not self.said:
            self.log.print(f"  --profile: this run did updates {self.first_update + 1}-{update}, none of those to "
                           f"profile ({self.start + 1}-{self.stop}); nothing was traced")
