"""What the command-line front ends share: one-line user errors, their exit code, and the
argument parser. It imports nothing else of the package, so every module can use it.

Bad input never ends in a traceback: the front ends catch `UserError` (every error a user can
cause is one) and call `fail`, which prints one line naming the problem and exits with code 2,
before anything is written.
"""

from __future__ import annotations

import argparse
import sys

EXIT_USER_ERROR = 2


class UserError(ValueError):
    """Bad input (an option, a file, a device count): printed as one line, exit code 2."""


class ConfigError(UserError):
    """A bad option or option value."""


USER_ERRORS = (UserError,)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one ConfigError line (exit 2), not a usage dump."""

    def error(self, message: str):
        raise ConfigError(message)


def count(n: int, noun: str) -> str:
    """"1 device", "8 devices": a number with its noun, singular or plural."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def one_line(error: BaseException) -> str:
    """An exception in one line: its type and the first line of its message (a library's error
    may carry a traceback of its own in the message)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else 'no message'}"


def fail(error: Exception | str) -> None:
    """Bad input: one line naming the problem, exit code 2, no traceback."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
