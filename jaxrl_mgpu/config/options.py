"""Every option of a run, declared once in the typed `Config`, and what the other modules ask
of the declarations: the lists of options a resume keeps or may change, the ones that shape an
algorithm's state or its sweep, and the check of one value (`_coerce`, `check_value`)."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config.ad import AD_DEFAULTS, AdOptions
from jaxrl_mgpu.config.dqn import DQN_DEFAULTS, DqnOptions
from jaxrl_mgpu.config.offpolicy import OFF_POLICY_DEFAULTS, OffPolicyOptions
from jaxrl_mgpu.config.ppo import PpoOptions
from jaxrl_mgpu.config.declare import (ALGOS, ASYNC, DEVICES, ENV, EVERY_ALGO, FOR_AD, FOR_AUTO_SCALE,
                                       FOR_AUTO_SCALE_STEPS, FOR_ENV_STEPS, FOR_MANY_RUNS, FOR_MLP, FOR_PROFILE,
                                       FOR_REPLAY_STORE, FOR_STORE, FOR_TRAINING, FOR_TRANSFORMER,
                                       FOR_TRANSFORMER_POLICY, LEARNING, MULTIRUN, NETWORK, NON_NEGATIVE,
                                       OFF_POLICY_ALGOS, Option, POLICIES, POSITIVE, PPO_DQN, PRECISIONS,
                                       RESUME_MAY_CHANGE, RUN, THIS_INVOCATION, UNIT, UNIT_OPEN, option)


@dataclasses.dataclass(frozen=True)
class Config(AdOptions, OffPolicyOptions, DqnOptions, PpoOptions):
    # -- run: what to train, for how long, where it is written ------------------------------
    algo: str = option("ppo", f"algorithm: {', '.join(ALGOS)}, or one registered with jaxrl_mgpu.algos.register",
                       RUN, common=True, brief="algorithm: " + ", ".join(ALGOS), state=EVERY_ALGO, metavar="NAME")
    total_timesteps: int = option(3_000_000, "environment steps to train for, over all devices", RUN, common=True,
                                  check=POSITIVE, applies=FOR_ENV_STEPS, resume=RESUME_MAY_CHANGE)
    num_updates: int | None = option(None, "train for this many updates instead (the unit of --algo ad)", RUN,
                                     check=POSITIVE, applies=FOR_AD, resume=RESUME_MAY_CHANGE)
    seed: int = option(0, "random seed (params, environments and sampling all derive from it)", RUN, common=True,
                       brief="random seed of params, environments and sampling")
    run_dir: str | None = option(None, "output directory (default runs/<env>-<algo>-<time>)", RUN, common=True,
                                 resume=THIS_INVOCATION, metavar="DIR")
    config: str | None = option(None, "YAML preset: a path, or the name of a shipped preset (listed at the end of "
                                      "--help)", RUN, common=True, brief="YAML preset: a path or a name listed below",
                                resume=THIS_INVOCATION, metavar="PRESET")
    log_every: int = option(10, "updates per compiled chunk and per log point", RUN, common=True, check=POSITIVE,
                            resume=RESUME_MAY_CHANGE)
    checkpoint_every: int = option(100, "save a checkpoint every this many updates (a multiple of --log-every; "
                                        "0 = only at the end)", RUN, common=True,
                                   brief="checkpoint every this many updates (0: at the end only)", check=NON_NEGATIVE,
                                   resume=RESUME_MAY_CHANGE)
    keep_checkpoints: int = option(3, "how many of the latest checkpoints to keep", RUN, check=POSITIVE,
                                   resume=RESUME_MAY_CHANGE)
    resume: str | None = option(None, "continue the run in --run-dir from its latest complete checkpoint; "
                                      "'--resume auto': resume if there is one, else start fresh", RUN, common=True,
                                brief="continue --run-dir's run ('auto': or start it)",
                                choices=("latest", "auto"), nargs="?", const="latest", resume=THIS_INVOCATION,
                                metavar="auto")
    stop_at_update: int | None = option(None, "stop after this update with a checkpoint, as if preempted "
                                              "(the schedule still follows --total-timesteps); resume later", RUN,
                                        check=POSITIVE, resume=THIS_INVOCATION)
    eval_every: int = option(0, "evaluate every this many updates (a multiple of --log-every; 0 = never) "
                                "and keep the best checkpoint for `evaluate --best`", RUN, common=True,
                             brief="evaluate every this many updates (0: never)",
                             check=NON_NEGATIVE, resume=RESUME_MAY_CHANGE)
    eval_episodes: int = option(64, "episodes per evaluation, GLOBAL (spread over all devices)", RUN, check=POSITIVE,
                                resume=RESUME_MAY_CHANGE)
    compile_cache: str | None = option(None, "directory of JAX's persistent compilation cache, where compiled "
                                             "programs are kept for the next run (default: $JAX_COMPILATION_CACHE_DIR, "
                                             "else $XDG_CACHE_HOME/jaxrl_mgpu/jax); 'off': compile everything afresh",
                                       RUN, resume=THIS_INVOCATION, metavar="DIR")
    profile: str | None = option(None, "write a jax.profiler trace of two log intervals of training under this "
                                       "directory, one per process (TensorBoard's profile plugin or Perfetto open "
                                       "it; experiments/gpu/trace_summary.py sums it)", RUN, applies=FOR_TRAINING,
                                 resume=THIS_INVOCATION, metavar="DIR")
    profile_from: int | None = option(None, "the update after which the --profile trace starts (default: the end "
                                            "of the first log interval, so that compiling and warming up are left "
                                            "out)", RUN, check=NON_NEGATIVE, applies=FOR_PROFILE,
                                      resume=THIS_INVOCATION)
    # Where this run's count starts (set by a resume, not on the command line): a resume with
    # another --num-envs or --total-timesteps goes on from the env steps done, not from
    # update x the new batch.
    resumed_update: int = option(0, "update of the checkpoint this run resumed from", RUN, check=NON_NEGATIVE,
                                 internal=True)
    resumed_steps: int = option(0, "env steps (tokens for --algo ad) done by then", RUN, check=NON_NEGATIVE,
                                internal=True)

    # -- env ----------------------------------------------------------------------------------
    env: str = option("CartPole-v1", "environment: any gymnax name (e.g. Breakout-MinAtar), SUITE:TASK (e.g. "
                                     "brax:ant, dmc:CheetahRun) or a project env (envs/)", ENV, common=True,
                      brief="a gymnax name, SUITE:TASK or a project env", state=EVERY_ALGO, metavar="NAME")
    env_args: str | None = option(None, "arguments of a project env, NAME=VALUE,... (e.g. the Tag games' sizes: "
                                        "num_taggers=4,grid_length=100; see envs/tag.py)", ENV, common=True,
                                  brief="a project env's arguments, NAME=VALUE,... (the Tag games' sizes)",
                                  state=EVERY_ALGO, metavar="ARGS")
    # DQN's replay is a ring per environment, written num_steps rows per update: both shape its state.
    num_envs: int = option(32, "environments, GLOBAL over all devices (per device = num-envs / devices)", ENV,
                           common=True, brief="environments, GLOBAL over all devices", check=POSITIVE,
                           applies=FOR_ENV_STEPS, resume=RESUME_MAY_CHANGE, state=("dqn",))
    num_steps: int = option(128, "steps per environment per update (rollout length)", ENV, common=True,
                            check=POSITIVE, applies=FOR_ENV_STEPS, state=("dqn",))

    # -- learning -----------------------------------------------------------------------------
    lr: float = option(2.5e-4, "Adam learning rate", LEARNING, common=True, check=POSITIVE,
                       resume=RESUME_MAY_CHANGE, sweep=PPO_DQN + OFF_POLICY_ALGOS)
    # (PPO's and AD's optimizer state holds a schedule count only when annealing)
    anneal_lr: bool = option(True, "decay the learning rate linearly to 0 over training", LEARNING,
                             state=("ppo", "ad") + OFF_POLICY_ALGOS)
    gamma: float = option(0.99, "discount factor", LEARNING, common=True, check=UNIT, applies=FOR_ENV_STEPS,
                          sweep=PPO_DQN + OFF_POLICY_ALGOS)
    max_grad_norm: float = option(0.5, "clip gradients to this global norm (after the all-reduce)", LEARNING,
                                  common=True, check=POSITIVE, resume=RESUME_MAY_CHANGE,
                                  sweep=PPO_DQN + OFF_POLICY_ALGOS)
    precision: str = option("fp32", "compute dtype of forward and backward passes; params, optimizer state "
                                    "and metrics stay fp32; fp16 uses dynamic loss scaling", LEARNING,
                            choices=PRECISIONS)
    grad_accum: int = option(1, "micro-batches per optimizer step (gradients accumulated over them)", LEARNING,
                             check=POSITIVE)

    # -- network ------------------------------------------------------------------------------
    policy: str = option("mlp", "policy network: mlp, or transformer over the recent history (a conv "
                                "torso is added for image observations)", NETWORK, common=True,
                         brief="policy network", choices=POLICIES,
                         applies=FOR_ENV_STEPS, state=EVERY_ALGO)
    hidden_size: int = option(64, "width of the MLP layers", NETWORK, common=True, check=POSITIVE, applies=FOR_MLP,
                              state=EVERY_ALGO)
    num_layers: int = option(2, "hidden layers of the actor and of the critic MLP", NETWORK, check=POSITIVE,
                             applies=FOR_MLP, state=EVERY_ALGO)
    activation: str = option("tanh", "MLP activation (swish is silu, Brax's name for it)", NETWORK,
                             choices=("tanh", "relu", "gelu", "silu", "swish"), applies=FOR_MLP, state=EVERY_ALGO)
    d_model: int = option(128, "transformer width", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=EVERY_ALGO)
    n_layers: int = option(2, "transformer blocks", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=EVERY_ALGO)
    n_heads: int = option(4, "attention heads", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=EVERY_ALGO)
    context_len: int = option(64, "tokens (steps) each layer attends to, itself included", NETWORK, check=POSITIVE,
                              applies=FOR_TRANSFORMER_POLICY, state=PPO_DQN)
    context_across_episodes: bool = option(False, "let the context window cross episode boundaries (meta-RL)",
                                           NETWORK, applies=FOR_TRANSFORMER_POLICY)
    attention: str = option("xla", "transformer attention: xla; cudnn (flash attention, GPU); pallas (LayerNorm, "
                                   "QKV projection, RoPE and attention fused, windows of <= 128 tokens, --algo "
                                   "ad, GPU)", NETWORK, choices=("xla", "cudnn", "pallas"), applies=FOR_TRANSFORMER)
    mlp: str = option("xla", "transformer MLP half-blocks and output heads: xla; pallas (fused LayerNorm + "
                             "MLP + residual kernels, and final LayerNorm + heads, --d-model a power of 2 up "
                             "to 128, GPU)", NETWORK, choices=("xla", "pallas"), applies=FOR_TRANSFORMER)

    # -- multirun: many runs in one compiled program (multirun.py) -----------------------------
    num_seeds: int = option(1, "train this many independent runs in one program, with seeds seed, seed+1, ...: "
                               "own params, optimizer state, environments and keys; each run has --num-envs "
                               "environments", MULTIRUN, common=True,
                            brief="independent runs in one program, seeds seed, seed+1, ...", check=POSITIVE,
                            state=EVERY_ALGO)
    sweep: str | None = option(None, "NAME=v1,v2,... [NAME=...]: also cross these values of numeric options that "
                                     "do not change the program's shapes (lr, ent-coef, ...) with the seeds, as "
                                     "per-run values in the one compiled program", MULTIRUN, common=True,
                               brief="also cross these values of numeric options (lr, ...) with the seeds",
                               nargs="+", metavar="NAME=V,...", state=EVERY_ALGO)
    target_return: float | None = option(None, "the summary gives the fraction of seeds whose final return is "
                                               "above this", MULTIRUN, applies=FOR_MANY_RUNS,
                                         resume=RESUME_MAY_CHANGE)

    # -- async: collection and learning on one run directory (asynchronous/) ------------------
    mode: str = option("both", "both: act and learn in one process; learn: train from the run's trajectory store "
                               "and publish checkpoints; collect: follow the newest checkpoint and add episodes "
                               "to the store. A collector may start before its learner (even before --run-dir "
                               "exists): it waits for the learner's first params, saying so every minute, until "
                               "stopped (or acts at random meanwhile: --collect-before-checkpoint random); it stops "
                               "when the learner is done", ASYNC, common=True,
                       brief="act and learn in one process, or apart",
                       choices=("both", "learn", "collect"))
    store_max_episodes: int = option(100_000, "keep at most this many episodes in the store (oldest shards "
                                              "deleted first); --algo ad: also the capacity of the learner's "
                                              "on-device buffer, in whole learning histories", ASYNC,
                                     check=POSITIVE, applies=FOR_STORE)
    samples_per_insert: float | None = option(None, "the target of transitions sampled for gradient steps (AD: "
                                                    "steps of the sampled windows) per transition inserted "
                                                    "(Reverb's SampleToInsertRatio): the learner waits when it is "
                                                    "ahead, collectors pause when it is behind (default DQN: the "
                                                    "ratio of --mode both, updates-per-step x replay-batch-size / "
                                                    "num-envs; AD: 100)", ASYNC, check=POSITIVE, applies=FOR_STORE)
    samples_per_insert_tolerance: float = option(0.1, "the band around --samples-per-insert within which neither "
                                                      "side waits, as a fraction of the samples --learning-starts "
                                                      "transitions pay for (Acme's error buffer); at least "
                                                      "--max-data-lag iterations' samples, the data that may be on "
                                                      "its way", ASYNC, check=UNIT, applies=FOR_STORE)
    collect_before_checkpoint: str = option("wait", "collect: before the learner first publishes its params "
                                                    "(DQN: policy.msgpack), wait or act uniformly at random", ASYNC,
                                            choices=("wait", "random"), applies=FOR_STORE)
    collector_id: str | None = option(None, "collect: this collector's name in the store and the learner's "
                                            "metrics (default host-pid)", ASYNC, applies=FOR_STORE, metavar="NAME")
    max_data_lag: float = option(8.0, "the most data on its way from the collectors to the learner's memory "
                                      "(written to the store, being read or queued), in learner iterations' worth "
                                      "at --samples-per-insert (at least two shards): collectors pause beyond it, "
                                      "so the learner inserts data acted by params about this many iterations old "
                                      "at most. Lower: fresher data; higher: rides out slower writing and reading",
                                 ASYNC, check=POSITIVE, applies=FOR_STORE, resume=RESUME_MAY_CHANGE)
    shard_steps: int = option(16, "collect: vector steps of all environments per store shard (the unit the "
                                  "learner receives: larger shards, fewer files but staler data)", ASYNC,
                              check=POSITIVE, applies=FOR_REPLAY_STORE)
    store_workers: int = option(0, "processes that decode (learner) or encode (collector) the store's shards, "
                                   "several at once (0: a quarter of the host's cores, 1 to 4)", ASYNC,
                                check=NON_NEGATIVE, applies=FOR_REPLAY_STORE, resume=THIS_INVOCATION)

    # -- devices and hosts ----------------------------------------------------------------------
    devices: int | None = option(None, "use the first k local devices of each host (default: all)", DEVICES,
                                 common=True, check=POSITIVE, resume=THIS_INVOCATION)
    parallel: str = option("pmap", "how the per-device update is mapped over devices", DEVICES, common=True,
                           brief="mapping over devices",
                           choices=("pmap", "shard_map"), resume=RESUME_MAY_CHANGE)
    # sizing the work to the device (autoscale/)
    auto_scale: str | None = option(None, "choose the environments per device (AD: sequences per device) before "
                                          "training, from XLA's memory analysis of the compiled training chunk: "
                                          "'throughput' (what a bare --auto-scale means: the smallest size within "
                                          "5% of the fastest that fits, timed in a short probe; a larger batch buys "
                                          "no speed and gives fewer updates) or 'memory' (the largest that fits); "
                                          "minibatch count, epochs and lr stay as configured", DEVICES, common=True,
                                    brief="choose --num-envs by compiling and timing",
                                    choices=("throughput", "memory"), nargs="?", const="throughput",
                                    metavar="HOW")
    auto_scale_memory: float = option(0.9, "--auto-scale: the fraction of the device's memory the training chunk "
                                           "may take (XLA's allocator limit; on a CPU, host RAM / devices)", DEVICES,
                                      check=UNIT_OPEN, applies=FOR_AUTO_SCALE)
    auto_scale_min_updates: int = option(100, "--auto-scale (PPO, DQN): the fewest updates of --total-timesteps the "
                                              "chosen size must leave the run (a bigger batch is fewer updates); "
                                              "where even the smallest size leaves fewer, it is taken and said. AD "
                                              "trains --num-updates at any size", DEVICES, check=POSITIVE,
                                         applies=FOR_AUTO_SCALE_STEPS)
    auto_scale_seconds: int = option(120, "--auto-scale: the search's time budget in seconds: no size is started "
                                          "that would pass it, and the best size found by then is taken", DEVICES,
                                     check=POSITIVE, applies=FOR_AUTO_SCALE)
    # several hosts (jax.distributed); with none of these flags JAX detects SLURM / Open MPI
    coordinator_address: str | None = option(None, "host:port of process 0, the same on every process", DEVICES,
                                             resume=THIS_INVOCATION, metavar="HOST:PORT")
    num_processes: int | None = option(None, "processes in the job (one per host, or one per GPU group)", DEVICES,
                                       check=POSITIVE, resume=THIS_INVOCATION)
    process_id: int | None = option(None, "this process's index, 0 .. num-processes - 1", DEVICES,
                                    check=NON_NEGATIVE, resume=THIS_INVOCATION)
    local_device_ids: str | None = option(None, "comma-separated local device ids this process uses (e.g. 0,1)",
                                          DEVICES, resume=THIS_INVOCATION, metavar="IDS")
    failure_timeout: int = option(60, "seconds after which the other processes give up on a dead or unreachable "
                                      "process (heartbeat and start-up timeout)", DEVICES, check=POSITIVE,
                                  resume=THIS_INVOCATION)

    # -- derived numbers ---------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Transitions per update over all devices."""
        return self.num_envs * self.num_steps

    @property
    def total_updates(self) -> int:
        """The update this run ends at: --num-updates, else as many whole updates of batch_size
        as fit in --total-timesteps (counted on from a resume's env steps)."""
        if self.num_updates is not None:
            return self.num_updates
        return self.resumed_update + max(self.total_timesteps - self.resumed_steps, 0) // self.batch_size

    def steps_at(self, update: int, steps_per_update: int) -> int:
        """Env steps (or the algorithm's unit) done after `update` updates of this run."""
        return self.resumed_steps + (update - self.resumed_update) * steps_per_update

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
OPTIONS: dict[str, Option] = {name: f.metadata["option"] for name, f in FIELDS.items()}

