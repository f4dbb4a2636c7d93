"""How an option is declared: its group, its range, the runs that use it, what a resume does
with it (config/options.py declares every option of `Config` with these)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple



ALGOS = ("ppo", "dqn", "ad", "sac", "td3")  # the package's own; others are registered with jaxrl_mgpu.algos.register
EVERY_ALGO = ("*",)  # an Option's `state`: it shapes the checkpointed state of every algorithm, registered ones too
POLICIES = ("mlp", "transformer")
PRECISIONS = ("fp32", "bf16", "fp16")
SOURCE_ALGOS = ("ucb", "q")  # exploration of AD's tabular Q-learning source (tools/histories.py)

# -- how an option is declared -----------------------------------------------------------------

# The groups, in the order `--help` lists them, with the line it says about each.
RUN, ENV, LEARNING, NETWORK, PPO, DQN, OFF_POLICY, AD, MULTIRUN, ASYNC, DEVICES = (
    "run", "env", "learning", "network", "ppo", "dqn", "sac-td3", "ad", "multirun", "async", "devices")
GROUPS = {
    RUN: "what to train, for how long; the run directory, logs, checkpoints, evaluation, resume",
    ENV: "the environment, and how many of it step at once",
    LEARNING: "the optimizer, the discount, the compute precision (every algorithm)",
    NETWORK: "the policy network: the MLP, the transformer and its fused kernels",
    PPO: "PPO: its loss, minibatches and epochs, normalisation, actor and critic widths",
    DQN: "DQN (the replay's and the targets' options also SAC's and TD3's): the replay, the target network, "
         "epsilon-greedy exploration, n-step returns",
    OFF_POLICY: "SAC and TD3, continuous control off-policy: the critics, exploration, the temperature, the policy "
                "delay (the replay's options are in the dqn group)",
    AD: "Algorithm Distillation: the dataset, its windows, its collectors' source learners",
    MULTIRUN: "many runs in one compiled program: --num-seeds, --sweep",
    ASYNC: "--mode learn / collect: learners and collectors sharing a run's trajectory store",
    DEVICES: "devices and hosts: pmap or shard_map, --auto-scale, the multi-host flags",
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
    Giving the option to any other run is an error, not a silent no-op."""
    who: str
    test: Callable[[Any], bool]


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
    applies: Applies | None = None  # None: every run uses it
    resume: str = RESUME_KEEPS
    state: tuple[str, ...] = ()   # the algorithms whose checkpointed state it shapes (a resume never changes it; EVERY_ALGO: all)
    sweep: tuple[str, ...] = ()   # the algorithms whose --sweep may vary it (an update reads it only as a number)
    nargs: str | None = None
    const: Any = None
    metavar: str | None = None
    internal: bool = False        # set by the package (a resume), never on the command line


def option(default: Any, help: str, group: str, **kw) -> Any:
    """A field of Config: its default, and the rest of its declaration (Option's fields)."""
    return dataclasses.field(default=default, metadata={"option": Option(help, group, **kw)})


# Who uses the options that only some runs use.
FOR_PPO = Applies("--algo ppo", lambda c: c.algo == "ppo")
FOR_PPO_MLP = Applies("--algo ppo --policy mlp", lambda c: c.algo == "ppo" and c.policy == "mlp")
FOR_DQN = Applies("--algo dqn", lambda c: c.algo == "dqn")
FOR_AD = Applies("--algo ad", lambda c: c.algo == "ad")
FOR_ENV_STEPS = Applies("--algo ppo, dqn, sac or td3", lambda c: c.algo != "ad")
FOR_MLP = Applies("an MLP (--policy mlp, --algo ppo, dqn, sac or td3)", lambda c: c.algo != "ad" and c.policy == "mlp")
FOR_TRANSFORMER = Applies("a transformer (--policy transformer, or --algo ad)",
                          lambda c: c.algo == "ad" or c.policy == "transformer")
FOR_TRANSFORMER_POLICY = Applies("--policy transformer", lambda c: c.algo != "ad" and c.policy == "transformer")
FOR_AD_DATASET = Applies("--algo ad with --mode both", lambda c: c.algo == "ad" and c.mode == "both")
FOR_AD_STORE = Applies("--algo ad with --mode learn or collect", lambda c: c.algo == "ad" and c.mode != "both")
# Learners and collectors of one run may share one command line, so these are for both.
FOR_STORE = Applies("--mode learn or collect", lambda c: c.mode != "both")
FOR_MANY_RUNS = Applies("many runs (--num-seeds > 1 or --sweep)", lambda c: c.num_seeds > 1 or bool(c.sweep))
FOR_TRAINING = Applies("training (--mode both or learn)", lambda c: c.mode != "collect")
FOR_PROFILE = Applies("--profile", lambda c: c.profile is not None)
FOR_AUTO_SCALE = Applies("--auto-scale", lambda c: c.auto_scale is not None)
# AD's run is --num-updates long whatever its batch: the minimum does not bite there.
FOR_AUTO_SCALE_STEPS = Applies("--auto-scale with --algo ppo, dqn, sac or td3 (AD trains --num-updates at any size)",
                               lambda c: c.auto_scale is not None and c.algo != "ad")

PPO_DQN = ("ppo", "dqn")  # the algorithms that step environments themselves
OFF_POLICY_ALGOS = ("sac", "td3")  # algos/sac.py
REPLAY_ALGOS = ("dqn",) + OFF_POLICY_ALGOS
# The replay learners' collectors write segments of episodes (algos/replay_async.py); AD's
# write whole learning histories (--ad-history-tasks x --ad-history-steps) one shard at a time,
# and its learner reads those few large shards on a thread.
FOR_REPLAY_STORE = Applies("--algo dqn, sac or td3 with --mode learn or collect",
                           lambda c: c.algo in REPLAY_ALGOS and c.mode != "both")
FOR_REPLAY = Applies("--algo dqn, sac or td3", lambda c: c.algo in REPLAY_ALGOS)
FOR_MLP_ACTOR_CRITIC = Applies("--algo ppo --policy mlp, sac or td3",
                               lambda c: (c.algo == "ppo" and c.policy == "mlp") or c.algo in OFF_POLICY_ALGOS)
FOR_REWARD_SCALE = Applies("--algo ppo, sac or td3", lambda c: c.algo in ("ppo",) + OFF_POLICY_ALGOS)
FOR_OFF_POLICY = Applies("--algo sac or td3", lambda c: c.algo in OFF_POLICY_ALGOS)
FOR_SAC = Applies("--algo sac", lambda c: c.algo == "sac")
FOR_TD3 = Applies("--algo td3", lambda c: c.algo == "td3")
FOR_CATEGORICAL = Applies("--algo sac or td3 with --critic categorical",
                          lambda c: c.algo in OFF_POLICY_ALGOS and c.critic == "categorical")
