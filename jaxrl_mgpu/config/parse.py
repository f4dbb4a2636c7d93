"""The command line, its help, the presets, and a Python caller's options (`given_from`):
what one command sets (`Given`), each value checked as it is read."""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import textwrap
from pathlib import Path

import yaml

from jaxrl_mgpu.cli import ConfigError, Parser
from jaxrl_mgpu.config.checks import validate
from jaxrl_mgpu.config.declare import GROUPS_AFTER, GROUPS_BEFORE, POSITIVE, RESUME_MAY_CHANGE, THIS_INVOCATION
from jaxrl_mgpu.config.resume import read_saved
from jaxrl_mgpu.config.catalogue import (ALGORITHMS, _coerce, config_class, fields_of, flag, known_options, known_type,
                                         own_options, refuse, sweepable, who)
from jaxrl_mgpu.config.options import COMMON_FIELDS, Config


PRESET_DIRS = (Path(__file__).resolve().parent.parent / "presets",)  # package data: installed with the package

# -- the command line and its help ----------------------------------------------------------------

PROG = "python -m jaxrl_mgpu.train"
DESCRIPTION = ("Train an RL agent data-parallel on all local devices. Numbers are GLOBAL, over all devices and "
               "hosts; flags override a --config preset, which overrides the defaults.")
HELP_WIDTH = 100     # at most; narrower terminals get narrower help
FLAG_COLUMN = 26     # where an option's text starts


def _usage(name: str) -> str:
    """How the command line writes an option and its value: --num-envs N, --[no-]anneal-lr."""
    o, kind = known_options()[name], known_type(name)
    if kind is bool:
        return "--[no-]" + flag(name)[2:]
    metavar = o.metavar or ("NAME" if o.choices else {int: "N", float: "X"}.get(kind, "TEXT"))
    return flag(name) + {"?": f" [{metavar}]", "+": f" {metavar} [...]"}.get(o.nargs, f" {metavar}")


def _default(name: str, shown: list[str]) -> str:
    """Option `name`'s default as the help says it: the declared one, and each shown algorithm's
    own where it differs ('64; dqn: 128; sac, td3: 256')."""
    declared = COMMON_FIELDS[name].default if name in COMMON_FIELDS else next(
        config_class(a).ALGO_OPTIONS.fields.__dataclass_fields__[name].default
        for a in shown if name in own_options(config_class(a)))
    by_value: dict = {}
    for algo in shown:
        own = ALGORITHMS.options(algo).defaults
        if name in own and own[name] != declared:
            by_value.setdefault(own[name], []).append(algo)
    if declared is None and not by_value:
        return ""
    return f" (default: {declared}" + "".join(f"; {', '.join(a)}: {v}" for v, a in by_value.items()) + ")"


def _describe(name: str, width: int, whole: bool, shown: list[str]) -> list[str]:
    """An option's lines in the help: its flag, then its text (`whole`: the full text and what
    the declaration says about it; else its brief), its choices and its default."""
    o = known_options()[name]
    text = (o.help if whole else o.brief or o.help) + (f"; one of {', '.join(map(str, o.choices))}" if o.choices else "")
    text = text.replace("{algorithms}", ", ".join(ALGORITHMS.names())) + _default(name, shown)
    if whole:  # what the declaration says, but what the group's name says already
        at_least_1 = o.check is POSITIVE and known_type(name) is int
        notes = [("at least 1" if at_least_1 else o.check.text)] if o.check else []
        runs = who(name, o.applies) if o.applies or name not in COMMON_FIELDS else None
        notes += [f"only for {runs}"] if runs and runs != f"--algo {o.group}" else []
        notes += {RESUME_MAY_CHANGE: ["a resume may change it"],
                  THIS_INVOCATION: ["per invocation"]}.get(o.resume, [])
        swept = [a for a in shown if name in sweepable(config_class(a))]
        notes += [f"sweepable ({', '.join(swept)})"] if swept else []
        text += f" [{'; '.join(notes)}]" if notes else ""
    head = f"  {_usage(name)}"
    body = textwrap.wrap(text, width - FLAG_COLUMN, break_on_hyphens=False, break_long_words=False)
    if len(head) >= FLAG_COLUMN - 1:  # a long flag: its text starts on the next line
        return [head] + [" " * FLAG_COLUMN + line for line in body]
    return [head.ljust(FLAG_COLUMN) + body[0]] + [" " * FLAG_COLUMN + line for line in body[1:]]


