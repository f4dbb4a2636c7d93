"""The options of a run: the common ones in one typed dataclass, each algorithm's in its own
(algos/<name>/options.py), combined into the run's config; YAML presets; the command line.

Precedence: the option's default (or its algorithm's own, `AlgoOptions.defaults`) < `--config`
preset (YAML, shipped in jaxrl_mgpu/presets/, or any path) < flags given on the command line.
Numbers on the command line are GLOBAL (over all devices and hosts); per-device values are
derived from them once the devices are known.

Each option is declared once, with everything the rest of the package asks about it: its group
(what it configures: `--help GROUP` shows one), its range (checked here and nowhere else), which
runs use it (a run that would ignore it refuses it), what a resume may do with it, whether it
shapes the checkpointed state, whether `--sweep` may vary it. An algorithm's options say the
same of its own, and which of the common ones it reads, shapes and sweeps (`AlgoOptions`). The
lists the other modules need are computed from those declarations; nothing here names an
algorithm (`ALGORITHMS` is filled by jaxrl_mgpu.algos).

The package, by job: declare.py (how an option, and an algorithm's options, are declared),
options.py (`Config`: the common options), catalogue.py (the algorithms a run may name, a run's
config class, the lists, the check of one value), parse.py (the
command line, its help, presets, a Python caller's options), checks.py (the checks of a whole
config: `validate`), resume.py (a run's saved config and a resume).
"""

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config.declare import POLICIES, PRECISIONS, AlgoOptions
from jaxrl_mgpu.config.catalogue import (ALGORITHMS, check_applicable, check_value, config_class, defaults, fields_of,
                                         flag, from_dict, known_options, options_of, own_options, per_invocation,
                                         resumable, state_keys, sweepable)
from jaxrl_mgpu.config.options import COMMON_FIELDS, Config, algo_options, uses
from jaxrl_mgpu.config.checks import check_multirun, check_platform, follow_log_grid, parse_sweep, validate
from jaxrl_mgpu.config.parse import (Given, algo_of, build, check_distributed, distributed_before_parse, from_args,
                                     given_from, groups, help_text, load_preset, parse_args, parse_given, parser,
                                     preset_names)
from jaxrl_mgpu.config.resume import dump, incompatible, read_saved, resumed

__all__ = ["ALGORITHMS", "COMMON_FIELDS", "POLICIES", "PRECISIONS", "AlgoOptions", "Config", "ConfigError", "Given",
           "algo_of", "algo_options", "build", "check_applicable", "check_distributed", "check_multirun",
           "check_platform", "check_value", "config_class", "defaults", "distributed_before_parse", "dump", "flag", "follow_log_grid", "from_args",
           "from_dict", "fields_of", "given_from", "groups", "help_text", "incompatible", "known_options", "load_preset",
           "options_of", "own_options", "parse_args", "parse_given", "parse_sweep", "parser", "per_invocation",
           "preset_names", "read_saved", "resumable", "resumed", "state_keys", "sweepable", "uses", "validate"]
