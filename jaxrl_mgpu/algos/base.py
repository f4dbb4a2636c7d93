"""The interface between an algorithm and the training loop.

Every algorithm package (algos/ppo/, dqn/, ...) builds an `Algorithm` from a resolved run
(`Resolved`: the plan.Plan of the run, with its environment made once, its devices and its
batch split); the runner knows nothing else of it. The functions are per device: the runner maps
them over the devices (parallel.py), and their only parallel code is the collectives on
parallel.AXIS.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generic, NamedTuple, Protocol, TypeVar

import jax
import jax.numpy as jnp


class Resolved(Protocol):
    """What an algorithm is built from: a run resolved once (plan.Plan is one). Its spec's
    callables (algos/spec.py) read the environment from here and never make it again."""
    cfg: Any                       # the run's config: the common options and the algorithm's own
    env: Any                       # the environment (envs.make), made once
    env_params: Any
    par: Any                       # the devices (parallel.Parallel); None before they are set up
    split: "BatchSplit | None"     # the batch over the data devices; None until the spec's check


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """How an algorithm's policy plays evaluation episodes where they are not
    episodes.make_episodes' (multi-agent games): the trainer's --eval-every, `evaluate` and
    `evaluate --video` all go through it."""
    # (total, num_devices, greedy, random_sides=()) -> (per-device (params, key) -> sums,
    # sums -> dict with mean_return); the sides named in random_sides act uniformly at random
    episodes: Callable
    sides: tuple[str, ...]         # what can be played at random (a game's teams), one at a time or together
    choose: Callable               # greedy -> ((pi, noise keys) -> (action, what the env takes)), for a video


class Progress(NamedTuple):
    """How a run's progress is counted: `per_update` of `unit` (env_steps, tokens, update) per
    update, over all devices (plan.Plan.progress: its spec's, or a learner's one update)."""
    unit: str
    per_update: int


Parts = TypeVar("Parts")


@dataclasses.dataclass(frozen=True)
class Algorithm(Generic[Parts]):
    init: Callable          # key -> state (the same key on every device: identical parameters)
    update: Callable        # state, *data -> state, (losses: dict, vec.EpisodeStats of the update)
    layout: dict            # the state's checkpoint layout: a checkpoint.Layout per field (REPLICATED, PER_ENV, ...)
    policy: Any = None      # nets.actor_critic.Policy for evaluation episodes (None: not evaluated)
    data: tuple = ()        # device inputs every update reads and none changes (a dataset shard)
    parts: Parts | None = None  # the algorithm's own functions (its typed record: ppo.Algo, ...), for tests and tools
    agents_per_env: int = 1  # a multi-agent env's agents: an env step is this many agent steps
    evaluation: Evaluation | None = None  # its own evaluation episodes (None: episodes.make_episodes)
    # (losses, state) -> whether an update's numbers are finite: a bool, or one per run where
    # the state holds many (multirun.py: there a run that goes non-finite stops alone). None:
    # all_finite of the losses and the parameters.
    finite: Callable | None = None
    episodic: bool = True   # its rows carry episode returns (False: AD's, which learns from a dataset)
    # The state's fields that learning changes, and its optimizers' states: a run of many
    # (multirun.py) whose update goes non-finite keeps the first and gets NaN in the second.
    learned: tuple[str, ...] = ("params",)
    optimizers: tuple[str, ...] = ("opt_state",)


def all_finite(*trees) -> Any:
    """Whether every number in `trees` is finite (a traced bool)."""
    return jnp.all(jnp.array([jnp.isfinite(x).all() for t in trees for x in jax.tree.leaves(t)]))


class Share(NamedTuple):
    """One quantity of the batch: over all devices, and on each device."""
    total: int
    per_device: int


@dataclasses.dataclass(frozen=True)
class BatchSplit:
    """How a config's batch splits over the devices: checked once, by the algorithm's spec's
    `check(cfg, num_devices)` (a ConfigError naming the option where it does not split), then
    read by the algorithm's `make`, the start-up banner and bench. An algorithm sets the
    quantities it has."""
    num_devices: int
    environments: Share | None = None     # environments stepped at once (PPO, MAPPO, DQN)
    minibatch: Share | None = None        # samples per gradient step
    replay: Share | None = None           # DQN's replay, in transitions
    windows: Share | None = None          # AD's sequences per update
    tasks: Share | None = None            # AD's learning histories in its dataset
    tasks_per_shard: Share | None = None  # an AD history collector's, per store shard
    history_buffer: Share | None = None   # an asynchronous AD learner's buffer of histories

    def rows(self) -> dict[str, Share]:
        """The quantities set, as the start-up banner names them."""
        return {_LABELS.get(f.name, f.name): getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "num_devices" and getattr(self, f.name) is not None}


_LABELS = {"replay": "replay buffer", "tasks_per_shard": "tasks per shard", "history_buffer": "buffer (histories)"}
