"""The registry of environments: every gymnax name, the project's own jittable environments, a
user's own (`register`), and other suites' tasks as `SUITE:TASK` (`register_suite`), with
`make` and the checks of names and `--env-args`. The package (envs/__init__.py) re-exports it
and imports the adapters, which register themselves here.

A user's environment is found as gymnasium finds one: `--env MODULE:NAME` (MODULE not a
suite's name) imports MODULE, which registers NAME (examples/custom_env.py); an installed
package names its environments under the entry-point group `jaxrl_mgpu.envs` (NAME =
"module:attribute", the attribute a factory or anything whose import registers NAME), loaded
when a run first names one. The run's config keeps the name, so a resume or `evaluate` finds
it again.

`make(name)` returns `(env, env_params)` with the gymnax `Environment` API, so everything
downstream (rollouts, evaluation, dataset writers) treats every kind alike: `reset(key, params) ->
(obs, state)`, `step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
info)` that resets an ended episode itself and keeps the observation it ended on in
`info["final_observation"]` (a time limit is `truncated`, not `terminated`: the learners bootstrap
from that observation), `observation_space(params)`, `action_space(params)` and
`params.max_steps_in_episode`. An environment whose step is heavy (a physics simulation) may say so
with a class attribute `heavy_step = True`: PPO's rollout loop then is not unrolled on GPUs
(algos/ppo.rollout_unroll). One whose reset is costly (Craftax draws a world) and that keeps
gymnax's own `step` may set `heavy_reset = True`: a batch of them then resets only the environments
whose episode ended, from the same keys (vec.step_resetting_ended). One that reports more than a
return per episode names those `info` entries in `episode_metrics` (`episode_metrics` below:
Craftax's achievements, Brax's physics blow-ups).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import math
from typing import Any, Callable

import gymnax
import jax
import numpy as np
import yaml

from jaxrl_mgpu.cli import ConfigError, one_line

ENTRY_POINTS = "jaxrl_mgpu.envs"  # installed packages' environments: NAME = "module:attribute"

# Own environments register a factory here: name -> (factory, its arguments' table or None).
_OWN: dict[str, tuple[Callable[..., tuple[Any, Any]], dict[str, Arg] | None]] = {}
# gymnax environments this project does not offer, and why.
_LEFT_OUT = {"MNISTBandit-bsuite": "it downloads MNIST when it is created (runs here need no network)"}
# Environments keep their integer arguments in int32 arrays (JAX without x64).
INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


class EnvError(ConfigError):
    """An unknown environment name, or `--env-args` it does not take (the CLI turns it into a
    one-line error)."""


@dataclasses.dataclass(frozen=True)
class Arg:
    """What one environment argument (`--env-args NAME=VALUE`) may be: a `bool`, an `int`
    (int32) or a `float` (finite in float32; an integer is taken as a float), within the
    bounds given, or a `str`, one of `choices`. A probability is `Arg(float, at_least=0,
    at_most=1)`."""
    kind: type
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    choices: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in (bool, int, float, str):
            raise EnvError(f"Arg({self.kind!r}): the kind of an environment argument is bool, int, float or str "
                           f"(e.g. envs.Arg(int, at_least=1))")
        if self.kind is str and not self.choices:
            raise EnvError("Arg(str) needs its choices: envs.Arg(str, choices=('a', 'b'))")


# The usual kinds of argument.
FLAG = Arg(bool)
COUNT = Arg(int, at_least=1)
REAL = Arg(float)                  # any finite number, e.g. a reward of either sign
POSITIVE = Arg(float, above=0)     # a size, speed or distance


def register(name: str, factory: Callable[..., tuple[Any, Any]], args: dict[str, Arg] | None = None) -> None:
    """`factory(**kwargs) -> (env, env_params)`. `args` declares every keyword argument it takes
    from `--env-args` (name -> Arg, in the order a listing shows them), and `make` checks them
    before calling it; without it, the factory's named parameters are taken as they are written.

    What can be checked now is (an EnvError naming the problem): the name (no colon: `A:B` is
    a suite's task), the factory (callable) and the table (an `Arg` for each parameter the
    factory takes). The rest is checked when the environment is made, before a run writes
    anything (`make`): what the factory returns, and one traced reset and step."""
    if not isinstance(name, str) or not name or ":" in name or "," in name or name != name.strip():
        raise EnvError(f"envs.register({name!r}, ...): an environment's name is a non-empty string without colons, "
                       f"commas or surrounding spaces (a colon names a suite's task, SUITE:TASK)")
    if not callable(factory):
        raise EnvError(f"envs.register({name!r}, ...): the factory must be callable, (**env_args) -> (env, "
                       f"env_params); got a {type(factory).__name__}")
    if args is not None:
        _check_table(name, factory, args)
    _OWN[name] = (factory, args)
    _made.cache_clear()  # a name registered again is built anew


def _parameters(factory) -> dict[str, inspect.Parameter] | None:
    """The factory's parameters by name; None where it takes any keyword (**kwargs) or its
    signature cannot be read."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return dict(parameters)


