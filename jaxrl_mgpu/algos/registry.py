"""The algorithms a run may name (`--algo NAME`), each a frozen `Spec` (spec.py) registered by name.

- `register(name, spec)`: `--algo name` trains with `spec`.
- `--algo MODULE:NAME` imports MODULE, which registers NAME, as gymnasium's "module:Env-v0"
  imports the module that registers the environment (examples/custom_algo.py: `--algo
  examples.custom_algo:a2c`). The run's config keeps MODULE:NAME, so a resume or `evaluate`
  imports it again.
- An installed package names its algorithms under the entry-point group `jaxrl_mgpu.algorithms`
  (`NAME = "module:attribute"`, the attribute a Spec, or anything whose import registers NAME):
  loaded when a run first names it.
- The built-ins load on first use, in two parts: their options (a light module, all the command
  line and --help read) apart from their learners (JAX, environments).

The options layer learns each algorithm's options from here (config.ALGORITHMS), so a run's
options are the common ones and those of the algorithm it names. Nothing here imports JAX's
environments: importing the registry, or algos.base, loads no algorithm.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from jaxrl_mgpu.algos.spec import Spec
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config import ALGORITHMS

ENTRY_POINTS = "jaxrl_mgpu.algorithms"

# The built-ins: name -> (its options, "module:attribute"; its Spec, "module:attribute").
BUILTINS = {
    "ppo": ("jaxrl_mgpu.algos.ppo.options:OPTIONS", "jaxrl_mgpu.algos.ppo.spec:SPEC"),
    "dqn": ("jaxrl_mgpu.algos.dqn.options:OPTIONS", "jaxrl_mgpu.algos.dqn.spec:SPEC"),
    "ad": ("jaxrl_mgpu.algos.ad.options:OPTIONS", "jaxrl_mgpu.algos.ad.spec:SPEC"),
    "sac": ("jaxrl_mgpu.algos.sac.options:SAC", "jaxrl_mgpu.algos.sac.spec:SAC"),
    "td3": ("jaxrl_mgpu.algos.sac.options:TD3", "jaxrl_mgpu.algos.sac.spec:TD3"),
}

_SPECS: dict[str, Spec] = {}


def _load(path: str):
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def register(name: str, spec: Spec) -> None:
    """`--algo name` trains with `spec`; its options join the command line's."""
    if not isinstance(spec, Spec):
        raise ConfigError(f"algos.register({name!r}, ...): the second argument is an algos.Spec, not a "
                          f"{type(spec).__name__}")
    _SPECS[name] = spec
    ALGORITHMS.add(name, spec.options)


def resolve(name: str) -> None:
    """Makes a name not registered yet known, if it can be: MODULE:NAME imports MODULE (which
    registers NAME, also as MODULE:NAME), an entry point loads its package's. Nothing happens
    for a name nobody provides (the caller says so)."""
    if name in _SPECS or name in BUILTINS:
        return
    module, colon, short = name.partition(":")
    if colon:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--algo {name}: cannot import {module} ({e})") from None
        if short not in _SPECS:
            raise ConfigError(f"--algo {name}: importing {module} registered no algorithm {short!r} (it registers "
                              f"with jaxrl_mgpu.algos.register({short!r}, spec))")
        register(name, _SPECS[short])
        return
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        if point.name == name:
            loaded = point.load()
            if isinstance(loaded, Spec):
                register(name, loaded)
            if name not in _SPECS:
                raise ConfigError(f"--algo {name}: the entry point {point.value} is no algos.Spec and registered none")
            return


def get(name: str) -> Spec:
    """The Spec of `--algo name` (a built-in's learner is imported here, on first use)."""
    if name not in _SPECS:
        if name in BUILTINS:
            _SPECS[name] = _load(BUILTINS[name][1])
        else:
            resolve(name)
    if name not in _SPECS:
        raise ConfigError(f"--algo {name}: no such algorithm; choose from {', '.join(names())}, or MODULE:NAME of a "
                          f"module that registers NAME")
    return _SPECS[name]


def names() -> list[str]:
    """The algorithms a run may name now: the built-ins and those registered."""
    return ALGORITHMS.names()


for _name, (_options, _) in BUILTINS.items():
    ALGORITHMS.add(_name, lambda path=_options: _load(path))
ALGORITHMS.resolver = resolve
