"""Every option of a run, in one typed dataclass; YAML presets; the command line.

Precedence: the option's default (or its algorithm's own, `ALGO_DEFAULTS`) < `--config` preset (YAML, shipped in jaxrl_mgpu/presets/, or
any path) < flags given on the command line. Numbers on the command line are GLOBAL (over all devices and hosts);
per-device values are derived from them once the devices are known.

Each option is declared once, in `Config` (or an algorithm's module it inherits), with everything the rest of the package asks about
it: its group (what it configures: `--help GROUP` shows one), its range (checked here and
nowhere else), which runs use it (a run that would ignore it refuses it), what a resume may do
with it, which algorithms' checkpointed state it shapes, and which algorithms' `--sweep` may
vary it. The lists the other modules need are computed from those declarations.

The package, by job: declare.py (how an option is declared), options.py (`Config`: every
option; those of one algorithm are declared in its own module, ppo.py, dqn.py, offpolicy.py and
ad.py, and `Config` inherits them), parse.py (the command line, its help, presets, a Python caller's options), checks.py
(the checks of a whole config: `validate`), resume.py (a run's saved config and a resume).
"""

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config.declare import ALGOS, GROUPS, POLICIES, PRECISIONS, SOURCE_ALGOS
from jaxrl_mgpu.config.options import (ALGO_DEFAULTS, FIELDS, OPTIONS, Config, build, check_applicable, check_value,
                                       defaults, flag, from_dict, per_invocation, resumable, state_keys, sweepable)
from jaxrl_mgpu.config.checks import (check_kernels, check_multirun, check_platform, follow_log_grid, parse_sweep,
                                      validate)
from jaxrl_mgpu.config.parse import (Given, check_distributed, from_args, given_from, help_text, load_preset,
                                     parse_args, parse_given, parser, preset_names)
from jaxrl_mgpu.config.resume import dump, incompatible, read_saved, resumed

__all__ = ["ALGOS", "ALGO_DEFAULTS", "FIELDS", "GROUPS", "OPTIONS", "POLICIES", "PRECISIONS", "SOURCE_ALGOS", "Config", "ConfigError",
           "Given", "build", "check_applicable", "check_distributed", "check_kernels", "check_multirun", "check_platform",
           "check_value", "defaults", "dump", "flag", "follow_log_grid", "from_args", "from_dict", "given_from", "help_text",
           "incompatible", "load_preset", "parse_args", "parse_given", "parse_sweep", "parser", "per_invocation",
           "preset_names", "read_saved", "resumable", "resumed", "state_keys", "sweepable", "validate"]