def _required(parameters: dict[str, inspect.Parameter], given) -> list[str]:
    """The parameters without a default that `given` (names) does not hold."""
    return [p.name for p in parameters.values() if p.default is inspect.Parameter.empty
            and p.kind is not inspect.Parameter.VAR_POSITIONAL and p.name not in given]


def _check_table(name: str, factory, args) -> None:
    if not isinstance(args, dict):
        raise EnvError(f"envs.register({name!r}, ...): its arguments' table is a dict of name -> envs.Arg, not a "
                       f"{type(args).__name__}")
    for key, arg in args.items():
        if not isinstance(arg, Arg):
            raise EnvError(f"envs.register({name!r}, ...): argument {key!r} is {arg!r}, not an envs.Arg (write e.g. "
                           f"envs.Arg(int, at_least=1))")
    parameters = _parameters(factory)
    if parameters is None:
        return
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = [p.name for p in parameters.values() if p.kind in named]
    unknown = [key for key in args if key not in takes]
    if unknown:
        raise EnvError(f"envs.register({name!r}, ...): the table names {', '.join(map(repr, unknown))}, which its "
                       f"factory does not take (it takes {', '.join(takes) or 'no keyword arguments'})")
    never = _required(parameters, args)
    if never:
        raise EnvError(f"envs.register({name!r}, ...): its factory requires {', '.join(never)}, which the table does "
                       f"not declare (so --env-args could never give it): add it, or give it a default")


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite of environments behind `--env SUITE:TASK`, as its adapter registers it. Its
    functions import the suite's packages, so only a run that uses it needs its extra."""
    tasks: Callable[[], list[str]]                # the tasks it offers
    make: Callable[..., tuple[Any, Any]]          # (task, **env_args) -> (env, env_params)
    extra: str                                    # the pip extra that installs it: pip install -e ".[extra]"
    requires: tuple[str, ...]                     # the top-level packages that extra installs
    args: dict[str, Arg] = dataclasses.field(default_factory=dict)  # the --env-args its tasks take
    refuse: Callable[[str], str | None] = lambda task: None  # why a task is not offered here (None: it is)
    unlisted: tuple[str, ...] = ()                # tasks it takes but does not offer (a suite's own test env)


_SUITES: dict[str, Suite] = {}


def register_suite(name: str, suite: Suite) -> None:
    _SUITES[name] = suite
    _made.cache_clear()


def names() -> list[str]:
    return (sorted(_OWN) + [n for n in gymnax.registered_envs if n not in _LEFT_OUT]
            + [f"{suite}:TASK" for suite in sorted(_SUITES)])


def make(name: str, args: str | None = None) -> tuple[Any, Any]:
    """`(env, env_params)`; `args` (`--env-args`, "NAME=VALUE,...") are keyword arguments of a
    project environment's factory (its sizes and parameters, e.g. the Tag games') or of a
    suite's, each checked against its table before anything is built. Built once per name and
    arguments (start-up asks for it in several places; environments hold no mutable state)."""
    return _made(name, args)


def _is_suite_task(name: str) -> bool:
    """A `SUITE:TASK` name (not a registered MODULE:NAME)."""
    return ":" in name and name not in _OWN


def _resolve(name: str) -> None:
    """Makes a name nobody has registered yet known where someone provides it: MODULE:NAME
    (MODULE no suite) imports MODULE, which registers NAME (and so MODULE:NAME); an installed
    package's entry point loads its environment. Nothing happens for a name nobody provides
    (`check` says so)."""
    if name in _OWN or name in gymnax.registered_envs or name in _LEFT_OUT:
        return
    module, colon, short = name.partition(":")
    if colon:
        if module in _SUITES:
            return
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise EnvError(f"--env {name}: no suite {module!r} (suites: {', '.join(sorted(_SUITES))}), nor a module "
                           f"{module} to import ({e})") from None
        if short not in _OWN:
            raise EnvError(f"--env {name}: importing {module} registered no environment {short!r} (it registers "
                           f"with jaxrl_mgpu.envs.register({short!r}, factory))")
        _OWN[name] = _OWN[short]
        return
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        if point.name == name:
            loaded = point.load()
            if name not in _OWN and callable(loaded):
                register(name, loaded)
            if name not in _OWN:
                raise EnvError(f"--env {name}: the entry point {point.value} is no factory and registered none")
            return


