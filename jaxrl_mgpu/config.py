"""Every option of a run, in one typed dataclass; YAML presets; the command line.

Precedence: dataclass defaults < `--config` preset (YAML, shipped in jaxrl_mgpu/presets/, or
any path) < flags given on the command line. Numbers on the command line are GLOBAL (over all devices and hosts);
per-device values are derived from them once the devices are known.

Each option is declared once, in `Config`, with everything the rest of the package asks about
it: its group (what it configures: `--help GROUP` shows one), its range (checked here and
nowhere else), which runs use it (a run that would ignore it refuses it), what a resume may do
with it, which algorithms' checkpointed state it shapes, and which algorithms' `--sweep` may
vary it. The lists the other modules need are computed from those declarations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Callable, NamedTuple

import yaml

from jaxrl_mgpu.cli import ConfigError, Parser

ALGOS = ("ppo", "dqn", "ad")
POLICIES = ("mlp", "transformer")
PRECISIONS = ("fp32", "bf16", "fp16")
SOURCE_ALGOS = ("ucb", "q")  # exploration of AD's tabular Q-learning source (histories.py)
PRESET_DIRS = (Path(__file__).resolve().parent / "presets",)  # package data: installed with the package

# -- how an option is declared -----------------------------------------------------------------

# The groups, in the order `--help` lists them, with the line it says about each.
RUN, ENV, LEARNING, NETWORK, PPO, DQN, AD, MULTIRUN, ASYNC, DEVICES = (
    "run", "env", "learning", "network", "ppo", "dqn", "ad", "multirun", "async", "devices")
GROUPS = {
    RUN: "what to train, for how long; the run directory, logs, checkpoints, evaluation, resume",
    ENV: "the environment, and how many of it step at once",
    LEARNING: "the optimizer, the discount, the compute precision (PPO, DQN and AD)",
    NETWORK: "the policy network: the MLP, the transformer and its fused kernels",
    PPO: "PPO: its loss, minibatches and epochs, normalisation, actor and critic widths",
    DQN: "DQN: the replay, the target network, epsilon-greedy exploration, n-step returns",
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
    state: tuple[str, ...] = ()   # the algorithms whose checkpointed state it shapes (a resume never changes it)
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
FOR_ENV_STEPS = Applies("--algo ppo or dqn", lambda c: c.algo != "ad")
FOR_MLP = Applies("an MLP (--policy mlp, --algo ppo or dqn)", lambda c: c.algo != "ad" and c.policy == "mlp")
FOR_TRANSFORMER = Applies("a transformer (--policy transformer, or --algo ad)",
                          lambda c: c.algo == "ad" or c.policy == "transformer")
FOR_TRANSFORMER_POLICY = Applies("--policy transformer", lambda c: c.algo != "ad" and c.policy == "transformer")
FOR_AD_DATASET = Applies("--algo ad with --mode both", lambda c: c.algo == "ad" and c.mode == "both")
FOR_AD_STORE = Applies("--algo ad with --mode learn or collect", lambda c: c.algo == "ad" and c.mode != "both")
# Learners and collectors of one run may share one command line, so these are for both.
FOR_STORE = Applies("--mode learn or collect", lambda c: c.mode != "both")
# AD's collectors write whole learning histories (--ad-history-tasks x --ad-history-steps) one
# shard at a time, and its learner reads those few large shards on a thread.
FOR_DQN_STORE = Applies("--algo dqn with --mode learn or collect", lambda c: c.algo == "dqn" and c.mode != "both")
FOR_MANY_RUNS = Applies("many runs (--num-seeds > 1 or --sweep)", lambda c: c.num_seeds > 1 or bool(c.sweep))
FOR_TRAINING = Applies("training (--mode both or learn)", lambda c: c.mode != "collect")
FOR_PROFILE = Applies("--profile", lambda c: c.profile is not None)
FOR_AUTO_SCALE = Applies("--auto-scale", lambda c: c.auto_scale is not None)
# AD's run is --num-updates long whatever its batch: the minimum does not bite there.
FOR_AUTO_SCALE_STEPS = Applies("--auto-scale with --algo ppo or dqn (AD trains --num-updates at any size)",
                               lambda c: c.auto_scale is not None and c.algo != "ad")

PPO_DQN = ("ppo", "dqn")  # the algorithms that step environments themselves


@dataclasses.dataclass(frozen=True)
class Config:
    # -- run: what to train, for how long, where it is written ------------------------------
    algo: str = option("ppo", "algorithm", RUN, common=True, choices=ALGOS, state=ALGOS)
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
                      brief="a gymnax name, SUITE:TASK or a project env", state=ALGOS, metavar="NAME")
    env_args: str | None = option(None, "arguments of a project env, NAME=VALUE,... (e.g. the Tag games' sizes: "
                                        "num_taggers=4,grid_length=100; see envs/tag.py)", ENV, common=True,
                                  brief="a project env's arguments, NAME=VALUE,... (the Tag games' sizes)",
                                  state=ALGOS, metavar="ARGS")
    # DQN's replay is a ring per environment, written num_steps rows per update: both shape its state.
    num_envs: int = option(32, "environments, GLOBAL over all devices (per device = num-envs / devices)", ENV,
                           common=True, brief="environments, GLOBAL over all devices", check=POSITIVE,
                           applies=FOR_ENV_STEPS, resume=RESUME_MAY_CHANGE, state=("dqn",))
    num_steps: int = option(128, "steps per environment per update (rollout length)", ENV, common=True,
                            check=POSITIVE, applies=FOR_ENV_STEPS, state=("dqn",))

    # -- learning -----------------------------------------------------------------------------
    lr: float = option(2.5e-4, "Adam learning rate", LEARNING, common=True, check=POSITIVE,
                       resume=RESUME_MAY_CHANGE, sweep=PPO_DQN)
    # (PPO's and AD's optimizer state holds a schedule count only when annealing)
    anneal_lr: bool = option(True, "decay the learning rate linearly to 0 over training", LEARNING,
                             state=("ppo", "ad"))
    gamma: float = option(0.99, "discount factor", LEARNING, common=True, check=UNIT, applies=FOR_ENV_STEPS,
                          sweep=PPO_DQN)
    max_grad_norm: float = option(0.5, "clip gradients to this global norm (after the all-reduce)", LEARNING,
                                  common=True, check=POSITIVE, resume=RESUME_MAY_CHANGE, sweep=PPO_DQN)
    precision: str = option("fp32", "compute dtype of forward and backward passes; params, optimizer state "
                                    "and metrics stay fp32; fp16 uses dynamic loss scaling", LEARNING,
                            choices=PRECISIONS)
    grad_accum: int = option(1, "micro-batches per optimizer step (gradients accumulated over them)", LEARNING,
                             check=POSITIVE)

    # -- network ------------------------------------------------------------------------------
    policy: str = option("mlp", "policy network: mlp, or transformer over the recent history (a conv "
                                "torso is added for image observations)", NETWORK, common=True,
                         brief="policy network", choices=POLICIES,
                         applies=FOR_ENV_STEPS, state=ALGOS)
    hidden_size: int = option(64, "width of the MLP layers", NETWORK, common=True, check=POSITIVE, applies=FOR_MLP,
                              state=ALGOS)
    num_layers: int = option(2, "hidden layers of the actor and of the critic MLP", NETWORK, check=POSITIVE,
                             applies=FOR_MLP, state=ALGOS)
    activation: str = option("tanh", "MLP activation (swish is silu, Brax's name for it)", NETWORK,
                             choices=("tanh", "relu", "gelu", "silu", "swish"), applies=FOR_MLP, state=ALGOS)
    d_model: int = option(128, "transformer width", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=ALGOS)
    n_layers: int = option(2, "transformer blocks", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=ALGOS)
    n_heads: int = option(4, "attention heads", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=ALGOS)
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

    # -- PPO (--algo ppo also uses --num-envs, --num-steps and the learning and network groups) --
    num_minibatches: int = option(4, "minibatches per epoch, GLOBAL (each device takes 1/devices of each)", PPO,
                                  common=True, brief="minibatches per epoch, GLOBAL", check=POSITIVE,
                                  applies=FOR_PPO)
    update_epochs: int = option(4, "passes over each rollout", PPO, common=True, check=POSITIVE, applies=FOR_PPO)
    gae_lambda: float = option(0.95, "GAE lambda", PPO, common=True, check=UNIT, applies=FOR_PPO, sweep=("ppo",))
    unroll_length: int = option(0, "compute GAE over unrolls of this many steps, in every minibatch with the "
                                   "critic as it is then, minibatches of whole unrolls (Brax's PPO); 0: once "
                                   "per update, over each environment's --num-steps steps", PPO,
                                check=NON_NEGATIVE, applies=FOR_PPO_MLP, metavar="STEPS")
    clip_eps: float = option(0.2, "PPO ratio (and value) clipping", PPO, common=True, check=POSITIVE,
                             applies=FOR_PPO, sweep=("ppo",))
    ent_coef: float = option(0.01, "entropy bonus coefficient", PPO, common=True, check=NON_NEGATIVE,
                             applies=FOR_PPO, sweep=("ppo",))
    vf_coef: float = option(0.5, "value loss coefficient", PPO, common=True, check=NON_NEGATIVE, applies=FOR_PPO,
                            sweep=("ppo",))
    normalize_reward: bool = option(False, "divide rewards by the running standard deviation of the discounted "
                                           "return (statistics over all devices, kept in checkpoints), as "
                                           "PureJaxRL's and CleanRL's continuous-action PPO do", PPO,
                                    applies=FOR_PPO, state=("ppo",))
    normalize_obs: bool = option(False, "normalise observations by their running mean and standard deviation "
                                        "over all devices and processes (Brax's normalize_observations; the "
                                        "statistics are kept with the params, so checkpoints and evaluation use "
                                        "them)", PPO, applies=FOR_PPO_MLP, state=("ppo",))
    reward_scale: float = option(1.0, "multiply rewards by this in the learner (Brax's reward_scaling); episode "
                                      "returns are logged unscaled", PPO, check=POSITIVE, applies=FOR_PPO,
                                 sweep=("ppo",))
    clip_value: bool = option(True, "clip the value loss around the rollout's values by --clip-eps, as PureJaxRL "
                                    "and CleanRL do (--no-clip-value: Brax's unclipped value loss, for value "
                                    "targets far from unit size, e.g. with --reward-scale)", PPO, applies=FOR_PPO)
    actor_hidden: str | None = option(None, "widths of the actor MLP's hidden layers, comma-separated (e.g. "
                                            "32,32,32,32; default: --num-layers x --hidden-size)", PPO,
                                      applies=FOR_PPO_MLP, state=("ppo",), metavar="WIDTHS")
    critic_hidden: str | None = option(None, "widths of the critic MLP's hidden layers, comma-separated (e.g. "
                                             "256,256,256,256,256; default: --num-layers x --hidden-size)", PPO,
                                       applies=FOR_PPO_MLP, state=("ppo",), metavar="WIDTHS")
    action_dist: str = option("clipped_normal", "with Box actions: clipped_normal (a Gaussian with a learned "
                                                "state-independent std, samples clipped to the bounds for the env) "
                                                "or tanh_normal (Brax's: a Gaussian with a state-dependent std, "
                                                "squashed by tanh into the bounds)", PPO,
                              choices=("clipped_normal", "tanh_normal"), applies=FOR_PPO_MLP, state=("ppo",))

    # -- DQN (--algo dqn also uses --num-envs, --num-steps and the learning and network groups) --
    buffer_size: int = option(100_000, "replay capacity in transitions, GLOBAL (per device = buffer-size / "
                                       "devices); a multiple of num-envs", DQN, check=POSITIVE, applies=FOR_DQN,
                              state=("dqn",))
    replay_obs_dtype: str = option("float32", "dtype the replay stores observations in: uint8 (a quarter of the "
                                              "memory) where they are whole numbers in 0..255, as MinAtar's 0/1 "
                                              "channel maps are (checked at start-up)", DQN,
                                   choices=("float32", "uint8"), applies=FOR_DQN, state=("dqn",))
    replay_batch_size: int = option(256, "transitions sampled per gradient step, GLOBAL (per device = "
                                         "replay-batch-size / devices)", DQN, check=POSITIVE, applies=FOR_DQN)
    updates_per_step: float = option(1.0, "gradient steps per vectorised env step (one step of all num-envs "
                                          "environments): each update steps every env num-steps times, then does "
                                          "num-steps x updates-per-step gradient steps (a whole number)", DQN,
                                     check=POSITIVE, applies=FOR_DQN)
    learning_starts: int = option(10_000, "env steps (global) collected before the first gradient step", DQN,
                                  check=NON_NEGATIVE, applies=FOR_DQN)
    target_update_every: int = option(500, "copy the online network into the target network every this many "
                                           "gradient steps (used when tau = 1)", DQN, check=POSITIVE,
                                      applies=FOR_DQN)
    tau: float = option(1.0, "target update: 1 = hard copy every target-update-every gradient steps; < 1 = "
                             "Polyak averaging target <- tau*online + (1-tau)*target after every gradient step", DQN,
                        check=UNIT_OPEN, applies=FOR_DQN)
    eps_start: float = option(1.0, "epsilon-greedy: epsilon at the start", DQN, check=UNIT, applies=FOR_DQN,
                              sweep=("dqn",))
    eps_end: float = option(0.05, "epsilon-greedy: epsilon after eps-decay-steps", DQN, check=UNIT,
                            applies=FOR_DQN, sweep=("dqn",))
    eps_decay_steps: int = option(100_000, "epsilon-greedy: env steps (global) of linear decay from eps-start to "
                                           "eps-end", DQN, check=NON_NEGATIVE, applies=FOR_DQN)
    n_step: int = option(1, "n-step returns (cut at episode ends; time limits bootstrap from the final "
                            "observation)", DQN, check=POSITIVE, applies=FOR_DQN)

    # -- AD (--algo ad trains for --num-updates and also uses --lr, --anneal-lr, --max-grad-norm,
    # --precision, --grad-accum and the transformer's options; its context is --n-transit, so
    # --policy and --context-len do not apply) -------------------------------------------------
    dataset: str | None = option(None, "directory of learning histories to distill (written by python -m "
                                       "jaxrl_mgpu.histories --out DIR)", AD, applies=FOR_AD_DATASET, metavar="DIR")
    n_transit: int = option(80, "transitions per training window and in the model's context, across episode "
                                "boundaries (e.g. 80 = 4 DarkRoom episodes)", AD, check=POSITIVE, applies=FOR_AD,
                            state=("ad",))
    ad_batch_size: int = option(128, "windows of n-transit transitions per update, GLOBAL (per device = "
                                     "ad-batch-size / devices)", AD, check=POSITIVE, applies=FOR_AD)
    ad_episode_stride: int = option(1, "keep every k-th episode of each learning history, so a context of n "
                                       "episodes spans k x n episodes of the source's learning", AD, check=POSITIVE,
                                    applies=FOR_AD)
    # (--mode collect|learn: the histories come from the run's store, asynchronous/ad.py)
    ad_history_steps: int = option(4000, "--mode collect|learn: environment steps of each source learning history "
                                         "(a multiple of the episode length); the same for collectors and learner",
                                   AD, check=POSITIVE, applies=FOR_AD_STORE)
    ad_history_tasks: int = option(32, "--mode collect: tasks (goals) learned at once, one source learner each, "
                                       "per store shard", AD, check=POSITIVE, applies=FOR_AD_STORE)
    ad_source: str = option("ucb", "--mode collect: exploration of the tabular Q-learning source", AD,
                            choices=SOURCE_ALGOS, applies=FOR_AD_STORE)

    # -- multirun: many runs in one compiled program (multirun.py) -----------------------------
    num_seeds: int = option(1, "train this many independent runs in one program, with seeds seed, seed+1, ...: "
                               "own params, optimizer state, environments and keys; each run has --num-envs "
                               "environments", MULTIRUN, common=True,
                            brief="independent runs in one program, seeds seed, seed+1, ...", check=POSITIVE,
                            state=ALGOS)
    sweep: str | None = option(None, "NAME=v1,v2,... [NAME=...]: also cross these values of numeric options that "
                                     "do not change the program's shapes (lr, ent-coef, ...) with the seeds, as "
                                     "per-run values in the one compiled program", MULTIRUN, common=True,
                               brief="also cross these values of numeric options (lr, ...) with the seeds",
                               nargs="+", metavar="NAME=V,...", state=ALGOS)
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
                              check=POSITIVE, applies=FOR_DQN_STORE)
    store_workers: int = option(0, "processes that decode (learner) or encode (collector) the store's shards, "
                                   "several at once (0: a quarter of the host's cores, 1 to 4)", ASYNC,
                                check=NON_NEGATIVE, applies=FOR_DQN_STORE, resume=THIS_INVOCATION)

    # -- devices and hosts ----------------------------------------------------------------------
    devices: int | None = option(None, "use the first k local devices of each host (default: all)", DEVICES,
                                 common=True, check=POSITIVE, resume=THIS_INVOCATION)
    parallel: str = option("pmap", "how the per-device update is mapped over devices", DEVICES, common=True,
                           brief="mapping over devices",
                           choices=("pmap", "shard_map"), resume=RESUME_MAY_CHANGE)
    # sizing the work to the device (autoscale.py)
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


# -- the lists other modules need, from the declarations --------------------------------------

def state_keys(algo: str) -> tuple[str, ...]:
    """The options that shape `algo`'s checkpointed state: a checkpoint only resumes under the
    same values."""
    return tuple(name for name, o in OPTIONS.items() if algo in o.state)


def resumable(algo: str) -> tuple[str, ...]:
    """The options a resume of an `algo` run may change (each change is logged): how long it
    runs, how its batch is split, how often it logs and saves, and the step size (to go on from
    the last good checkpoint after a divergence); never one that shapes its state."""
    return tuple(name for name, o in OPTIONS.items() if o.resume == RESUME_MAY_CHANGE and algo not in o.state)


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


def check_applicable(cfg: "Config", given) -> None:
    """A ConfigError for the first option in `given` (set on the command line or by the preset)
    that this run would ignore."""
    for name in given:
        applies = OPTIONS[name].applies
        if applies is not None and not applies.test(cfg):
            this = f"--algo {cfg.algo}" + (f" --policy {cfg.policy}" if cfg.algo != "ad" else "") + \
                   ("" if cfg.mode == "both" else f" --mode {cfg.mode}")
            raise ConfigError(f"{flag(name)} is only for {applies.who}; this run is {this} and would ignore it")


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
    text += f" (default: {default})" if default is not None else ""
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


def resumed(saved: dict, given: dict) -> tuple[Config, list[str]]:
    """The config of a resumed run: its saved config.json, with the options this command sets
    that a resume may change (`resumable` for the run's algorithm) and this invocation's own
    (`per_invocation`). Returns it and the changes, as 'name old -> new' strings; any other
    option set to a different value is a ConfigError."""
    saved_cfg = from_dict(saved)
    defaults = Config()
    may_change, invocation = resumable(saved_cfg.algo), per_invocation()
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
    this_invocation = {name: given.get(name, getattr(defaults, name)) for name in invocation}
    return dataclasses.replace(saved_cfg, **{k: v for k, v in given.items() if k in may_change},
                               **this_invocation), changes


def parse_sweep(cfg: Config) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """--sweep as ((name, values), ...) in the order given, or a ConfigError naming the bad part."""
    allowed = sweepable(cfg.algo)
    out: dict[str, tuple[float, ...]] = {}
    for item in (cfg.sweep or "").split():
        name, eq, text = item.partition("=")
        name = name.lstrip("-").replace("-", "_")
        flag = "--" + name.replace("_", "-")
        if not eq or not text:
            raise ConfigError(f"--sweep {item!r}: write NAME=v1,v2,... (e.g. lr=1e-3,3e-4)")
        if name not in OPTIONS or OPTIONS[name].internal or name in ("sweep", "config"):
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
    if cfg.mode != "both" and cfg.algo not in ("dqn", "ad"):
        raise ConfigError(f"--mode {cfg.mode} needs an off-policy learner: use --algo dqn, or --algo ad on a "
                          f"Dark Room (not {cfg.algo})")
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


def incompatible(saved: dict, cfg: Config, keys: tuple[str, ...] | None = None) -> list[str]:
    """The options among `keys` (default: those that shape the state of `cfg`'s algorithm)
    whose values differ between a saved run and `cfg`. An option the saved config predates had
    its default then."""
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    return [f"{k.replace('_', '-')} ({saved.get(k, defaults.get(k))!r} vs {getattr(cfg, k)!r})"
            for k in (state_keys(cfg.algo) if keys is None else keys)
            if saved.get(k, defaults.get(k)) != getattr(cfg, k)]


def dump(cfg: Config) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)
