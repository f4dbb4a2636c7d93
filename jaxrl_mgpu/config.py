"""Every option of a run, in one typed dataclass; YAML presets; the command line.

Precedence: dataclass defaults < `--config` preset (YAML, shipped in jaxrl_mgpu/presets/, or
any path) < flags given on the command line. Numbers on the command line are GLOBAL (over all devices and hosts);
per-device values are derived from them once the devices are known.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from jaxrl_mgpu.cli import ConfigError, Parser

ALGOS = ("ppo", "dqn", "ad")
POLICIES = ("mlp", "transformer")
PRECISIONS = ("fp32", "bf16", "fp16")
SOURCE_ALGOS = ("ucb", "q")  # exploration of AD's tabular Q-learning source (histories.py)
PRESET_DIRS = (Path(__file__).resolve().parent / "presets",)  # package data: installed with the package


def option(default: Any, help: str, **kw) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **kw})


@dataclasses.dataclass(frozen=True)
class Config:
    # what to train
    algo: str = option("ppo", "algorithm", choices=ALGOS)
    env: str = option("CartPole-v1", "environment: any gymnax name (e.g. Breakout-MinAtar) or a project env")
    env_args: str | None = option(None, "arguments of a project env, NAME=VALUE,... (e.g. the Tag games' sizes: "
                                        "num_taggers=4,grid_length=100; see envs/tag.py)")
    policy: str = option("mlp", "policy network: mlp, or transformer over the recent history (a conv "
                                "torso is added for image observations)", choices=POLICIES)
    total_timesteps: int = option(3_000_000, "environment steps to train for, over all devices")
    num_updates: int | None = option(None, "train for this many updates instead (the unit of --algo ad)")
    # PPO
    num_envs: int = option(32, "environments, GLOBAL over all devices (per device = num-envs / devices)")
    num_steps: int = option(128, "steps per environment per update (rollout length)")
    num_minibatches: int = option(4, "minibatches per epoch, GLOBAL (each device takes 1/devices of each)")
    update_epochs: int = option(4, "passes over each rollout")
    lr: float = option(2.5e-4, "Adam learning rate")
    anneal_lr: bool = option(True, "decay the learning rate linearly to 0 over training")
    gamma: float = option(0.99, "discount factor")
    gae_lambda: float = option(0.95, "GAE lambda")
    clip_eps: float = option(0.2, "PPO ratio (and value) clipping")
    ent_coef: float = option(0.01, "entropy bonus coefficient")
    vf_coef: float = option(0.5, "value loss coefficient")
    max_grad_norm: float = option(0.5, "clip gradients to this global norm (after the all-reduce)")
    normalize_reward: bool = option(False, "PPO: divide rewards by the running standard deviation of the "
                                           "discounted return (statistics over all devices, kept in checkpoints), "
                                           "as PureJaxRL's and CleanRL's continuous-action PPO do")
    normalize_obs: bool = option(False, "PPO: normalise observations by their running mean and standard deviation "
                                        "over all devices and processes (Brax's normalize_observations; the "
                                        "statistics are kept with the params, so checkpoints and evaluation use "
                                        "them)")
    reward_scale: float = option(1.0, "PPO: multiply rewards by this in the learner (Brax's reward_scaling); "
                                      "episode returns are logged unscaled")
    clip_value: bool = option(True, "PPO: clip the value loss around the rollout's values by --clip-eps, as "
                                    "PureJaxRL and CleanRL do (--no-clip-value: Brax's unclipped value loss, for "
                                    "value targets far from unit size, e.g. with --reward-scale)")
    actor_hidden: str | None = option(None, "PPO: widths of the actor MLP's hidden layers, comma-separated (e.g. "
                                            "32,32,32,32; default: --num-layers x --hidden-size)")
    critic_hidden: str | None = option(None, "PPO: widths of the critic MLP's hidden layers, comma-separated (e.g. "
                                             "256,256,256,256,256; default: --num-layers x --hidden-size)")
    action_dist: str = option("clipped_normal", "PPO with Box actions: clipped_normal (a Gaussian with a learned "
                                                "state-independent std, samples clipped to the bounds for the env) "
                                                "or tanh_normal (Brax's: a Gaussian with a state-dependent std, "
                                                "squashed by tanh into the bounds)",
                              choices=("clipped_normal", "tanh_normal"))
    # DQN ------------------------------------------------------------------------------
    # (--algo dqn also uses --num-envs, --num-steps, --lr, --anneal-lr, --gamma, --max-grad-norm,
    # --hidden-size, --num-layers, --activation.)
    buffer_size: int = option(100_000, "DQN replay capacity in transitions, GLOBAL (per device = buffer-size / "
                                       "devices); a multiple of num-envs")
    replay_obs_dtype: str = option("float32", "dtype DQN's replay stores observations in: uint8 (a quarter of the "
                                              "memory) where they are whole numbers in 0..255, as MinAtar's 0/1 "
                                              "channel maps are (checked at start-up)", choices=("float32", "uint8"))
    replay_batch_size: int = option(256, "DQN transitions sampled per gradient step, GLOBAL (per device = "
                                         "replay-batch-size / devices)")
    updates_per_step: float = option(1.0, "DQN gradient steps per vectorised env step (one step of all num-envs "
                                          "environments): each update steps every env num-steps times, then does "
                                          "num-steps x updates-per-step gradient steps (a whole number)")
    learning_starts: int = option(10_000, "DQN env steps (global) collected before the first gradient step")
    target_update_every: int = option(500, "DQN: copy the online network into the target network every this many "
                                           "gradient steps (used when tau = 1)")
    tau: float = option(1.0, "DQN target update: 1 = hard copy every target-update-every gradient steps; < 1 = "
                             "Polyak averaging target <- tau*online + (1-tau)*target after every gradient step")
    eps_start: float = option(1.0, "DQN epsilon-greedy: epsilon at the start")
    eps_end: float = option(0.05, "DQN epsilon-greedy: epsilon after eps-decay-steps")
    eps_decay_steps: int = option(100_000, "DQN epsilon-greedy: env steps (global) of linear decay from eps-start "
                                           "to eps-end")
    n_step: int = option(1, "DQN n-step returns (cut at episode ends; time limits bootstrap from the final "
                            "observation)")
    # end DQN --------------------------------------------------------------------------
    # Algorithm Distillation -----------------------------------------------------------
    # (--algo ad trains for --num-updates and also uses --lr, --anneal-lr, --max-grad-norm, --d-model,
    # --n-layers, --n-heads, --precision, --grad-accum; its transformer's context is --n-transit, so
    # --policy and --context-len do not apply.)
    dataset: str | None = option(None, "AD: directory of learning histories to distill (written by "
                                       "python -m jaxrl_mgpu.histories --out DIR)")
    n_transit: int = option(80, "AD: transitions per training window and in the model's context, across "
                                "episode boundaries (e.g. 80 = 4 DarkRoom episodes)")
    ad_batch_size: int = option(128, "AD: windows of n-transit transitions per update, GLOBAL (per device = "
                                     "ad-batch-size / devices)")
    ad_episode_stride: int = option(1, "AD: keep every k-th episode of each learning history, so a context of "
                                       "n episodes spans k x n episodes of the source's learning")
    # (--algo ad with --mode collect|learn: the histories come from the run's store, asynchronous/ad.py)
    ad_history_steps: int = option(4000, "AD --mode collect|learn: environment steps of each source learning "
                                         "history (a multiple of the episode length); the same for collectors "
                                         "and learner")
    ad_history_tasks: int = option(32, "AD --mode collect: tasks (goals) learned at once, one source learner "
                                       "each, per store shard")
    ad_source: str = option("ucb", "AD --mode collect: exploration of the tabular Q-learning source",
                            choices=SOURCE_ALGOS)
    # end Algorithm Distillation -------------------------------------------------------
    # network
    hidden_size: int = option(64, "width of the MLP layers")
    num_layers: int = option(2, "hidden layers of the actor and of the critic MLP")
    activation: str = option("tanh", "MLP activation (swish is silu, Brax's name for it)",
                             choices=("tanh", "relu", "gelu", "silu", "swish"))
    precision: str = option("fp32", "compute dtype of forward and backward passes; params, optimizer state "
                                    "and metrics stay fp32; fp16 uses dynamic loss scaling", choices=PRECISIONS)
    grad_accum: int = option(1, "micro-batches per optimizer step (gradients accumulated over them)")
    # transformer policy
    d_model: int = option(128, "transformer width")
    n_layers: int = option(2, "transformer blocks")
    n_heads: int = option(4, "attention heads")
    context_len: int = option(64, "tokens (steps) each layer attends to, itself included")
    context_across_episodes: bool = option(False, "let the context window cross episode boundaries (meta-RL)")
    attention: str = option("xla", "transformer attention: xla; cudnn (flash attention, GPU); pallas (LayerNorm, "
                                   "QKV projection, RoPE and attention fused, windows of <= 128 tokens, --algo "
                                   "ad, GPU)",
                            choices=("xla", "cudnn", "pallas"))
    mlp: str = option("xla", "transformer MLP half-blocks and output heads: xla; pallas (fused LayerNorm + "
                             "MLP + residual kernels, and final LayerNorm + heads, --d-model a power of 2 up "
                             "to 128, GPU)", choices=("xla", "pallas"))
    # sizing the work to the device (autoscale.py)
    auto_scale: str | None = option(None, "choose the environments per device (AD: sequences per device) before "
                                          "training, from XLA's memory analysis of the compiled training chunk: "
                                          "'throughput' (what a bare --auto-scale means: the smallest size within 5%% "
                                          "of the fastest that fits, timed in a short probe; a larger batch buys no "
                                          "speed and gives fewer updates) or 'memory' (the largest that fits); "
                                          "minibatch count, epochs and lr stay as configured",
                                    choices=("throughput", "memory"), nargs="?", const="throughput")
    auto_scale_memory: float = option(0.9, "--auto-scale: the fraction of the device's memory the training chunk "
                                           "may take (XLA's allocator limit; on a CPU, host RAM / devices)")
    auto_scale_min_updates: int = option(100, "--auto-scale (PPO, DQN): the fewest updates of --total-timesteps the "
                                              "chosen size must leave the run (a bigger batch is fewer updates); "
                                              "where even the smallest size leaves fewer, it is taken and said. AD "
                                              "trains --num-updates at any size")
    auto_scale_seconds: int = option(120, "--auto-scale: the search's time budget in seconds: no size is started "
                                          "that would pass it, and the best size found by then is taken")
    # run
    seed: int = option(0, "random seed (params, environments and sampling all derive from it)")
    # many runs in one compiled program (multirun.py)
    num_seeds: int = option(1, "train this many independent runs in one program, with seeds seed, seed+1, ...: "
                               "own params, optimizer state, environments and keys; each run has --num-envs "
                               "environments")
    sweep: str | None = option(None, "NAME=v1,v2,... [NAME=...]: also cross these values of numeric options that do "
                                     "not change the program's shapes (lr, ent-coef, ...) with the seeds, as per-run "
                                     "values in the one compiled program", nargs="+")
    target_return: float | None = option(None, "--num-seeds / --sweep: the summary gives the fraction of seeds whose "
                                               "final return is above this")
    run_dir: str | None = option(None, "output directory (default runs/<env>-<algo>-<time>)")
    parallel: str = option("pmap", "how the per-device update is mapped over devices",
                           choices=("pmap", "shard_map"))
    devices: int | None = option(None, "use the first k local devices of each host (default: all)")
    log_every: int = option(10, "updates per compiled chunk and per log point")
    profile: str | None = option(None, "write a jax.profiler trace of two log intervals of training under this "
                                       "directory, one per process (TensorBoard's profile plugin or Perfetto open it; "
                                       "experiments/gpu/trace_summary.py sums it)")
    profile_from: int | None = option(None, "the update after which the --profile trace starts (default: the end of "
                                            "the first log interval, so that compiling and warming up are left out)")
    # several hosts (jax.distributed); with none of these flags JAX detects SLURM / Open MPI
    coordinator_address: str | None = option(None, "host:port of process 0, the same on every process")
    num_processes: int | None = option(None, "processes in the job (one per host, or one per GPU group)")
    process_id: int | None = option(None, "this process's index, 0 .. num-processes - 1")
    local_device_ids: str | None = option(None, "comma-separated local device ids this process uses (e.g. 0,1)")
    failure_timeout: int = option(60, "seconds after which the other processes give up on a dead or "
                                      "unreachable process (heartbeat and start-up timeout)")
    # asynchronous collection and learning on one run directory (asynchronous/)
    mode: str = option("both", "both: act and learn in one process; learn: train from the run's trajectory store "
                               "and publish checkpoints; collect: follow the newest checkpoint and add episodes "
                               "to the store. A collector may start before its learner (even before --run-dir "
                               "exists): it waits for the learner's first params, saying so every minute, until "
                               "stopped (or acts at random meanwhile: --collect-before-checkpoint random); it stops "
                               "when the learner is done", choices=("both", "learn", "collect"))
    store_max_episodes: int = option(100_000, "learn: keep at most this many episodes in the store (oldest "
                                              "shards deleted first); --algo ad: also the capacity of the "
                                              "learner's on-device buffer, in whole learning histories")
    samples_per_insert: float | None = option(None, "learn/collect: the target of transitions sampled for "
                                                    "gradient steps (AD: steps of the sampled windows) per "
                                                    "transition inserted (Reverb's SampleToInsertRatio): the "
                                                    "learner waits when it is ahead, collectors pause when it is "
                                                    "behind (default DQN: the ratio of --mode both, "
                                                    "updates-per-step x replay-batch-size / num-envs; AD: 100)")
    samples_per_insert_tolerance: float = option(0.1, "learn/collect: the band around --samples-per-insert "
                                                      "within which neither side waits, as a fraction of the "
                                                      "samples --learning-starts transitions pay for (Acme's "
                                                      "error buffer); at least --max-data-lag iterations' "
                                                      "samples, the data that may be on its way")
    collect_before_checkpoint: str = option("wait", "collect: before the learner first publishes its params "
                                                    "(DQN: policy.msgpack), wait or act uniformly at random",
                                            choices=("wait", "random"))
    collector_id: str | None = option(None, "collect: this collector's name in the store and the learner's "
                                            "metrics (default host-pid)")
    max_data_lag: float = option(8.0, "learn/collect: the most data on its way from the collectors to the "
                                      "learner's memory (written to the store, being read or queued), in "
                                      "learner iterations' worth at --samples-per-insert (at least two shards): "
                                      "collectors pause beyond it, so the learner inserts data acted by params "
                                      "about this many iterations old at most. Lower: fresher data; higher: "
                                      "rides out slower writing and reading")
    shard_steps: int = option(16, "collect: vector steps of all environments per store shard (the unit the "
                                  "learner receives: larger shards, fewer files but staler data)")
    store_workers: int = option(0, "learn/collect: processes that decode (learner) or encode (collector) the "
                                   "store's shards, several at once (0: a quarter of the host's cores, 1 to 4)")
    # checkpoints and evaluation
    checkpoint_every: int = option(100, "save a checkpoint every this many updates (a multiple of --log-every; "
                                        "0 = only at the end)")
    keep_checkpoints: int = option(3, "how many of the latest checkpoints to keep")
    resume: str | None = option(None, "continue the run in --run-dir from its latest complete checkpoint; "
                                      "'--resume auto': resume if there is one, else start fresh",
                                choices=("latest", "auto"), nargs="?", const="latest")
    stop_at_update: int | None = option(None, "stop after this update with a checkpoint, as if preempted "
                                              "(the schedule still follows --total-timesteps); resume later")
    eval_every: int = option(0, "evaluate every this many updates (a multiple of --log-every; 0 = never) "
                                "and keep the best checkpoint for `evaluate --best`")
    eval_episodes: int = option(64, "episodes per evaluation, GLOBAL (spread over all devices)")
    config: str | None = option(None, "YAML preset: a path, or the name of a shipped preset (listed at the end of --help)")
    compile_cache: str | None = option(None, "directory of JAX's persistent compilation cache, where compiled programs "
                                             "are kept for the next run (default: $JAX_COMPILATION_CACHE_DIR, else "
                                             "$XDG_CACHE_HOME/jaxrl_mgpu/jax); 'off': compile everything afresh")
    # Where this run's count starts (set by a resume, not on the command line): a resume with
    # another --num-envs or --total-timesteps goes on from the env steps done, not from
    # update x the new batch.
    resumed_update: int = option(0, "update of the checkpoint this run resumed from", internal=True)
    resumed_steps: int = option(0, "env steps (tokens for --algo ad) done by then", internal=True)

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

# -- what each option may hold and when it applies: every value is checked here, once --------
POSITIVE, NON_NEGATIVE, UNIT, UNIT_OPEN = "> 0", ">= 0", "in [0, 1]", "in (0, 1]"
RANGES = {
    POSITIVE: ("total_timesteps", "num_updates", "num_envs", "num_steps", "num_minibatches", "update_epochs",
               "lr", "clip_eps", "max_grad_norm", "reward_scale", "buffer_size", "replay_batch_size", "updates_per_step",
               "target_update_every", "n_step", "n_transit", "ad_batch_size", "ad_episode_stride",
               "ad_history_steps", "ad_history_tasks", "hidden_size", "num_layers", "grad_accum", "d_model",
               "n_layers", "n_heads", "context_len", "devices", "log_every", "num_seeds", "num_processes",
               "failure_timeout", "store_max_episodes", "samples_per_insert", "max_data_lag", "shard_steps",
               "keep_checkpoints", "auto_scale_min_updates", "auto_scale_seconds",
               "stop_at_update",
               "eval_episodes"),
    NON_NEGATIVE: ("ent_coef", "vf_coef", "learning_starts", "eps_decay_steps", "process_id", "checkpoint_every",
                   "resumed_update", "resumed_steps", "profile_from", "store_workers",
                   "eval_every"),
    UNIT: ("gamma", "gae_lambda", "eps_start", "eps_end", "samples_per_insert_tolerance"),
    UNIT_OPEN: ("tau", "auto_scale_memory"),
}
RANGE = {name: kind for kind, names in RANGES.items() for name in names}


def _in_range(kind: str, value) -> bool:
    return {POSITIVE: value > 0, NON_NEGATIVE: value >= 0, UNIT: 0 <= value <= 1, UNIT_OPEN: 0 < value <= 1}[kind]


def flag(name: str) -> str:
    """An option's name as the command line spells it: --num-envs."""
    return "--" + name.replace("_", "-")


