"""The common options of a run, declared once in the typed `Config`; a run's config is `Config`
with its algorithm's own options (algos/<name>/options.py) in one dataclass (catalogue.py's
`config_class`)."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import (ALGORITHM_DEPENDENT, ASYNC, DEVICES, ENV, LEARNING, MULTIRUN, NETWORK,
                                       NON_NEGATIVE, POLICIES, POSITIVE, PRECISIONS, RESUME_MAY_CHANGE, RUN,
                                       THIS_INVOCATION, TRACK, UNIT, UNIT_OPEN, AlgoOptions, Applies, option)


def uses(cfg, name: str) -> bool:
    """Whether the algorithm of `cfg` reads the common option `name`."""
    return name not in ALGORITHM_DEPENDENT or name in algo_options(cfg).uses


def algo_options(cfg) -> AlgoOptions:
    """The AlgoOptions of a config's algorithm (an empty one for the bare common Config)."""
    return getattr(type(cfg), "ALGO_OPTIONS", AlgoOptions())


# Who uses the common options that only some runs use ("{algos}": the algorithms that read it).
USED = Applies("{algos}")
FOR_MLP = Applies("an MLP (--policy mlp, {algos})", lambda c: c.policy == "mlp")
# an algorithm without --policy (AD) is a transformer
FOR_TRANSFORMER = Applies("a transformer (--policy transformer, or {algos})",
                          lambda c: c.policy == "transformer" or not uses(c, "policy"),
                          listed=lambda o: "policy" not in o.uses)
FOR_TRANSFORMER_POLICY = Applies("--policy transformer", lambda c: c.policy == "transformer")
FOR_STORE = Applies("--mode learn or collect", lambda c: c.mode != "both")
FOR_STORE_SEGMENTS = Applies("{algos} with --mode learn or collect", lambda c: c.mode != "both")
FOR_MANY_RUNS = Applies("many runs (--num-seeds > 1 or --sweep)", lambda c: c.num_seeds > 1 or bool(c.sweep))
FOR_TRAINING = Applies("training (--mode both or learn)", lambda c: c.mode != "collect")
FOR_PROFILE = Applies("--profile", lambda c: c.profile is not None)
FOR_TRACK = Applies("--track", lambda c: c.track is not None)
FOR_AUTO_SCALE = Applies("--auto-scale", lambda c: c.auto_scale is not None)
FOR_AUTO_SCALE_STEPS = Applies("--auto-scale with {algos}", lambda c: c.auto_scale is not None)


