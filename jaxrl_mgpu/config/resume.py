"""A run's saved config (config.json): reading it back, what a resume may change in it, and
the options of a checkpoint that must not differ."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config.catalogue import (_coerce, config_class, defaults, fields_of, flag, from_dict, per_invocation,
                                         resumable, state_keys)
from jaxrl_mgpu.config.options import Config
from jaxrl_mgpu.config.checks import parse_sweep


def read_saved(run_dir: str | Path) -> dict:
    """A run directory's config.json, or a ConfigError saying what is wrong with it."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"--run-dir {run_dir} is not a run directory (no config.json)")
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("algo"), str):
        raise ConfigError(f"{path} is not a jaxrl_mgpu run config")
    # Every field as the command line would take it (a hand-edited file must not reach the run).
    unknown = sorted(set(saved) - set(fields_of(config_class(saved["algo"]))))
    if unknown:
        raise ConfigError(f"{path}: unknown option(s) {', '.join(unknown)} (written by another version of "
                          f"jaxrl_mgpu?)")
    return {name: _coerce(name, value, str(path)) for name, value in saved.items()}


def resumed(saved: dict, given: dict) -> tuple[Config, list[str]]:
    """The config of a resumed run: its saved config.json, with the options this command sets
    that a resume may change (`resumable` for the run's algorithm) and this invocation's own
    (`per_invocation`). Returns it and the changes, as 'name old -> new' strings; any other
    option set to a different value is a ConfigError."""
    saved_cfg = from_dict(saved)
    fresh = Config()
    may_change, invocation = resumable(saved_cfg), per_invocation()
    swept = dict(parse_sweep(saved_cfg)) if saved_cfg.sweep else {}
    changes, refused = [], []
    for name, value in given.items():
        old = getattr(saved_cfg, name)
        if name in swept:  # each run keeps its own value; the option itself is not what they use
            values = ",".join(f"{v:g}" for v in swept[name])
            raise ConfigError(f"--resume: {flag(name)} is swept in this run ({name}={values}); a resume cannot change "
                              f"a swept option")
        if name in invocation or value == old:
            continue
        if name in may_change:
            changes.append(f"{flag(name)} {old} -> {value}")
        else:
            has = "does not set it" if old is None else f"has {old!r}"
            refused.append(f"{flag(name)} {value!r} (the run {has})")
    if refused:
        allowed = ", ".join(map(flag, may_change))
        raise ConfigError(f"--resume keeps the run's own settings (its config.json); this command changes "
                          f"{'; '.join(refused)}. A resume may change {allowed}, and the per-invocation options "
                          f"(--stop-at-update, --devices, the multi-host flags)")
    this_invocation = {name: given.get(name, getattr(fresh, name)) for name in invocation}
    return dataclasses.replace(saved_cfg, **{k: v for k, v in given.items() if k in may_change},
                               **this_invocation), changes


def incompatible(saved: dict, cfg: Config, keys: tuple[str, ...] | None = None) -> list[str]:
    """The options among `keys` (default: those that shape the state of `cfg`'s algorithm)
    whose values differ between a saved run and `cfg`. An option the saved config predates had
    its algorithm's default then."""
    then = defaults(saved.get("algo", cfg.algo))
    return [f"{k.replace('_', '-')} ({saved.get(k, then.get(k))!r} vs {getattr(cfg, k)!r})"
            for k in (state_keys(cfg) if keys is None else keys)
            if saved.get(k, then.get(k)) != getattr(cfg, k)]


def dump(cfg: Config) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