def check_value(name: str, value, label: str | None = None) -> None:
    """A value of the right kind can still be wrong: negative, zero where it divides, NaN.
    `label` names it in the error (default: the flag)."""
    label = label or flag(name)
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{label} must be a finite number, got {value}")
    if name in RANGE and not _in_range(RANGE[name], value):
        wanted = "at least 1" if RANGE[name] == POSITIVE and isinstance(value, int) else RANGE[name]
        raise ConfigError(f"{label} must be {wanted}, got {value}")


# Options that only some runs use: (who, test). Giving one to a run that ignores it is an error,
# not a silent no-op. Options missing here apply to every run.
_TRANSFORMER = ("a transformer (--policy transformer, or --algo ad)", lambda c: c.algo == "ad" or c.policy == "transformer")
_ASYNC = ("--mode learn or collect", lambda c: c.mode != "both")
APPLIES = {
    **dict.fromkeys(("num_minibatches", "update_epochs", "gae_lambda", "clip_eps", "ent_coef", "vf_coef",
                     "normalize_reward"),
                    ("--algo ppo", lambda c: c.algo == "ppo")),
    **dict.fromkeys(("reward_scale", "clip_value"), ("--algo ppo", lambda c: c.algo == "ppo")),
    **dict.fromkeys(("normalize_obs", "actor_hidden", "critic_hidden", "action_dist"),
                    ("--algo ppo --policy mlp", lambda c: c.algo == "ppo" and c.policy == "mlp")),
    **dict.fromkeys(("buffer_size", "replay_obs_dtype", "replay_batch_size", "updates_per_step", "learning_starts",
                     "target_update_every", "tau", "eps_start", "eps_end", "eps_decay_steps", "n_step"),
                    ("--algo dqn", lambda c: c.algo == "dqn")),
    **dict.fromkeys(("total_timesteps", "num_envs", "num_steps", "gamma", "policy"),
                    ("--algo ppo or dqn", lambda c: c.algo != "ad")),
    **dict.fromkeys(("num_updates", "n_transit", "ad_batch_size", "ad_episode_stride"),
                    ("--algo ad", lambda c: c.algo == "ad")),
    **dict.fromkeys(("auto_scale_memory", "auto_scale_seconds"), ("--auto-scale", lambda c: c.auto_scale is not None)),
    # AD's run is --num-updates long whatever its batch: the minimum does not bite there
    "auto_scale_min_updates": ("--auto-scale with --algo ppo or dqn (AD trains --num-updates at any size)",
                               lambda c: c.auto_scale is not None and c.algo != "ad"),
    "dataset": ("--algo ad with --mode both", lambda c: c.algo == "ad" and c.mode == "both"),
    **dict.fromkeys(("ad_history_steps", "ad_history_tasks", "ad_source"),
                    ("--algo ad with --mode learn or collect", lambda c: c.algo == "ad" and c.mode != "both")),
    **dict.fromkeys(("hidden_size", "num_layers", "activation"),
                    ("an MLP (--policy mlp, --algo ppo or dqn)", lambda c: c.algo != "ad" and c.policy == "mlp")),
    **dict.fromkeys(("d_model", "n_layers", "n_heads", "attention", "mlp"), _TRANSFORMER),
    **dict.fromkeys(("context_len", "context_across_episodes"),
                    ("--policy transformer", lambda c: c.algo != "ad" and c.policy == "transformer")),
    # Learners and collectors of one run may share one command line, so these are for both.
    **dict.fromkeys(("store_max_episodes", "collect_before_checkpoint", "collector_id",
                     "samples_per_insert", "samples_per_insert_tolerance", "max_data_lag"), _ASYNC),
    # AD's collectors write whole learning histories (--ad-history-tasks x --ad-history-steps) one
    # shard at a time, and its learner reads those few large shards on a thread
    **dict.fromkeys(("shard_steps", "store_workers"),
                    ("--algo dqn with --mode learn or collect", lambda c: c.algo == "dqn" and c.mode != "both")),
    "target_return": ("many runs (--num-seeds > 1 or --sweep)", lambda c: c.num_seeds > 1 or bool(c.sweep)),
    "profile": ("training (--mode both or learn)", lambda c: c.mode != "collect"),
    "profile_from": ("--profile", lambda c: c.profile is not None),
}