@dataclasses.dataclass(frozen=True)
class Config:
    # -- run: what to train, for how long, where it is written ------------------------------
    algo: str = option("ppo", "algorithm: {algorithms}, or MODULE:NAME, one that MODULE registers with "
                              "jaxrl_mgpu.algos.register (an installed package's: by its entry point)",
                       RUN, common=True, brief="algorithm: {algorithms}", state=True, metavar="NAME")
    total_timesteps: int = option(3_000_000, "environment steps to train for, over all devices", RUN, common=True,
                                  check=POSITIVE, applies=USED, resume=RESUME_MAY_CHANGE)
    num_updates: int | None = option(None, "train for this many updates instead (the unit of --algo ad)", RUN,
                                     check=POSITIVE, applies=USED, resume=RESUME_MAY_CHANGE)
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
                      brief="a gymnax name, SUITE:TASK or a project env", state=True, metavar="NAME")
    env_args: str | None = option(None, "arguments of a project env, NAME=VALUE,... (e.g. the Tag games' sizes: "
                                        "num_taggers=4,grid_length=100; see envs/tag.py)", ENV, common=True,
                                  brief="a project env's arguments, NAME=VALUE,... (the Tag games' sizes)",
                                  state=True, metavar="ARGS")
    # DQN's replay is a ring per environment, written num_steps rows per update: both shape its state.
    num_envs: int = option(32, "environments, GLOBAL over all devices (per device = num-envs / devices)", ENV,
                           common=True, brief="environments, GLOBAL over all devices", check=POSITIVE,
                           applies=USED, resume=RESUME_MAY_CHANGE)
    num_steps: int = option(128, "steps per environment per update (rollout length)", ENV, common=True,
                            check=POSITIVE, applies=USED)

    # -- learning -----------------------------------------------------------------------------
    lr: float = option(2.5e-4, "Adam learning rate", LEARNING, common=True, check=POSITIVE,
                       resume=RESUME_MAY_CHANGE)
    # (PPO's and AD's optimizer state holds a schedule count only when annealing)
    anneal_lr: bool = option(True, "decay the learning rate linearly to 0 over training", LEARNING)
    gamma: float = option(0.99, "discount factor", LEARNING, common=True, check=UNIT, applies=USED)
    max_grad_norm: float = option(0.5, "clip gradients to this global norm (after the all-reduce)", LEARNING,
                                  common=True, check=POSITIVE, resume=RESUME_MAY_CHANGE)
    # (AdamW's state is Adam's: a resume may change it)
    weight_decay: float = option(0.0, "decoupled weight decay (AdamW) of every parameter the optimizer steps, "
                                      "e.g. FastTD3's 0.1; 0: Adam", LEARNING, check=NON_NEGATIVE,
                                 resume=RESUME_MAY_CHANGE)
    precision: str = option("fp32", "compute dtype of forward and backward passes; params, optimizer state "
                                    "and metrics stay fp32; fp16 uses dynamic loss scaling", LEARNING,
                            choices=PRECISIONS)
    grad_accum: int = option(1, "micro-batches per optimizer step (gradients accumulated over them)", LEARNING,
                             check=POSITIVE)

    # -- network ------------------------------------------------------------------------------
    policy: str = option("mlp", "policy network: mlp, or transformer over the recent history (a conv "
                                "torso is added for image observations)", NETWORK, common=True,
                         brief="policy network", choices=POLICIES,
                         applies=USED, state=True)
    hidden_size: int = option(64, "width of the MLP layers", NETWORK, common=True, check=POSITIVE, applies=FOR_MLP,
                              state=True)
    num_layers: int = option(2, "hidden layers of the actor and of the critic MLP", NETWORK, check=POSITIVE,
                             applies=FOR_MLP, state=True)
    activation: str = option("tanh", "MLP activation (swish is silu, Brax's name for it)", NETWORK,
                             choices=("tanh", "relu", "gelu", "silu", "swish"), applies=FOR_MLP, state=True)
    d_model: int = option(128, "transformer width", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=True)
    n_layers: int = option(2, "transformer blocks", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=True)
    n_heads: int = option(4, "attention heads", NETWORK, check=POSITIVE, applies=FOR_TRANSFORMER, state=True)
    context_len: int = option(64, "tokens (steps) each layer attends to, itself included", NETWORK, check=POSITIVE,
                              applies=FOR_TRANSFORMER_POLICY)
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
                            state=True)
    sweep: str | None = option(None, "NAME=v1,v2,... [NAME=...]: also cross these values of numeric options that "
                                     "do not change the program's shapes (lr, ent-coef, ...) with the seeds, as "
                                     "per-run values in the one compiled program", MULTIRUN, common=True,
                               brief="also cross these values of numeric options (lr, ...) with the seeds",
                               nargs="+", metavar="NAME=V,...", state=True)
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
                              check=POSITIVE, applies=FOR_STORE_SEGMENTS)
    store_workers: int = option(0, "processes that decode (learner) or encode (collector) the store's shards, "
                                   "several at once (0: a quarter of the host's cores, 1 to 4)", ASYNC,
                                check=NON_NEGATIVE, applies=FOR_STORE_SEGMENTS, resume=THIS_INVOCATION)

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

    # -- experiment trackers (tracking.py) ---------------------------------------------------------
    track: str | None = option(None, "also send the run to these experiment trackers, a comma list of wandb and "
                                     "mlflow (extras of the same names); a resume continues the same tracked runs",
                               TRACK, common=True, brief="experiment trackers: wandb, mlflow (a comma list)",
                               applies=FOR_TRAINING, resume=RESUME_MAY_CHANGE, metavar="NAMES")
    track_project: str | None = option(None, "W&B project (default $WANDB_PROJECT, else jaxrl_mgpu)", TRACK,
                                       applies=FOR_TRACK, resume=RESUME_MAY_CHANGE, metavar="NAME")
    track_entity: str | None = option(None, "W&B entity, a user or team (default $WANDB_ENTITY, else your default)",
                                      TRACK, applies=FOR_TRACK, resume=RESUME_MAY_CHANGE, metavar="NAME")
    track_experiment: str | None = option(None, "MLflow experiment (default $MLFLOW_EXPERIMENT_NAME, else "
                                                "jaxrl_mgpu)", TRACK, applies=FOR_TRACK, resume=RESUME_MAY_CHANGE,
                                          metavar="NAME")
    track_uri: str | None = option(None, "MLflow tracking server or store (default $MLFLOW_TRACKING_URI, else "
                                         "MLflow's own default)", TRACK, applies=FOR_TRACK, resume=RESUME_MAY_CHANGE,
                                   metavar="URI")
    track_tags: str | None = option(None, "tags of the tracked runs, a comma list", TRACK, applies=FOR_TRACK,
                                    resume=RESUME_MAY_CHANGE, metavar="TAGS")
    track_group: str | None = option(None, "the group the tracked runs are in (default the run directory's name; "
                                           "many runs are one group)", TRACK, applies=FOR_TRACK,
                                     resume=RESUME_MAY_CHANGE, metavar="NAME")
    track_on_failure: str = option("error", "a tracker that cannot be reached at the start: error (one line, "
                                            "nothing written) or warn (train without it); one that fails later "
                                            "always only warns", TRACK, choices=("error", "warn"),
                                   applies=FOR_TRACK, resume=RESUME_MAY_CHANGE)

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


COMMON_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