@functools.cache
def _made(name: str, args: str | None) -> tuple[Any, Any]:
    check(name)
    kwargs = parse_args(name, args)
    if _is_suite_task(name):
        suite, task = name.split(":", 1)
        env, params = _SUITES[suite].make(task, **kwargs)
        traits(env)
        return env, params
    if name not in _OWN:
        env, params = gymnax.make(name)
        traits(env)
        return env, params
    factory = _OWN[name][0]
    parameters = _parameters(factory)
    if parameters is not None:
        missing = _required(parameters, kwargs)
        if missing:
            raise EnvError(f"--env {name} needs {', '.join(missing)}: give {'them' if len(missing) > 1 else 'it'} with "
                           f"--env-args {','.join(m + '=VALUE' for m in missing)}")
    try:
        made = factory(**kwargs)
    except ValueError as e:  # what one argument's range cannot say: a relation between several
        raise EnvError(f"--env-args {args}: {name}: {e}") from None
    if not (isinstance(made, tuple) and len(made) == 2):
        raise EnvError(f"--env {name}: its factory returned {_described(made)}; it must return (env, env_params), "
                       f"e.g. `return env, env.default_params`")
    env, params = made
    traits(env)
    # A user's own environment is traced now, before any run directory is written (the suites'
    # adapters are checked by the tests against their suites).
    check_env_step(name, env, params)
    return env, params


def _described(value) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {type(value).__name__}"


def _suite(name: str) -> Suite:
    """The suite of a `SUITE:TASK` name whose packages are installed, or an EnvError that says
    what to install."""
    suite_name, _, task = name.partition(":")
    if suite_name not in _SUITES:
        raise EnvError(f"--env {name}: no suite {suite_name!r}; suites: {', '.join(sorted(_SUITES))} (or a gymnax "
                       f"or project name without a colon)")
    suite = _SUITES[suite_name]
    missing = [m for m in suite.requires if importlib.util.find_spec(m) is None]
    if missing:
        raise EnvError(f"--env {name} needs {', '.join(missing)}: pip install -e \".[{suite.extra}]\"")
    return suite


def parse_args(name: str, args: str | None) -> dict[str, Any]:
    """"a=1,b=0.5,c=true" -> {"a": 1, "b": 0.5, "c": True}: values read as YAML scalars (or
    Python floats: "1e-3", "nan", "inf"), names and values checked against `name`'s table."""
    if not args:
        return {}
    if name not in _OWN and not _is_suite_task(name):
        raise EnvError(f"--env-args: --env {name} is a gymnax environment, which takes no arguments")
    table = arguments(name)
    kwargs = {}
    for item in args.split(","):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise EnvError(f"--env-args {args}: {item!r} is not NAME=VALUE")
        if key not in table:
            takes = f"takes {', '.join(table)}" if table else "takes no arguments"
            raise EnvError(f"--env-args {item.strip()}: {name} {takes}")
        if key in kwargs:
            raise EnvError(f"--env-args {args}: {key} is given twice")
        value, arg = _scalar(text), table[key]
        problem = _out_of_range(value, arg)
        if problem:
            raise EnvError(f"--env-args {item.strip()}: {name}'s {key} must be {problem}")
        kwargs[key] = float(value) if arg is not None and arg.kind is float else value
    return kwargs


def arguments(name: str) -> dict[str, Arg | None]:
    """The `--env-args` an own environment or a suite takes: its table, or (where an own
    environment registered none) its factory's named parameters, unchecked (None)."""
    if _is_suite_task(name):
        return dict(_SUITES[name.split(":", 1)[0]].args)
    factory, table = _OWN[name]
    if table is not None:
        return dict(table)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name: None for p in inspect.signature(factory).parameters.values() if p.kind in named}