def check_applicable(cfg: "Config", given) -> None:
    """A ConfigError for the first option in `given` (set on the command line or by the preset)
    that this run would ignore."""
    for name in given:
        if name in APPLIES and not APPLIES[name][1](cfg):
            who = APPLIES[name][0]
            this = f"--algo {cfg.algo}" + (f" --policy {cfg.policy}" if cfg.algo != "ad" else "") + \
                   ("" if cfg.mode == "both" else f" --mode {cfg.mode}")
            raise ConfigError(f"--{name.replace('_', '-')} is only for {who}; this run is {this} and would "
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
    kind, meta = _base_type(name), FIELDS[name].metadata
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
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{label} {value!r} is not valid; choose from: {', '.join(meta['choices'])}")
    check_value(name, value, label)
    return value


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m jaxrl_mgpu.train", description="Train an RL agent data-parallel on all local devices.",
                epilog=f"presets (--config NAME): {', '.join(preset_names())}")
    defaults = Config()
    for f in dataclasses.fields(Config):
        if f.metadata.get("internal"):
            continue
        flag, kind = "--" + f.name.replace("_", "-"), _base_type(f.name)
        default = getattr(defaults, f.name)
        choices = f.metadata.get("choices")
        help_ = f.metadata["help"] + (f"; one of {', '.join(map(str, choices))}" if choices else "") + \
            (f" (default: {default})" if default is not None else "")
        if kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif "nargs" in f.metadata:
            p.add_argument(flag, type=str, default=None, nargs=f.metadata["nargs"], const=f.metadata.get("const"),
                           metavar=f.name.upper(), help=help_)
        else:
            p.add_argument(flag, type=str, default=None, metavar=f.name.upper(), help=help_)
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
    unknown = sorted(set(data) - {n for n, f in FIELDS.items() if not f.metadata.get("internal")} - {"config"})
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
    given = Given({k: _coerce(k, v, "command line") for k, v in args.items() if v is not None})
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
    return check_distributed(Config(**parse_given(argv)))


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


