"""Training from Python, as `python -m jaxrl_mgpu.train` trains from the command line:
`train(env="CartPole-v1", num_envs=64, run_dir="runs/my-run", on_row=print)` checks the options as
the command line does, writes the same run directory, gives each log row to `on_row` and
returns a `Result` (exit code, final state, last row). The guide: docs/python-api.md.
"""

from __future__ import annotations

import inspect
import time
from typing import Callable

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import train as train_lib
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.result import Result

__all__ = ["Result", "train"]


def train(*, on_row: Callable[[dict], None] | None = None, **options) -> Result:
    """Trains with `options` (see the module's doc); returns the Result. Bad input, `on_row`
    too, raises a UserError before anything is written."""
    check_callback("on_row", on_row)
    return train_lib.run(config_lib.given_from(options), time.monotonic(), on_row)


def check_callback(name: str, fn) -> None:
    """A ConfigError unless `fn` is None or can be called with one row (a dict)."""
    if fn is None:
        return
    if not callable(fn):
        raise ConfigError(f"{name} must be a function of one log row (a dict), got {fn!r}")
    try:
        inspect.signature(fn).bind({})
    except ValueError:  # a builtin without a signature (print): it is called and may fail then
        return
    except TypeError:
        raise ConfigError(f"{name}={getattr(fn, '__name__', fn)!r} must take one argument, the log row "
                          f"(a dict): its signature is {inspect.signature(fn)}") from None
