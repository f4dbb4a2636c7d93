"""Environments: every gymnax name, plus the project's own jittable environments.

`make(name)` returns `(env, env_params)` with the gymnax `Environment` API, so everything
downstream (rollouts, evaluation, dataset writers) treats both kinds alike.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Callable


class _LoadedOnFirstUse(types.ModuleType):
    """A stand-in in sys.modules that imports the real module when one of its attributes is
    first read. (The standard library's LazyLoader loads as soon as an import statement touches
    the module's __spec__, which `import x as y` does.)"""

    def __getattr__(self, attr: str):
        del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)  # later reads through this stand-in find it directly
        return getattr(real, attr)


# gymnax's Pong imports seaborn and pyplot at import time, for its renderer alone: seconds of
# every run's start-up (most of `import gymnax`). They load when something first draws.
for _name in ("seaborn", "matplotlib.pyplot"):
    if _name not in sys.modules:
        sys.modules[_name] = _LoadedOnFirstUse(_name)

import gymnax  # noqa: E402
import yaml  # noqa: E402

from jaxrl_mgpu.cli import ConfigError

# Own environments register a factory here (name -> () -> (env, params)).
_OWN: dict[str, Callable[[], tuple[Any, Any]]] = {}
# gymnax environments this project does not offer, and why.
_LEFT_OUT = {"MNISTBandit-bsuite": "it downloads MNIST when it is created (runs here need no network)"}


class EnvError(ConfigError):
    """An unknown environment name (the CLI turns it into a one-line error)."""


def register(name: str, factory: Callable[[], tuple[Any, Any]]) -> None:
    _OWN[name] = factory


def names() -> list[str]:
    return sorted(_OWN) + [n for n in gymnax.registered_envs if n not in _LEFT_OUT]


def make(name: str, args: str | None = None) -> tuple[Any, Any]:
    """`(env, env_params)`; `args` (`--env-args`, "NAME=VALUE,...") are keyword arguments of a
    project environment's factory (its sizes and parameters, e.g. the Tag games')."""
    check(name)
    kwargs = parse_args(name, args)
    if name not in _OWN:
        return gymnax.make(name)
    try:
        return _OWN[name](**kwargs)
    except (TypeError, ValueError) as e:  # an unknown name or a value out of range
        raise EnvError(f"--env-args {args!r} do not fit --env {name}: {e}") from None


def parse_args(name: str, args: str | None) -> dict[str, Any]:
    """"a=1,b=0.5,c=true" -> {"a": 1, "b": 0.5, "c": True} (values read as YAML scalars)."""
    if not args:
        return {}
    if name not in _OWN:
        raise EnvError(f"--env-args: --env {name} is a gymnax environment, which takes no arguments")
    kwargs = {}
    for item in args.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise EnvError(f"--env-args {args!r}: {item!r} is not NAME=VALUE")
        parsed = yaml.safe_load(value)
        if not isinstance(parsed, (bool, int, float)):
            raise EnvError(f"--env-args {args!r}: the value of {key.strip()} ({value!r}) is not a number or a boolean")
        kwargs[key.strip()] = parsed
    return kwargs


def is_multi_agent(env) -> bool:
    """Whether `env` keeps an agent axis inside one environment (envs/tag.py): observations
    `[agents, ...]`, actions and rewards `[agents]`, its `teams` {name: (first, end)}."""
    return hasattr(env, "teams")


def check(name: str) -> None:
    """Raises EnvError for a name this project does not offer, without building anything."""
    if name in _LEFT_OUT:
        raise EnvError(f"--env {name} is not supported: {_LEFT_OUT[name]}")
    if name not in _OWN and name not in gymnax.registered_envs:
        raise EnvError(f"--env {name!r} is not a known environment; choose from: {', '.join(names())}")


# Own environments register themselves on import (after `register` exists).
from jaxrl_mgpu.envs import darkroom, pomdp, tag  # noqa: E402,F401
