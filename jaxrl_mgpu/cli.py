"""What the command-line front ends share: one-line user errors and their exit code.

Bad input never ends in a traceback: the front ends catch `USER_ERRORS` and call `fail`, which
prints one line naming the problem and exits with code 2, before anything is written.
"""

from __future__ import annotations

import sys

from jaxrl_mgpu.config import ConfigError, Parser  # noqa: F401  (envs.EnvError is a ConfigError too)
from jaxrl_mgpu.parallel import DistributedError, ParallelError

USER_ERRORS = (ConfigError, ParallelError, DistributedError)
EXIT_USER_ERROR = 2


def fail(error: Exception | str) -> None:
    """Bad input: one line naming the problem, exit code 2, no traceback."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
