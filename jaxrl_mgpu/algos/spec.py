"""What the host reads of an algorithm: one frozen `Spec` per algorithm, registered by name
(registry.py).

An algorithm is a package of per-device functions (algos/ppo/, dqn/, ...) and the `Spec` that
tells the rest of the program how to run it: its options, how its batch splits over the
devices, how to build it, how its progress is counted and shown, what --auto-scale leaves, how
it is evaluated. An algorithm that also runs as `--mode learn` / `--mode collect` (DQN, SAC,
TD3, AD) says how in its `asynchronous` record: the learner's update, its data source
(sources.LearnerSource) fed from the run's store, and the collector.

Adding an algorithm is a module with its options, its functions and a `register` call
(examples/custom_algo.py does it from outside the package; docs/algorithms.md walks through it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxrl_mgpu.algos.base import Algorithm, BatchSplit, Evaluation, Resolved
from jaxrl_mgpu.config.declare import AlgoOptions
from jaxrl_mgpu.sources import LearnerSource


@dataclasses.dataclass(frozen=True)
class Asynchronous:
    """`--mode learn` and `--mode collect` of one algorithm (algos/dqn/asynchronous.py, ...).
    `run`: the resolved run (base.Resolved)."""
    check: Callable       # (run, num_devices) -> BatchSplit of the learner's memory, or a ConfigError
    per_update: Callable  # cfg -> what one learner iteration does, in words (the banner)
    algorithm: Callable   # run -> Algorithm: the learner's update, on the source's data
    # (run, Algorithm, ckpts, log, resume_step, state) -> the learner's data source (LearnerSource)
    source: Callable[..., LearnerSource]
    collect: Callable     # (run, log, stop) -> env steps a collector wrote to the store
    collects: Callable    # cfg -> what one collector runs, in words (its start line)


@dataclasses.dataclass(frozen=True)
class Spec:
    """Everything the host reads of one algorithm (its name is the one it is registered under).
    The callables that build take the resolved run (`run`, a base.Resolved: the config, the
    environment made once, the devices and the split); those that count take the config. None
    holds state."""
    options: AlgoOptions                        # its options, and how it uses the common ones
    # (run, data devices) -> how the batch splits over them (base.BatchSplit), or
    # a ConfigError naming the option that does not split (run.split is not set yet)
    check: Callable[[Resolved, int], BatchSplit]
    algorithm: Callable[[Resolved], Algorithm]  # run -> what the trainer runs (algos/base.Algorithm)
    # run -> its nets.actor_critic.Policy: parameter shapes (jax.eval_shape of `init_params`)
    # and evaluation episodes, without building the algorithm (run.par may be None)
    policy: Callable[[Resolved], Any]
    # cfg -> progress per update over all devices, in `step_unit`
    steps_per_update: Callable[[Any], int]
    # cfg -> the config whose update auto-scale times (DQN: past its warm-up), often cfg itself
    steady_state: Callable[[Any], Any] = lambda cfg: cfg
    step_unit: str = "env_steps"                # what progress is counted in
    console: tuple[tuple[str, str, str], ...] = ()  # (label, metric key, format) on the progress line
    summary: tuple[str, ...] = ()               # metric keys the summary carries
    # what --auto-scale leaves as configured, and so what grows or shrinks with the size (in words)
    auto_scale_keeps: str = "minibatch count, epochs and lr as configured, so minibatches grow with the batch"
    evaluated_by: str = "episodes"              # "episodes" (evaluate) or "in-context" (incontext)
    # cfg -> the tokens its transformer's learner attends over whole, without a key/value cache
    # (AD's windows), which --attention pallas fuses; None: it attends over a cached prefix (PPO's
    # and DQN's transformer policies), which the fused kernel does not take
    attention_window: Callable[[Any], int] | None = None
    # run -> how its policy plays evaluation episodes, where not as episodes.make_episodes plays
    # them (multi-agent games); its Algorithm's `evaluation` is the same
    evaluation: Callable[[Resolved], Evaluation] | None = None
    multi_agent: "Spec | None" = None           # the spec that trains it on a multi-agent game
    asynchronous: Asynchronous | None = None    # --mode learn|collect (None: --mode both only)