# -- each algorithm's own defaults ---------------------------------------------------------------

# An option's declared default is PPO's (the default algorithm's) or the only one. Where another
# algorithm's usual setting differs (an off-policy learner's batch, its target network, its
# networks), that algorithm declares its own default, in its options' module: a run of it with
# the option unset takes that value. Algorithms registered from outside have none here.
ALGO_DEFAULTS: dict[str, dict[str, Any]] = {"dqn": DQN_DEFAULTS, "sac": OFF_POLICY_DEFAULTS,
                                            "td3": OFF_POLICY_DEFAULTS, "ad": AD_DEFAULTS}


def defaults(algo: str) -> dict[str, Any]:
    """Every option's default for a run of `algo`."""
    return {name: f.default for name, f in FIELDS.items()} | ALGO_DEFAULTS.get(algo, {})


def build(given: dict) -> Config:
    """The Config of the options `given` (a preset's and the flags', or a Python caller's): each
    option it does not set takes its algorithm's default."""
    return Config(**{**ALGO_DEFAULTS.get(given.get("algo", FIELDS["algo"].default), {}), **given})


# -- the lists other modules need, from the declarations --------------------------------------

def state_keys(algo: str) -> tuple[str, ...]:
    """The options that shape `algo`'s checkpointed state: a checkpoint only resumes under the
    same values."""
    return tuple(name for name, o in OPTIONS.items() if _shapes_state(o, algo))