def groups(shown: list[str] | None = None) -> dict[str, str]:
    """The help's groups, {name: line}: the common ones, with the own groups of the algorithms
    `shown` (default: every known one) between them."""
    shown = ALGORITHMS.names() if shown is None else shown
    own: dict[str, str] = {}
    for algo in shown:
        for name, line in ALGORITHMS.options(algo).groups().items():
            own.setdefault(name, line)
    return {**GROUPS_BEFORE, **own, **GROUPS_AFTER}


def help_text(group: str | None = None, width: int | None = None, algo: str | None = None) -> str:
    """--help: the common options, the groups and the presets; --help GROUP: every option of
    that group, whole; --help all (or --help-all): every group. With `algo` (the command line's
    --algo), its options; else every known algorithm's."""
    shown = [algo] if algo else ALGORITHMS.names()
    listed = groups(shown)
    if group is not None and group != "all" and group not in listed:
        raise ConfigError(f"--help {group}: no such group; groups: {', '.join(listed)} (or all)")
    width = min(width or shutil.get_terminal_size((HELP_WIDTH, 24)).columns, HELP_WIDTH) - 2
    options = {n: o for n, o in COMMON_FIELDS.items()} | {
        n: f for a in shown for n, f in fields_of(config_class(a)).items() if n not in COMMON_FIELDS}
    shown_options = [n for n in options if not known_options()[n].internal]
    group_of = {n: known_options()[n].group for n in shown_options}
    wrap = lambda text, indent="": textwrap.wrap(text, width, break_on_hyphens=False, subsequent_indent=indent)
    lines = [f"usage: {PROG} [--OPTION VALUE ...]", "", *wrap(DESCRIPTION)]
    if group is None:
        lines += ["", "common options, by group:"]
        for g in listed:
            common = [n for n in shown_options if group_of[n] == g and known_options()[n].common]
            lines += [f" {g}:"] * bool(common) + [line for n in common for line in _describe(n, width, False, shown)]
        lines += ["", "option groups (--help GROUP: all of its options; --help-all: every option):"]
        lines += [line for g, about in listed.items() for line in wrap(f"  {g:<10}{about}", " " * 12)]
    for g in (listed if group == "all" else [group] if group else []):
        lines += ["", f"{g} options: {listed[g]}"]
        lines += [line for n in shown_options if group_of[n] == g for line in _describe(n, width, True, shown)]
    lines += ["", *wrap(f"presets (--config NAME): {', '.join(preset_names())}", "  ")]
    return "\n".join(lines)


