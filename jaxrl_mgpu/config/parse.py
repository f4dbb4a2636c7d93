"""The command line, its help, the presets, and a Python caller's options (`given_from`):
what one command sets (`Given`), each value checked as it is read."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path

import yaml

from jaxrl_mgpu.cli import ConfigError, Parser
from jaxrl_mgpu.config.declare import GROUPS, POSITIVE, RESUME_MAY_CHANGE, THIS_INVOCATION
from jaxrl_mgpu.config.options import ALGO_DEFAULTS, FIELDS, OPTIONS, Config, _base_type, _coerce, build, flag
from jaxrl_mgpu.config.checks import validate


PRESET_DIRS = (Path(__file__).resolve().parent.parent / "presets",)  # package data: installed with the package

# -- the command line and its help ----------------------------------------------------------------

PROG = "python -m jaxrl_mgpu.train"
DESCRIPTION = ("Train an RL agent data-parallel on all local devices. Numbers are GLOBAL, over all devices and "
               "hosts; flags override a --config preset, which overrides the defaults.")
HELP_WIDTH = 100     # at most; narrower terminals get narrower help
FLAG_COLUMN = 26     # where an option's text starts


def _usage(name: str) -> str:
    """How the command line writes an option and its value: --num-envs N, --[no-]anneal-lr."""
    o, kind = OPTIONS[name], _base_type(name)
    if kind is bool:
        return "--[no-]" + flag(name)[2:]
    metavar = o.metavar or ("NAME" if o.choices else {int: "N", float: "X"}.get(kind, "TEXT"))
    return flag(name) + {"?": f" [{metavar}]", "+": f" {metavar} [...]"}.get(o.nargs, f" {metavar}")


def _describe(name: str, width: int, whole: bool) -> list[str]:
    """An option's lines in the help: its flag, then its text (`whole`: the full text and what
    the declaration says about it; else its brief), its choices and its default."""
    o, default = OPTIONS[name], FIELDS[name].default
    text = (o.help if whole else o.brief or o.help) + (f"; one of {', '.join(map(str, o.choices))}" if o.choices else "")
    text += f" (default: {default}{_algo_defaults(name)})" if default is not None else ""
    if whole:  # what the declaration says, but what the group's name says already
        at_least_1 = o.check is POSITIVE and _base_type(name) is int
        notes = [("at least 1" if at_least_1 else o.check.text)] if o.check else []
        notes += [f"only for {o.applies.who}"] if o.applies and o.applies.who != f"--algo {o.group}" else []
        notes += {RESUME_MAY_CHANGE: ["a resume may change it"],
                  THIS_INVOCATION: ["per invocation"]}.get(o.resume, [])
        notes += [f"sweepable ({', '.join(o.sweep)})"] if o.sweep else []
        text += f" [{'; '.join(notes)}]" if notes else ""
    head = f"  {_usage(name)}"
    body = textwrap.wrap(text, width - FLAG_COLUMN, break_on_hyphens=False, break_long_words=False)
    if len(head) >= FLAG_COLUMN - 1:  # a long flag: its text starts on the next line
        return [head] + [" " * FLAG_COLUMN + line for line in body]
    return [head.ljust(FLAG_COLUMN) + body[0]] + [" " * FLAG_COLUMN + line for line in body[1:]]


def _algo_defaults(name: str) -> str:
    """The algorithms whose own default of option `name` differs from its declared one, as the
    help says it: '; sac, td3: 256'."""
    by_value: dict = {}
    for algo, values in ALGO_DEFAULTS.items():
        if name in values:
            by_value.setdefault(values[name], []).append(algo)
    return "".join(f"; {', '.join(algos)}: {value}" for value, algos in by_value.items())


def help_text(group: str | None = None, width: int | None = None) -> str:
    """--help: the common options, the groups and the presets; --help GROUP: every option of
    that group, whole; --help all (or --help-all): every group."""
    if group is not None and group != "all" and group not in GROUPS:
        raise ConfigError(f"--help {group}: no such group; groups: {', '.join(GROUPS)} (or all)")
    width = min(width or shutil.get_terminal_size((HELP_WIDTH, 24)).columns, HELP_WIDTH) - 2
    shown = [n for n, o in OPTIONS.items() if not o.internal]
    wrap = lambda text, indent="": textwrap.wrap(text, width, break_on_hyphens=False, subsequent_indent=indent)
    lines = [f"usage: {PROG} [--OPTION VALUE ...]", "", *wrap(DESCRIPTION)]
    if group is None:
        lines += ["", "common options, by group:"]
        for g in GROUPS:
            common = [n for n in shown if OPTIONS[n].group == g and OPTIONS[n].common]
            lines += [f" {g}:"] * bool(common) + [line for n in common for line in _describe(n, width, whole=False)]
        lines += ["", "option groups (--help GROUP: all of its options; --help-all: every option):"]
        lines += [line for g, about in GROUPS.items() for line in wrap(f"  {g:<10}{about}", " " * 12)]
    for g in (GROUPS if group == "all" else [group] if group else []):
        lines += ["", f"{g} options: {GROUPS[g]}"]
        lines += [line for n in shown if OPTIONS[n].group == g for line in _describe(n, width, whole=True)]
    lines += ["", *wrap(f"presets (--config NAME): {', '.join(preset_names())}", "  ")]
    return "\n".join(lines)


class _ShowHelp(argparse.Action):
    """--help [GROUP] and --help-all: print that help, exit 0."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(help_text("all" if option_string == "--help-all" else values))
        parser.exit()


def parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, add_help=False)
    p.add_argument("-h", "--help", action=_ShowHelp, nargs="?", metavar="GROUP", default=argparse.SUPPRESS)
    p.add_argument("--help-all", action=_ShowHelp, nargs=0, default=argparse.SUPPRESS)
    for name, o in OPTIONS.items():
        if o.internal:
            continue
        if _base_type(name) is bool:
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
    unknown = sorted(set(data) - {n for n, o in OPTIONS.items() if not o.internal} - {"config"})
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
    names its flags set (the user's explicit choices)."""
    flags: frozenset = frozenset()


def parse_given(argv: list[str] | None = None) -> Given:
    """The options this command sets, from its preset and its flags (flags win), checked one by
    one; options it does not set are absent."""
    p = parser()
    args = vars(p.parse_args(_values_attached(sys.argv[1:] if argv is None else list(argv), p)))
    return _over_preset({k: _coerce(k, v, "command line") for k, v in args.items() if v is not None})


def given_from(options: dict) -> Given:
    """The options a Python caller sets, as keyword arguments named as the command line's flags
    are (`num_envs=64`, `config="cartpole"` for a preset), checked as a command line is."""
    unknown = sorted(k for k in options if k not in FIELDS)
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not an option (options are named as the flags are, num_envs for "
                          f"--num-envs; python -m jaxrl_mgpu.train --help-all lists them)")
    def flag_value(name, value):  # resume=True as a bare --resume (its const); False as leaving it out
        const = OPTIONS[name].const
        return (const if value else None) if const is not None and isinstance(value, bool) else value

    options = {k: flag_value(k, v) for k, v in options.items()}
    return _over_preset({k: _coerce(k, v, "option") for k, v in options.items() if v is not None})


def _over_preset(given: dict) -> Given:
    """`given` over its preset's options (it wins); `flags`: what `given` itself sets."""
    if given.get("auto_scale") and given.keys() & {"num_envs", "ad_batch_size"}:
        size = "--num-envs" if "num_envs" in given else "--ad-batch-size"
        raise ConfigError(f"--auto-scale chooses {size} itself; give one or the other")
    values = Given(load_preset(given["config"]) if given.get("config") else {})
    values.update(given)
    values.flags = frozenset(given)
    return values


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