def _shapes_state(o: Option, algo: str) -> bool:
    return algo in o.state or o.state == EVERY_ALGO


def resumable(algo: str) -> tuple[str, ...]:
    """The options a resume of an `algo` run may change (each change is logged): how long it
    runs, how its batch is split, how often it logs and saves, and the step size (to go on from
    the last good checkpoint after a divergence); never one that shapes its state."""
    return tuple(name for name, o in OPTIONS.items() if o.resume == RESUME_MAY_CHANGE and not _shapes_state(o, algo))


def per_invocation() -> tuple[str, ...]:
    """The options of one invocation, not of the run: a resume takes them from its own command
    line (or their defaults), never from the saved config."""
    return tuple(name for name, o in OPTIONS.items() if o.resume == THIS_INVOCATION)


def sweepable(algo: str) -> tuple[str, ...]:
    """The options `algo`'s --sweep may vary: those an update reads only as numbers, so that
    each run's value can enter the one compiled program as a traced array (multirun.py). Any
    other option changes the program (shapes, or Python branches such as DQN's --tau 1 hard
    copy) and needs a program of its own."""
    return tuple(name for name, o in OPTIONS.items() if algo in o.sweep)


def flag(name: str) -> str:
    """An option's name as the command line spells it: --num-envs."""
    return "--" + name.replace("_", "-")


