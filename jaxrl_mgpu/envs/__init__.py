"""Environments: every gymnax name, plus the project's own jittable environments.

`make(name)` returns `(env, env_params)` with the gymnax `Environment` API, so everything
downstream (rollouts, evaluation, dataset writers) treats both kinds alike.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnax

from jaxrl_mgpu.config import ConfigError

# Own environments register a factory here (name -> () -> (env, params)).
_OWN: dict[str, Callable[[], tuple[Any, Any]]] = {}


class EnvError(ConfigError):
    """An unknown environment name (the CLI turns it into a one-line error)."""


def register(name: str, factory: Callable[[], tuple[Any, Any]]) -> None:
    _OWN[name] = factory


def names() -> list[str]:
    return sorted(_OWN) + list(gymnax.registered_envs)


def make(name: str) -> tuple[Any, Any]:
    if name in _OWN:
        return _OWN[name]()
    if name in gymnax.registered_envs:
        return gymnax.make(name)
    raise EnvError(f"--env {name!r} is not a known environment; choose from: {', '.join(names())}")


def check(name: str) -> None:
    """Raises EnvError for an unknown name without building anything."""
    if name not in _OWN and name not in gymnax.registered_envs:
        make(name)


# Own environments register themselves on import (after `register` exists).
from jaxrl_mgpu.envs import darkroom, pomdp  # noqa: E402,F401