def from_dict(values: dict) -> Config:
    return Config(**{k: v for k, v in values.items() if k in FIELDS})


def read_saved(run_dir: str | Path) -> dict:
    """A run directory's config.json, or a ConfigError saying what is wrong with it."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"--run-dir {run_dir} is not a run directory (no config.json)")
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(saved, dict) or saved.get("algo") not in ALGOS:
        raise ConfigError(f"{path} is not a jaxrl_mgpu run config")
    # Every field as the command line would take it (a hand-edited file must not reach the run).
    unknown = sorted(set(saved) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{path}: unknown option(s) {', '.join(unknown)} (written by another version of "
                          f"jaxrl_mgpu?)")
    return {name: _coerce(name, value, str(path)) for name, value in saved.items()}


# Options a resumed run may change (each change is logged): how long it runs, how its batch is
# split, how often it logs and saves, and the step size (to go on from the last good checkpoint
# after a divergence). Everything else is the run's own, from its config.json; an algorithm's
# STATE_KEYS (options that shape its saved state) never change.
RESUMABLE = ("total_timesteps", "num_updates", "num_envs", "lr", "max_grad_norm", "log_every", "checkpoint_every",
             "keep_checkpoints", "eval_every", "eval_episodes", "parallel", "target_return", "max_data_lag")
# Options of one invocation, not of the run: a resume takes them from its own command line (or
# their defaults), never from the saved config.
PER_INVOCATION = ("stop_at_update", "devices", "coordinator_address", "num_processes", "process_id",
                  "local_device_ids", "failure_timeout", "resume", "run_dir", "config", "compile_cache", "profile",
                  "profile_from", "store_workers")


def resumed(saved: dict, given: dict, state_keys=()) -> tuple[Config, list[str]]:
    """The config of a resumed run: its saved config.json, with the options this command sets
    that a resume may change (RESUMABLE, minus the algorithm's `state_keys`) and this
    invocation's own (PER_INVOCATION). Returns it and the changes, as 'name old -> new'
    strings; any other option set to a different value is a ConfigError."""
    saved_cfg = from_dict(saved)
    defaults = Config()
    swept = dict(parse_sweep(saved_cfg)) if saved_cfg.sweep else {}
    changes, refused = [], []
    for name, value in given.items():
        old = getattr(saved_cfg, name)
        if name in swept:  # each run keeps its own value; the option itself is not what they use
            values = ",".join(f"{v:g}" for v in swept[name])
            raise ConfigError(f"--resume: {flag(name)} is swept in this run ({name}={values}); a resume cannot change "
                              f"a swept option")
        if name in PER_INVOCATION or value == old:
            continue
        if name in RESUMABLE and name not in state_keys:
            changes.append(f"{flag(name)} {old} -> {value}")
        else:
            has = "does not set it" if old is None else f"has {old!r}"
            refused.append(f"{flag(name)} {value!r} (the run {has})")
    if refused:
        allowed = ", ".join("--" + n.replace("_", "-") for n in RESUMABLE if n not in state_keys)
        raise ConfigError(f"--resume keeps the run's own settings (its config.json); this command changes "
                          f"{'; '.join(refused)}. A resume may change {allowed}, and the per-invocation options "
                          f"(--stop-at-update, --devices, the multi-host flags)")
    this_invocation = {name: given.get(name, getattr(defaults, name)) for name in PER_INVOCATION}
    return dataclasses.replace(saved_cfg, **{k: v for k, v in given.items() if k in RESUMABLE},
                               **this_invocation), changes


# --sweep: the options an update reads only as numbers, so that each run's value can enter the
# one compiled program as a traced array (multirun.py). Any other option changes the program
# (shapes, or Python branches such as DQN's --tau 1 hard copy) and needs a program of its own.
SWEEPABLE = {"ppo": ("lr", "ent_coef", "vf_coef", "clip_eps", "gamma", "gae_lambda", "max_grad_norm",
                     "reward_scale"),
             "dqn": ("lr", "gamma", "max_grad_norm", "eps_start", "eps_end")}


def parse_sweep(cfg: Config) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """--sweep as ((name, values), ...) in the order given, or a ConfigError naming the bad part."""
    allowed = SWEEPABLE.get(cfg.algo, ())
    out: dict[str, tuple[float, ...]] = {}
    for item in (cfg.sweep or "").split():
        name, eq, text = item.partition("=")
        name = name.lstrip("-").replace("-", "_")
        flag = "--" + name.replace("_", "-")
        if not eq or not text:
            raise ConfigError(f"--sweep {item!r}: write NAME=v1,v2,... (e.g. lr=1e-3,3e-4)")
        if name not in FIELDS or FIELDS[name].metadata.get("internal") or name in ("sweep", "config"):
            raise ConfigError(f"--sweep {name}: no such option; --algo {cfg.algo} sweeps {', '.join(allowed)}")
        if name not in allowed:
            raise ConfigError(f"--sweep {name}: {flag} changes the compiled program (its shapes or code) or is not "
                              f"used by --algo {cfg.algo}; sweepable: {', '.join(allowed)}; run other values of "
                              f"{flag} as separate programs")
        if name in out:
            raise ConfigError(f"--sweep {name} is given twice")
        try:
            values = tuple(float(v) for v in text.split(","))
        except ValueError:
            raise ConfigError(f"--sweep {name}={text}: the values must be numbers separated by commas") from None
        for v in values:
            try:
                check_value(name, v)
            except ConfigError as e:
                raise ConfigError(f"--sweep {name}={text}: {e}") from None
        if len(set(values)) < len(values):
            raise ConfigError(f"--sweep {name}={text}: a value is repeated")
        out[name] = values
    return tuple(out.items())


def check_multirun(cfg: Config) -> None:
    """What --num-seeds / --sweep train (multirun.py): --mode both PPO (MLP) and DQN runs."""
    if cfg.num_seeds == 1 and not cfg.sweep:
        return
    what = "--num-seeds / --sweep"
    if cfg.algo == "ad":
        raise ConfigError(f"{what}: --algo ad distils one dataset into one model and is not multi-run; run it once "
                          f"per seed")
    if cfg.mode != "both":
        raise ConfigError(f"{what} train in --mode both; --mode {cfg.mode} processes share one run")
    if cfg.auto_scale:
        raise ConfigError(f"{what}: --auto-scale sizes one run; give --num-envs (per run)")
    if cfg.policy == "transformer":
        raise ConfigError(f"{what}: --policy transformer is not supported for many runs yet (untested); use "
                          f"--policy mlp")
    if cfg.eval_every:
        raise ConfigError(f"{what}: --eval-every is not supported for many runs yet; evaluate the runs after "
                          f"training with python -m jaxrl_mgpu.evaluate")
    parse_sweep(cfg)


def validate(cfg: Config) -> Config:
    """Checks that do not need the devices (the per-device split is the algorithm's `check`)."""
    from jaxrl_mgpu import envs  # local import: envs pulls in jax

    envs.check(cfg.env)
    env, _ = envs.make(cfg.env, cfg.env_args)  # builds nothing on a device; checks --env-args
    if envs.is_multi_agent(env) and (cfg.algo, cfg.policy, cfg.mode, cfg.normalize_reward) != ("ppo", "mlp", "both", False):
        raise ConfigError(f"--env {cfg.env} is a multi-agent game: it trains with --algo ppo --policy mlp "
                          f"(one network per team) in --mode both, without --normalize-reward")
    for name in FIELDS:
        check_value(name, getattr(cfg, name))
    for name in GRID:
        if getattr(cfg, name) % cfg.log_every:
            raise ConfigError(f"{flag(name)} {getattr(cfg, name)} must be 0 or a multiple of --log-every "
                              f"{cfg.log_every} (checkpoints and evaluations happen between compiled chunks, at log "
                              f"points)")
    if cfg.auto_scale and cfg.mode != "both":
        raise ConfigError(f"--auto-scale sizes a --mode both run; --mode {cfg.mode} processes share one run's "
                          f"sizes: give --num-envs")
    if cfg.resume and not cfg.run_dir:
        raise ConfigError("--resume needs --run-dir: the directory of the run to continue")
    if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
        raise ConfigError(f"--d-model {cfg.d_model} / --n-heads {cfg.n_heads} must be an even whole number "
                          f"(the head size)")
    check_kernels(cfg)
    check_multirun(cfg)
    if cfg.total_updates < 1:
        raise ConfigError(f"--total-timesteps {cfg.total_timesteps} is less than one update of "
                          f"{cfg.batch_size} steps (--num-envs x --num-steps)")
    return cfg


GRID = ("checkpoint_every", "eval_every")  # options that act between chunks, on multiples of --log-every


def follow_log_grid(cfg: Config, flags: set[str] | frozenset[str]) -> tuple[Config, list[str]]:
    """Checkpoints and evaluations happen at log points, so their intervals are multiples of
    --log-every. One the user did not give on this command line (its default, a preset's or
    the resumed run's) follows the grid: the first multiple at or after it, with a line that
    says so; one the user gave that is off the grid is a ConfigError."""
    notes, changes = [], {}
    for name in GRID:
        value = getattr(cfg, name)
        if not value or value % cfg.log_every == 0:
            continue
        if name in flags:
            raise ConfigError(f"{flag(name)} {value} must be 0 or a multiple of --log-every {cfg.log_every} "
                              f"(checkpoints and evaluations happen between compiled chunks, at log points)")
        changes[name] = -(-value // cfg.log_every) * cfg.log_every
        notes.append(f"{flag(name)} {changes[name]}: its value {value} is not a multiple of --log-every "
                     f"{cfg.log_every}, so it follows the log points")
    return dataclasses.replace(cfg, **changes), notes


def check_kernels(cfg: Config) -> None:
    """--attention / --mlp: what the fused kernels take (they run in bf16/fp16 only)."""
    import jax  # local import: a process must start jax.distributed before jax's backend

    from jaxrl_mgpu.nets import fused_attention, fused_mlp  # local import: pulls in jax

    if cfg.attention == "cudnn" and jax.default_backend() != "gpu":  # before the precision: it would not help
        raise ConfigError(f"--attention cudnn is cuDNN's flash attention, for NVIDIA GPUs; this run's devices are "
                          f"{jax.default_backend()}: use --attention xla")
    if (cfg.attention, cfg.mlp) != ("xla", "xla") and cfg.precision == "fp32":
        raise ConfigError(f"--attention {cfg.attention} / --mlp {cfg.mlp}: the fused kernels compute in "
                          f"bf16 or fp16; add --precision bf16")
    if cfg.mlp == "pallas" and not fused_mlp.supported(cfg.d_model, 4 * cfg.d_model):
        raise ConfigError(f"--mlp pallas needs --d-model a power of 2 from 16 to {fused_mlp.MAX_D_MODEL}, "
                          f"got {cfg.d_model}")
    if cfg.attention == "pallas":
        if cfg.algo != "ad":
            raise ConfigError("--attention pallas fuses the cache-free learner of --algo ad; PPO and DQN "
                              "learners attend over a key/value prefix: use --attention xla or cudnn")
        if not fused_attention.supported(cfg.n_transit, cfg.d_model // cfg.n_heads, cfg.d_model):
            raise ConfigError(f"--attention pallas takes windows of at most {fused_attention.MAX_LEN} tokens, "
                              f"--d-model a power of 2 from 16 to {fused_attention.MAX_D_MODEL} and a head size "
                              f"(--d-model / --n-heads) that is a multiple of 32 up to 128; got {cfg.n_transit} "
                              f"tokens, d_model {cfg.d_model} and head size {cfg.d_model // cfg.n_heads}")


def check_platform(cfg: Config, platform: str) -> None:
    """What the devices must be for --attention (checked once they are known: asking jax for them
    any earlier would initialise it before jax.distributed). The Pallas kernels run anywhere
    (the Pallas interpreter off GPUs: correct, slow); cuDNN's flash attention needs NVIDIA GPUs."""
    if cfg.attention == "cudnn" and platform != "gpu":
        raise ConfigError(f"--attention cudnn is cuDNN's flash attention, for NVIDIA GPUs; this run's devices "
                          f"are {platform}: use --attention xla")


# Options that shape the training state: a checkpoint only resumes under the same values.
STATE_KEYS = ("algo", "env", "env_args", "policy", "hidden_size", "num_layers", "activation", "num_seeds", "sweep")


def incompatible(saved: dict, cfg: Config, keys=STATE_KEYS) -> list[str]:
    """The state-shaping options whose values differ between a saved run and `cfg`. An option
    the saved config predates had its default then."""
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    return [f"{k.replace('_', '-')} ({saved.get(k, defaults.get(k))!r} vs {getattr(cfg, k)!r})"
            for k in keys if saved.get(k, defaults.get(k)) != getattr(cfg, k)]


def dump(cfg: Config) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