# -- values: every one is checked here, once ----------------------------------------------------

def check_value(name: str, value, label: str | None = None) -> None:
    """A value of the right kind can still be wrong: negative, zero where it divides, NaN.
    `label` names it in the error (default: the flag)."""
    label = label or flag(name)
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{label} must be a finite number, got {value}")
    wanted = OPTIONS[name].check
    if wanted is not None and not wanted.holds(value):
        text = "at least 1" if wanted is POSITIVE and isinstance(value, int) else wanted.text
        raise ConfigError(f"{label} must be {text}, got {value}")


def check_applicable(cfg: "Config", given, reads: tuple[str, ...] = ()) -> None:
    """A ConfigError for the first option in `given` (set on the command line or by the preset)
    that this run would ignore; `reads`: the options of other algorithms' that this run's
    algorithm reads too (its spec's, algos.Spec.reads)."""
    for name in given:
        applies = OPTIONS[name].applies
        if applies is not None and name not in reads and not applies.test(cfg):
            this = f"--algo {cfg.algo}" + (f" --policy {cfg.policy}" if cfg.algo != "ad" else "") + \
                   ("" if cfg.mode == "both" else f" --mode {cfg.mode}")
            # an option the preset set, not the user: say so, so that the flag to change is clear
            preset = (f" (set by --config {cfg.config})" if cfg.config and name not in getattr(given, "flags", given)
                      else "")
            raise ConfigError(f"{flag(name)}{preset} is only for {applies.who}; this run is {this} and would "
                              f"ignore it")


