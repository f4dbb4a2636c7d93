"""Training from Python, as `python -m jaxrl_mgpu.train` trains from the command line:
`train(env="CartPole-v1", num_envs=64, run_dir="runs/nb", on_row=print)` checks the options as
the command line does, writes the same run directory, gives each log row to `on_row` and
returns a `Result` (exit code, final state, last row). The guide: docs/python-api.md.
"""

from __future__ import annotations

import time
from typing import Callable

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import train as train_lib
from jaxrl_mgpu.result import Result

__all__ = ["Result", "train"]


def train(*, on_row: Callable[[dict], None] | None = None, **options) -> Result:
    """Trains with `options` (see the module's doc); returns the Result."""
    return train_lib.run(config_lib.given_from(options), time.monotonic(), on_row)