def _scalar(text: str) -> Any:
    """A YAML scalar, or a Python float where YAML reads a string ("1e-3", "nan", "inf")."""
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _out_of_range(value: Any, arg: Arg | None) -> str | None:
    """What `value` must be instead ("at least 1", "an integer", ...), or None where it fits."""
    if arg is None:  # undeclared: any number or boolean
        return None if isinstance(value, (bool, int, float)) else "a number or a boolean"
    if arg.kind is bool:
        return None if isinstance(value, bool) else "true or false"
    if arg.kind is str:
        return None if value in arg.choices else f"one of {', '.join(arg.choices)}"
    if arg.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return "an integer"
    if arg.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "a number"
        if isinstance(value, float) and not math.isfinite(value):
            return "finite"
        if abs(value) > FLOAT32_MAX:  # the environment holds it in float32
            return f"finite in float32 (at most {FLOAT32_MAX:.4g} in size)"
    at_most = arg.at_most
    if arg.kind is int:
        at_most = INT32_MAX if at_most is None else min(at_most, INT32_MAX)
    if arg.at_least is not None and value < arg.at_least:
        return f"at least {arg.at_least}"
    if arg.above is not None and value <= arg.above:
        return f"greater than {arg.above}"
    if at_most is not None and value > at_most:
        return f"at most {at_most}"
    return None


@dataclasses.dataclass(frozen=True)
class Traits:
    """What the project reads of an environment beyond gymnax's interface: attributes of the same
    name (all optional), read once, when the environment is made (`traits(env)`), nowhere else."""
    # a step is many kernels (a physics simulation): PPO's rollout loop is not unrolled (algos/ppo/ppo.py)
    heavy_step: bool = False
    host_batched: bool = False  # a device's batch steps at once, on the host (envs/vec.py step, atari.py)
    host_bytes_per_env: int = 0  # host memory one of those environments holds (autoscale/host.py)
    pipelined: bool = False  # host_batched in two halves, also stepped by send_batch / recv_batch (vec.scan_halves)
    heavy_reset: bool = False  # a reset costs many steps (Craftax's worlds): ended episodes reset in batches (vec.py)
    # `info` entries reported per episode: one number per step, read at the step that ends an
    # episode; PPO and DQN average each over the episodes that end in a log row (`env/NAME`)
    episode_metrics: tuple[str, ...] = ()
    # a multi-agent game (envs/tag.py) keeps an agent axis inside one environment: observations
    # [agents, ...], actions and rewards [agents]; its teams {name: (first, end)}
    teams: dict | None = None
    # a multi-agent game's action as independent choices (Tag's acceleration and turn levels)
    action_factors: tuple[int, ...] | None = None
    # (state, params) -> uint8 [height, width, 3] (host_batched: the observation), and a video's fps
    render_rgb: Callable | None = None
    render_fps: float | None = None

    @staticmethod
    def read(env) -> "Traits":
        declared = {f.name: getattr(env, f.name) for f in dataclasses.fields(Traits) if hasattr(env, f.name)}
        if "episode_metrics" in declared:
            declared["episode_metrics"] = tuple(declared["episode_metrics"])
        if "render_rgb" in declared and not callable(declared["render_rgb"]):
            declared.pop("render_rgb")
        return Traits(**declared)


_TRAITS: dict[int, tuple[Any, Traits]] = {}  # id(env) -> (env, its traits): made envs live as long as the process


def traits(env) -> Traits:
    """`env`'s traits (Traits), read when it was made (or on first use, for an environment
    built without `make`)."""
    kept = _TRAITS.get(id(env))
    if kept is None or kept[0] is not env:
        kept = _TRAITS[id(env)] = (env, Traits.read(env))
    return kept[1]


def is_multi_agent(env) -> bool:
    """Whether `env` keeps an agent axis inside one environment (Traits.teams)."""
    return traits(env).teams is not None


def episode_metrics(env) -> tuple[str, ...]:
    """The `info` entries that `env` reports per episode (Traits.episode_metrics)."""
    return traits(env).episode_metrics


def check_episode_metrics(env, info: dict, step_shape: tuple = ()) -> None:
    """An EnvError unless the `info` of a step of `env` (of environments `step_shape`: () for
    one) holds each of its episode metrics, one number per environment."""
    for name in episode_metrics(env):
        if name not in info:
            raise EnvError(f"{env.name}: episode metric {name!r} is not in its step's info, which holds "
                           f"{', '.join(sorted(info)) or 'nothing'}")
        if tuple(info[name].shape) != tuple(step_shape):
            raise EnvError(f"{env.name}: episode metric {name!r} must be one number per environment step; its "
                           f"shape is {tuple(info[name].shape[len(step_shape):])}")