class _ShowHelp(argparse.Action):
    """--help [GROUP] and --help-all: print that help (of the command line's --algo, if it
    names one), exit 0."""

    def __init__(self, *args, algo: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.algo = algo

    def __call__(self, parser, namespace, values, option_string=None):
        print(help_text("all" if option_string == "--help-all" else values, algo=self.algo))
        parser.exit()


def parser(algo: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every option of every known algorithm (one this run's does
    not read is refused later, naming the algorithms it is for); `algo`: whose help to show."""
    p = Parser(prog=PROG, add_help=False)
    p.add_argument("-h", "--help", action=_ShowHelp, nargs="?", metavar="GROUP", default=argparse.SUPPRESS, algo=algo)
    p.add_argument("--help-all", action=_ShowHelp, nargs=0, default=argparse.SUPPRESS, algo=algo)
    for name, o in known_options().items():
        if o.internal:
            continue
        if known_type(name) is bool:
            p.add_argument(flag(name), action=argparse.BooleanOptionalAction, default=None)
        else:
            p.add_argument(flag(name), type=str, default=None, nargs=o.nargs, const=o.const, metavar=name.upper())
    return p


def preset_names() -> list[str]:
    return sorted({p.stem for d in PRESET_DIRS if d.is_dir() for p in d.glob("*.yaml")})


def find_preset(name: str) -> Path:
    path = Path(name)
    candidates = [path] + [d / n for d in PRESET_DIRS for n in (name, f"{name}.yaml", f"{name}.yml")]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(f"--config {name!r}: no such preset file; presets: {', '.join(preset_names()) or 'none'}")


def load_preset(name: str) -> dict:
    path = find_preset(name)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: a preset must be a mapping of option: value")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    if isinstance(data.get("algo"), str):  # an outside algorithm's options are known once its module is
        ALGORITHMS.options(data["algo"])
    unknown = sorted(set(data) - {n for n, o in known_options().items() if not o.internal} - {"config"})
    if unknown:
        raise ConfigError(f"--config {path}: unknown option(s) {', '.join(unknown)}")
    return {k: _coerce(k, v, str(path)) for k, v in data.items()}


def _values_attached(argv: list[str], p: argparse.ArgumentParser) -> list[str]:
    """`--lr -1e-3` as `--lr=-1e-3`: argparse takes a value that starts with '-' for a flag, so
    the two spellings would differ; joined, both reach the same value check."""
    takes_value = {a for action in p._actions if action.nargs is None and action.option_strings
                   for a in action.option_strings}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in takes_value and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            try:
                float(argv[i + 1])
            except ValueError:
                pass
            else:
                out.append(f"{argv[i]}={argv[i + 1]}")
                i += 2
                continue
        out.append(argv[i])
        i += 1
    return out


class Given(dict):
    """The options a command sets, {name: value} from its preset and its flags; `flags`: the
    names its flags set (the user's explicit choices); `dropped`: the preset's options that
    the --algo its flags chose instead of the preset's does not have."""
    flags: frozenset = frozenset()
    dropped: tuple = ()


def _named(argv: list[str], name: str) -> str | None:
    """The value a command line gives option `name` (--name VALUE or --name=VALUE), if any: read
    before the command line is parsed."""
    for i, arg in enumerate(argv):
        if arg == flag(name) and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag(name) + "="):
            return arg.split("=", 1)[1]
    return None


def _named_algo(argv: list[str]) -> str | None:
    """The algorithm a command line names, if any: read before the command line is parsed, since
    its options are part of what the parser takes."""
    return _named(argv, "algo")


# The multi-process options, which start jax.distributed (parallel.initialize).
DISTRIBUTED = ("coordinator_address", "num_processes", "process_id", "local_device_ids", "failure_timeout")


def distributed_before_parse(argv: list[str]) -> tuple | None:
    """The multi-process options of a command line whose parse imports code from outside the
    package (--algo MODULE:NAME or an installed package's algorithm, also a resumed run's): that
    code may use JAX when it is imported, and jax.distributed must start before any JAX call, so
    the job starts first. None where the parse imports nothing from outside, or where these
    options do not parse (the whole parse then says what is wrong). In the order
    parallel.initialize takes them."""
    algo = _named_algo(argv)
    if algo is None and "--resume" in argv and _named(argv, "run_dir"):
        try:
            algo = read_saved(_named(argv, "run_dir"))["algo"]
        except ConfigError:
            return None
    if algo is None or algo in ALGORITHMS.names():
        return None
    try:
        values = {name: _coerce(name, _named(argv, name), "command line") for name in DISTRIBUTED
                  if _named(argv, name) is not None}
        cfg = check_distributed(dataclasses.replace(Config(), **values))
    except ConfigError:
        return None
    return tuple(getattr(cfg, name) for name in DISTRIBUTED)


def parse_given(argv: list[str] | None = None) -> Given:
    """The options this command sets, from its preset and its flags (flags win), checked one by
    one; options it does not set are absent."""
    argv = sys.argv[1:] if argv is None else list(argv)
    algo = _named_algo(argv)
    if algo is not None:  # an outside algorithm (MODULE:NAME): its module registers it, with its options
        ALGORITHMS.options(algo)
    p = parser(algo)
    args = vars(p.parse_args(_values_attached(argv, p)))
    return _over_preset({k: _coerce(k, v, "command line") for k, v in args.items() if v is not None})


def given_from(options: dict) -> Given:
    """The options a Python caller sets, as keyword arguments named as the command line's flags
    are (`num_envs=64`, `config="cartpole"` for a preset), checked as a command line is."""
    if isinstance(options.get("algo"), str):
        ALGORITHMS.options(options["algo"])
    known = known_options()
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not an option (options are named as the flags are, num_envs for "
                          f"--num-envs; python -m jaxrl_mgpu.train --help-all lists them)")
    def flag_value(name, value):  # resume=True as a bare --resume (its const); False as leaving it out
        const = known[name].const
        return (const if value else None) if const is not None and isinstance(value, bool) else value

    options = {k: flag_value(k, v) for k, v in options.items()}
    return _over_preset({k: _coerce(k, v, "option") for k, v in options.items() if v is not None})


def _over_preset(given: dict) -> Given:
    """`given` over its preset's options (it wins); `flags`: what `given` itself sets."""
    preset = load_preset(given["config"]) if given.get("config") else {}
    dropped = ()
    if "algo" in given and preset.get("algo", given["algo"]) != given["algo"]:
        # the preset's options of its own algorithm that the chosen one has not (a SAC preset's
        # --init-alpha under --algo td3) go: the run says so under its banner
        fields = fields_of(config_class(given["algo"]))
        dropped = tuple(k for k in preset if k not in fields)
        preset = {k: v for k, v in preset.items() if k in fields}
    values = Given(preset)
    values.update(given)
    values.flags, values.dropped = frozenset(given), dropped
    size = ALGORITHMS.options(algo_of(values)).size
    if given.get("auto_scale") and size in given:
        raise ConfigError(f"--auto-scale chooses {flag(size)} itself; give one or the other")
    return values


def algo_of(given: dict) -> str:
    """The algorithm of the run `given` describes: its --algo (or its preset's), else, resuming,
    the saved run's, else the default."""
    if "algo" in given:
        return given["algo"]
    if given.get("resume") and given.get("run_dir"):
        try:
            return read_saved(given["run_dir"])["algo"]
        except ConfigError:  # no run there yet (--resume auto), or one the resume reports on
            pass
    return COMMON_FIELDS["algo"].default


def build(given: dict) -> Config:
    """The Config of the options `given` (a preset's and the flags', or a Python caller's): its
    algorithm's dataclass, each option it does not set at its algorithm's default; an option
    the algorithm has not (another algorithm's) is a ConfigError naming the algorithms it is for."""
    cls = config_class(algo_of(given))
    fields = fields_of(cls)
    own = {k: v for k, v in given.items() if k in fields}
    foreign = [k for k in given if k not in fields]
    if foreign:  # said as check_applicable says it, of the run as it would be without them
        raise refuse(foreign[0], cls(**own), given)
    return cls(**own)


def parse_args(argv: list[str] | None = None) -> Config:
    """The command line (with its preset) as a Config; only the multi-host flags are checked
    (the rest by `validate`, which may import environments, hence JAX's backend, so it must
    come after `parallel.initialize`)."""
    return check_distributed(build(parse_given(argv)))


def from_args(argv: list[str] | None = None) -> Config:
    """Parses the command line (with its preset) into a validated Config."""
    return validate(parse_args(argv))


def check_distributed(cfg: Config) -> Config:
    given = [cfg.coordinator_address is not None, cfg.num_processes is not None, cfg.process_id is not None]
    if any(given) and not all(given):
        raise ConfigError("--coordinator-address, --num-processes and --process-id go together: give all three")
    if cfg.num_processes is not None and not 0 <= cfg.process_id < cfg.num_processes:
        raise ConfigError(f"--process-id {cfg.process_id} must be in 0..{cfg.num_processes - 1} (--num-processes)")
    return cfg
