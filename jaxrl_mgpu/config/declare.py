"""How an option is declared: its group, its range, the runs that use it, what a resume does
with it; and what the options layer knows of an algorithm (`AlgoOptions`, which each algorithm
declares in its own options module, algos/<name>/options.py). Nothing here names an algorithm."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

POLICIES = ("mlp", "transformer")
TRACKERS = ("wandb", "mlflow")  # --track's (tracking.py)
PRECISIONS = ("fp32", "bf16", "fp16")

# -- how an option is declared -----------------------------------------------------------------

# The common groups, with the line `--help` says about each. An algorithm's options bring
# groups of their own (`GROUPS` on its options' dataclass), listed between NETWORK and MULTIRUN.
RUN, ENV, LEARNING, NETWORK, MULTIRUN, ASYNC, DEVICES, TRACK = (
    "run", "env", "learning", "network", "multirun", "async", "devices", "track")
GROUPS_BEFORE = {
    RUN: "what to train, for how long; the run directory, logs, checkpoints, evaluation, resume",
    ENV: "the environment, and how many of it step at once",
    LEARNING: "the optimizer, the discount, the compute precision (every algorithm)",
    NETWORK: "the policy network: the MLP, the transformer and its fused kernels",
}
GROUPS_AFTER = {
    MULTIRUN: "many runs in one compiled program: --num-seeds, --sweep",
    ASYNC: "--mode learn / collect: learners and collectors sharing a run's trajectory store",
    DEVICES: "devices and hosts: pmap or shard_map, --auto-scale, the multi-host flags",
    TRACK: "experiment trackers beside the run's files: Weights & Biases, MLflow (docs/tracking.md)",
}


class Range(NamedTuple):
    """The values a number may take, as an error states them ("> 0") and as a test."""
    text: str
    holds: Callable[[Any], bool]


POSITIVE = Range("> 0", lambda v: v > 0)
NON_NEGATIVE = Range(">= 0", lambda v: v >= 0)
UNIT = Range("in [0, 1]", lambda v: 0 <= v <= 1)
UNIT_OPEN = Range("in (0, 1]", lambda v: 0 < v <= 1)


class Applies(NamedTuple):
    """The runs that use an option: who (as the refusal names them) and a test of the config.
    Giving the option to any other run is an error, not a silent no-op. `who` may say
    "{algos}": the algorithms that declare the option (their own) or read it (a common option
    of ALGORITHM_DEPENDENT), as `--algo a, b or c`; `listed(algo_options)` narrows that list."""
    who: str
    test: Callable[[Any], bool] = lambda c: True
    listed: Callable[["AlgoOptions"], bool] | None = None


# What a resume does with an option given on its command line:
RESUME_KEEPS = "keeps"            # the run's own value (config.json) stays; another value is refused
RESUME_MAY_CHANGE = "may change"  # the new value is taken and the change logged (unless it shapes the state)
THIS_INVOCATION = "invocation"    # of one invocation, not of the run: never taken from the saved config


@dataclasses.dataclass(frozen=True)
class Option:
    """What one option is, besides its name, type and default (the dataclass field's)."""
    help: str
    group: str
    common: bool = False          # a bare --help shows it (with `brief` where given)
    brief: str | None = None      # a bare --help's shorter text
    check: Range | None = None    # the values a number may take
    choices: tuple = ()
    applies: Applies | None = None  # None: every run that has it uses it
    resume: str = RESUME_KEEPS
    # it shapes the checkpointed state (a resume never changes it): an algorithm's own option,
    # of that algorithm; a common one, of every algorithm (AlgoOptions.state: of one)
    state: bool = False
    # an algorithm's own option its --sweep may vary (an update reads it only as a number); a
    # common one is swept where its algorithm says so (AlgoOptions.sweep)
    sweep: bool = False
    nargs: str | None = None
    const: Any = None
    metavar: str | None = None
    internal: bool = False        # set by the package (a resume), never on the command line


def option(default: Any, help: str, group: str, **kw) -> Any:
    """A field of an options dataclass: its default, and the rest of its declaration (Option's fields)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, group, **kw)})


# -- what the options layer knows of an algorithm ------------------------------------------------

# The common options only some algorithms read; an algorithm names those it reads in
# AlgoOptions.uses (the others refuse them: "--num-envs is only for --algo ...").
ENV_STEPPING = ("total_timesteps", "num_envs", "num_steps", "gamma", "auto_scale_min_updates")
TRANSFORMER = ("d_model", "n_layers", "n_heads", "attention", "mlp")
POLICY_NETWORKS = ("policy", "hidden_size", "num_layers", "activation", "context_len", "context_across_episodes",
                   *TRANSFORMER)
STORE_SEGMENTS = ("shard_steps", "store_workers")  # collectors of segments of episodes (the replay learners')
ALGORITHM_DEPENDENT = frozenset(ENV_STEPPING + POLICY_NETWORKS + STORE_SEGMENTS + ("num_updates",))


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """An algorithm with no options of its own."""


@dataclasses.dataclass(frozen=True)
class AlgoOptions:
    """What the options layer knows of one algorithm: its options, beside the common ones, and
    how it uses the common ones. Declared in the algorithm's options module (light: no JAX), so
    the command line, --help and a resume's checks read it without loading the algorithm."""
    # its own options: a frozen dataclass of `option(...)` fields (it may inherit groups of
    # options several algorithms share, algos/option_groups.py); a class attribute GROUPS
    # gives the --help line of each group its fields bring
    fields: type = NoOptions
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # its own defaults of any option
    uses: tuple[str, ...] = ()     # the common options of ALGORITHM_DEPENDENT it reads
    state: tuple[str, ...] = ()    # the common options that shape its checkpointed state (besides the every-run ones)
    sweep: tuple[str, ...] = ()    # the common options its --sweep may vary
    # why it cannot train many runs in one program (--num-seeds, --sweep); None: it can
    single_run: str | None = None
    size: str = "num_envs"         # the option --auto-scale chooses

    def groups(self) -> dict[str, str]:
        """The --help groups of its fields, {name: line}, base classes' first."""
        out: dict[str, str] = {}
        for cls in reversed(self.fields.__mro__):
            out.update(cls.__dict__.get("GROUPS", {}))
        return out
