"""What the other modules ask of the options' declarations: the algorithms a run may name
(`ALGORITHMS`, filled by jaxrl_mgpu.algos) and a run's config class (`config_class`: the common
`Config` with its algorithm's own options), the lists of options a resume keeps or may change,
the ones that shape an algorithm's state or its sweep, and the check of one value (`_coerce`,
`check_value`)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config.declare import (ALGORITHM_DEPENDENT, POSITIVE, RESUME_MAY_CHANGE, THIS_INVOCATION, AlgoOptions,
                                       Applies, Option)
from jaxrl_mgpu.config.options import COMMON_FIELDS, Config, uses


def _rebuild(values: dict):
    return config_class(values["algo"])(**values)


# -- the algorithms a run may name ---------------------------------------------------------------

class Algorithms:
    """The algorithms a run may name, as the options layer knows them: name -> AlgoOptions.
    jaxrl_mgpu.algos fills it: the built-ins by loaders (their light options modules load on
    first use), the others when registered; `resolver(name)` (algos' registry) is asked for a
    name it does not know, and imports MODULE of MODULE:NAME or an installed package's entry
    point, which registers it."""

    def __init__(self):
        self._loaders: dict[str, Callable[[], AlgoOptions]] = {}
        self._known: dict[str, AlgoOptions] = {}
        self._order: list[str] = []
        self.resolver: Callable[[str], None] = lambda name: None

    def add(self, name: str, options: AlgoOptions | Callable[[], AlgoOptions]) -> None:
        if isinstance(options, AlgoOptions):
            self._known[name] = options
            _CLASSES.pop(name, None)  # a name registered again: its class is made again
        else:
            self._loaders[name] = options
        if name not in self._order:
            self._order.append(name)

    def names(self) -> list[str]:
        """The names known so far, in the order they were added (the built-ins first)."""
        return list(self._order)

    def options(self, name: str) -> AlgoOptions:
        """The AlgoOptions of `--algo name`, or a ConfigError naming the algorithms there are."""
        if name not in self._known and name not in self._loaders:
            self.resolver(name)
        if name not in self._known:
            if name not in self._loaders:
                raise ConfigError(f"--algo {name}: no such algorithm; choose from {', '.join(self.names())}, or "
                                  f"MODULE:NAME of a module that registers NAME")
            self._known[name] = self._loaders[name]()
        return self._known[name]


ALGORITHMS = Algorithms()
_CLASSES: dict[str, type] = {}


def config_class(algo: str) -> type:
    """The dataclass of a run of `algo`: the common options and the algorithm's own, each with
    its default (the algorithm's own, where it declares one). One class per algorithm."""
    if algo in _CLASSES:
        return _CLASSES[algo]
    o = ALGORITHMS.options(algo)
    own = {f.name: f for f in dataclasses.fields(o.fields)}
    if own.keys() & COMMON_FIELDS.keys():
        raise ConfigError(f"--algo {algo}: its option {flag(sorted(own.keys() & COMMON_FIELDS.keys())[0])} is one of "
                          f"every run's; name it otherwise")
    fields, hints = {**COMMON_FIELDS, **own}, {**typing.get_type_hints(Config), **typing.get_type_hints(o.fields)}
    unknown = sorted(set(o.defaults) - set(fields))
    if unknown:
        raise ConfigError(f"--algo {algo}: a default for {flag(unknown[0])}, which is no option of it")
    redeclared = [(name, hints[name], dataclasses.field(default=value, metadata=fields[name].metadata))
                  for name, value in o.defaults.items()]
    # (a run's config is its algorithm's class, made at run time: pickled as the values it holds,
    # rebuilt by the algorithm's name among them)
    cls = dataclasses.make_dataclass("Config", redeclared, bases=(o.fields, Config), frozen=True,
                                     namespace={"ALGO_OPTIONS": o, "__module__": __name__,
                                                "__reduce__": lambda self: (_rebuild, (self.to_dict(),))})
    _CLASSES[algo] = cls
    return cls


def fields_of(cfg_or_class) -> dict[str, dataclasses.Field]:
    cls = cfg_or_class if isinstance(cfg_or_class, type) else type(cfg_or_class)
    return {f.name: f for f in dataclasses.fields(cls)}


def options_of(cfg_or_class) -> dict[str, Option]:
    return {name: f.metadata["option"] for name, f in fields_of(cfg_or_class).items()}


def own_options(cfg_or_class) -> tuple[str, ...]:
    """The algorithm's own options (not the common ones) of a config or its class."""
    return tuple(name for name in fields_of(cfg_or_class) if name not in COMMON_FIELDS)


def defaults(algo: str) -> dict[str, Any]:
    """Every option's default for a run of `algo`."""
    return {name: f.default for name, f in fields_of(config_class(algo)).items()}


def known_options() -> dict[str, Option]:
    """Every option any known algorithm's run can have, {name: Option}: the common ones and
    each algorithm's own (the first to declare a name gives its declaration)."""
    out = {name: f.metadata["option"] for name, f in COMMON_FIELDS.items()}
    for algo in ALGORITHMS.names():
        for name, o in options_of(config_class(algo)).items():
            out.setdefault(name, o)
    return out


def known_type(name: str) -> type:
    """The type of option `name` (int for `int | None`), from whichever algorithm declares it."""
    classes = [Config] + [config_class(algo) for algo in ALGORITHMS.names()]
    hint = next((typing.get_type_hints(cls)[name] for cls in classes if name in fields_of(cls)), None)
    if hint is None:
        raise ConfigError(f"{flag(name)}: no such option")
    return _base_type(hint)


def optional(name: str) -> bool:
    """Whether option `name` may be None (`int | None`)."""
    classes = [Config] + [config_class(algo) for algo in ALGORITHMS.names()]
    hint = next(typing.get_type_hints(cls)[name] for cls in classes if name in fields_of(cls))
    return type(None) in typing.get_args(hint)


def algorithms_with(name: str, listed: Callable[[AlgoOptions], bool] | None = None) -> list[str]:
    """The known algorithms whose runs have option `name`: their own, or a common one they read."""
    out = []
    for algo in ALGORITHMS.names():
        o = ALGORITHMS.options(algo)
        has = name in own_options(config_class(algo)) if name not in COMMON_FIELDS else \
            name not in ALGORITHM_DEPENDENT or name in o.uses
        if has and (listed is None or listed(o)):
            out.append(algo)
    return out


def who(name: str, applies: Applies | None) -> str:
    """The runs option `name` is for, as a refusal names them ("--algo dqn, sac or td3 with
    --mode learn or collect")."""
    text = applies.who if applies is not None else "{algos}"
    if "{algos}" in text:
        names = algorithms_with(name, applies.listed if applies is not None else None)
        listed = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)
        text = text.replace("{algos}", f"--algo {listed}")
    return text


# -- the lists other modules need, from the declarations --------------------------------------

def state_keys(cfg_or_class) -> tuple[str, ...]:
    """The options that shape the checkpointed state of a run of this config's algorithm: a
    checkpoint only resumes under the same values."""
    cls = cfg_or_class if isinstance(cfg_or_class, type) else type(cfg_or_class)
    extra = getattr(cls, "ALGO_OPTIONS", AlgoOptions()).state
    return tuple(name for name, o in options_of(cls).items() if o.state or name in extra)


def resumable(cfg_or_class) -> tuple[str, ...]:
    """The options a resume of a run of this config's algorithm may change (each change is
    logged): how long it runs, how its batch is split, how often it logs and saves, and the step
    size (to go on from the last good checkpoint after a divergence); never one that shapes its
    state."""
    cls = cfg_or_class if isinstance(cfg_or_class, type) else type(cfg_or_class)
    shaping, reads = state_keys(cls), getattr(cls, "ALGO_OPTIONS", AlgoOptions()).uses
    return tuple(name for name, o in options_of(cls).items()
                 if o.resume == RESUME_MAY_CHANGE and name not in shaping
                 and (name not in ALGORITHM_DEPENDENT or name in reads))


def per_invocation() -> tuple[str, ...]:
    """The options of one invocation, not of the run: a resume takes them from its own command
    line (or their defaults), never from the saved config."""
    return tuple(name for name, f in COMMON_FIELDS.items() if f.metadata["option"].resume == THIS_INVOCATION)


def sweepable(cfg_or_class) -> tuple[str, ...]:
    """The options a run of this config's algorithm may --sweep: those an update reads only as
    numbers, so that each run's value can enter the one compiled program as a traced array
    (multirun.py). Any other option changes the program (shapes, or Python branches such as
    DQN's --tau 1 hard copy) and needs a program of its own."""
    cls = cfg_or_class if isinstance(cfg_or_class, type) else type(cfg_or_class)
    common = getattr(cls, "ALGO_OPTIONS", AlgoOptions()).sweep
    return tuple(name for name, o in options_of(cls).items() if o.sweep or name in common)


def flag(name: str) -> str:
    """An option's name as the command line spells it: --num-envs."""
    return "--" + name.replace("_", "-")


# -- values: every one is checked here, once ----------------------------------------------------

def check_value(name: str, value, label: str | None = None) -> None:
    """A value of the right kind can still be wrong: negative, zero where it divides, NaN.
    `label` names it in the error (default: the flag)."""
    label = label or flag(name)
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{label} must be a finite number, got {value}")
    wanted = known_options()[name].check
    if wanted is not None and not wanted.holds(value):
        text = "at least 1" if wanted is POSITIVE and isinstance(value, int) else wanted.text
        raise ConfigError(f"{label} must be {text}, got {value}")


def describe_run(cfg, given) -> str:
    """How a refusal names the run: --algo sac --policy mlp [--mode learn]."""
    return (f"--algo {cfg.algo}" + (f" --policy {cfg.policy}" if uses(cfg, "policy") else "")
            + ("" if cfg.mode == "both" else f" --mode {cfg.mode}"))


def refuse(name: str, cfg, given) -> ConfigError:
    """The error for option `name`, set by `given` (the command line or the preset), that this
    run would ignore."""
    applies = known_options()[name].applies
    # an option the preset set, not the user: say so, so that the flag to change is clear
    preset = (f" (set by --config {cfg.config})" if cfg.config and name not in getattr(given, "flags", given)
              else "")
    return ConfigError(f"{flag(name)}{preset} is only for {who(name, applies)}; this run is {describe_run(cfg, given)} "
                       f"and would ignore it")


def check_applicable(cfg: Config, given) -> None:
    """A ConfigError for the first option in `given` (set on the command line or by the preset)
    that this run would ignore: one its algorithm does not read, or one whose condition its
    config does not meet (--num-atoms without --critic categorical)."""
    for name in given:
        o = known_options()[name]
        if name not in fields_of(cfg) or not uses(cfg, name) or (o.applies is not None and not o.applies.test(cfg)):
            raise refuse(name, cfg, given)


def _base_type(hint) -> type:
    """int for `int | None`, and so on."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _coerce(name: str, value: Any, source: str) -> Any:
    """`value` as option `name`'s type, checked (choices, range), or a one-line ConfigError that
    names it as `source` spells it: the flag on the command line, `FILE: name` in a preset or
    a run's config.json."""
    kind, choices = known_type(name), known_options()[name].choices
    label = flag(name) if source == "command line" else f"{source}: {name}"
    if value is None:
        if optional(name):
            return None
        raise ConfigError(f"{label} must be {KIND_NAMES[kind]}, got null")
    if isinstance(value, list):  # nargs="+" (--sweep): kept as one string, as a preset writes it
        value = " ".join(map(str, value))
    try:
        if kind is bool and not isinstance(value, bool):
            raise TypeError
        if kind is str and not isinstance(value, str):
            raise TypeError
        if kind in (int, float) and isinstance(value, bool):
            raise TypeError
        value = kind(float(value)) if kind is int and isinstance(value, (float, str)) and float(value).is_integer() \
            else kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{label} must be {KIND_NAMES[kind]}, got {value!r}") from None
    if choices and value not in choices:
        raise ConfigError(f"{label} {value!r} is not valid; choose from: {', '.join(choices)}")
    check_value(name, value, label)
    return value


def from_dict(values: dict) -> Config:
    """A saved config (config.json, every option of its algorithm written) as its Config."""
    cls = config_class(values["algo"])
    return cls(**{k: v for k, v in values.items() if k in fields_of(cls)})
