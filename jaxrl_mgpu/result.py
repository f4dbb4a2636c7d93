"""What a training run gives back to a Python caller (api.train; train.main returns its code)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Result(NamedTuple):
    code: int                  # the exit code: 0 done or stopped with a checkpoint, 1 diverged, 128 + N a signal
    run_dir: str | None        # where it wrote (config.json, metrics.jsonl, summary.json, checkpoints/)
    state: Any = None          # the final training state on the devices (None: nothing trained in this call)
    last_row: dict | None = None  # the last log row (the metrics metrics.jsonl ends with)
    updates: int = 0           # the updates done, over the whole run