def _base_type(name: str) -> type:
    """int for `int | None`, and so on."""
    hint = typing.get_type_hints(Config)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _optional(name: str) -> bool:
    hint = typing.get_type_hints(Config)[name]
    return type(None) in typing.get_args(hint)


def _coerce(name: str, value: Any, source: str) -> Any:
    """`value` as option `name`'s type, checked (choices, range), or a one-line ConfigError that
    names it as `source` spells it: the flag on the command line, `FILE: name` in a preset or
    a run's config.json."""
    kind, choices = _base_type(name), OPTIONS[name].choices
    label = flag(name) if source == "command line" else f"{source}: {name}"
    if value is None:
        if _optional(name):
            return None
        raise ConfigError(f"{label} must be {KIND_NAMES[kind]}, got null")
    if isinstance(value, list):  # nargs="+" (--sweep): kept as one string, as a preset writes it
        value = " ".join(map(str, value))
    try:
        if kind is bool and not isinstance(value, bool):
            raise TypeError
        if kind is str and not isinstance(value, str):
            raise TypeError
        if kind in (int, float) and isinstance(value, bool):
            raise TypeError
        value = kind(float(value)) if kind is int and isinstance(value, (float, str)) and float(value).is_integer() \
            else kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{label} must be {KIND_NAMES[kind]}, got {value!r}") from None
    if choices and value not in choices:
        raise ConfigError(f"{label} {value!r} is not valid; choose from: {', '.join(choices)}")
    check_value(name, value, label)
    return value


def from_dict(values: dict) -> Config:
    """A saved config (config.json, every option written) as a Config."""
    return Config(**{k: v for k, v in values.items() if k in FIELDS})