def check_env_step(name: str, env, params) -> None:
    """An EnvError unless `env` has the interface (module docstring): one reset and one step
    from it are traced (not run), and what they return is checked: arity, the observation's
    shape against the reset's and the observation space's, scalar (multi-agent: one per agent)
    rewards, scalar terminated/truncated flags, a dict of info holding the episode metrics."""
    missing = [m for m in ("reset", "step", "action_space", "observation_space") if not callable(getattr(env, m, None))]
    if missing:
        raise EnvError(f"--env {name}: its factory's env ({type(env).__name__}) has no {', '.join(missing)}: an "
                       f"environment follows gymnax's Environment API (subclass gymnax.environments.environment."
                       f"Environment)")
    key = jax.random.PRNGKey(0)
    if callable(getattr(env, "step_env", None)):  # gymnax's: step_env's arity is the usual slip
        try:
            returned = jax.eval_shape(lambda k: env.step_env(k, env.reset(k, params)[1], _an_action(env, params, k),
                                                             params), key)
        except Exception as e:  # noqa: BLE001  (a user's code may raise anything while traced)
            raise EnvError(f"--env {name}: tracing its reset and step_env failed: {one_line(e)}") from None
        if not (isinstance(returned, tuple) and len(returned) == 5):
            raise EnvError(f"--env {name}: its step_env returns {_described(returned)}; it must return (obs, state, "
                           f"reward, terminated, info)")
    try:
        (obs0, _), step = jax.eval_shape(lambda k: (env.reset(k, params), env.step(
            k, env.reset(k, params)[1], _an_action(env, params, k), params)), key)
    except Exception as e:  # noqa: BLE001
        raise EnvError(f"--env {name}: tracing its reset and step failed: {one_line(e)}") from None
    if not (isinstance(step, tuple) and len(step) == 6):
        raise EnvError(f"--env {name}: its step returns {_described(step)}; it must return (obs, state, reward, "
                       f"terminated, truncated, info)")
    obs, _, reward, terminated, truncated, info = step
    shape = getattr(env.observation_space(params), "shape", None)
    if not (hasattr(obs, "shape") and hasattr(obs0, "shape")):
        raise EnvError(f"--env {name}: its observations are {type(obs0).__name__}s; they must be arrays")
    if obs.shape != obs0.shape or (shape is not None and tuple(shape) != obs.shape):
        raise EnvError(f"--env {name}: its step's observation has shape {obs.shape}, its reset's {obs0.shape}, its "
                       f"observation space's {tuple(shape)}: they must agree")
    rewards_shape = (_num_agents(env),) if is_multi_agent(env) else ()
    for what, value, want in (("reward", reward, rewards_shape), ("terminated", terminated, ()),
                              ("truncated", truncated, ())):
        if getattr(value, "shape", None) != want:
            raise EnvError(f"--env {name}: its step's {what} has shape {getattr(value, 'shape', None)}; it must be "
                           f"{'one number per agent ' + str(want) if want else 'a scalar'} for one environment")
    if not (jax.dtypes.issubdtype(reward.dtype, np.floating) or jax.dtypes.issubdtype(reward.dtype, np.integer)):
        raise EnvError(f"--env {name}: its step's reward is {reward.dtype}; it must be a number (float32)")
    if not isinstance(info, dict):
        raise EnvError(f"--env {name}: its step's info is a {type(info).__name__}; it must be a dict")
    check_episode_metrics(env, info)


def _num_agents(env) -> int:
    return max(end for _, end in env.teams.values())


def _an_action(env, params, key):
    """An action to trace a step with: a sample of the action space (one per agent in a
    multi-agent environment, whose action space is one agent's)."""
    space = env.action_space(params)
    if is_multi_agent(env):
        return jax.vmap(space.sample)(jax.random.split(key, _num_agents(env)))
    return space.sample(key)


def check(name: str) -> None:
    """Raises EnvError for a name this project does not offer, without building anything (a
    suite's task list may import the suite; a MODULE:NAME imports MODULE, which registers NAME)."""
    _resolve(name)
    if _is_suite_task(name):
        suite, task = _suite(name), name.split(":", 1)[1]
        why = suite.refuse(task)
        if why:
            raise EnvError(f"--env {name} is not supported: {why}")
        tasks = suite.tasks()
        if task not in tasks:
            offered = [t for t in tasks if t not in suite.unlisted and not suite.refuse(t)]
            raise EnvError(f"--env {name}: no such task; {name.split(':', 1)[0]} offers {', '.join(offered)}")
        return
    if name in _LEFT_OUT:
        raise EnvError(f"--env {name} is not supported: {_LEFT_OUT[name]}")
    if name not in _OWN and name not in gymnax.registered_envs:
        raise EnvError(f"--env {name!r} is not a known environment; choose from: {', '.join(names())}")

