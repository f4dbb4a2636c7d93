"""Groups of options several algorithms declare, each in one place: the replay's (DQN, SAC and
TD3: algos/replay.py), the actor-critic MLPs' (PPO, SAC and TD3), reward scaling, and the action
distribution of nets/actor_critic.make (PPO's; an outside algorithm on that actor-critic reads it
too). An algorithm's options
(algos/<name>/options.py) inherit the groups it reads. Light: no JAX, so the command line reads
them without loading an algorithm."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import NON_NEGATIVE, POSITIVE, UNIT_OPEN, Applies, option

WITH_MLP = Applies("{algos} with --policy mlp", lambda c: c.policy == "mlp")
FOR_MLP = Applies("{algos} --policy mlp", lambda c: c.policy == "mlp")


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    """The replay learners' (DQN, SAC, TD3): the buffer, the batch, the updates per step, the
    n-step targets, the target network's --tau."""
    GROUPS = {"dqn": "DQN (the replay's and the targets' options also SAC's and TD3's): the replay, the target "
                     "network, epsilon-greedy exploration, n-step returns"}
    buffer_size: int = option(100_000, "replay capacity in transitions, GLOBAL (per device = buffer-size / "
                                       "devices); a multiple of num-envs", "dqn", check=POSITIVE, state=True)
    replay_batch_size: int = option(256, "transitions sampled per gradient step, GLOBAL (per device = "
                                         "replay-batch-size / devices)", "dqn", check=POSITIVE)
    updates_per_step: float = option(1.0, "gradient steps per vectorised env step (one step of all num-envs "
                                          "environments): each update steps every env num-steps times, then does "
                                          "num-steps x updates-per-step gradient steps (a whole number)", "dqn",
                                     check=POSITIVE)
    learning_starts: int = option(10_000, "env steps (global) collected before the first gradient step", "dqn",
                                  check=NON_NEGATIVE)
    target_update_every: int = option(500, "copy the online network into the target network every this many "
                                           "gradient steps (used when tau = 1)", "dqn", check=POSITIVE)
    tau: float = option(1.0, "target update: 1 = hard copy every target-update-every gradient steps; < 1 = "
                             "Polyak averaging target <- tau*online + (1-tau)*target after every gradient step", "dqn",
                        check=UNIT_OPEN)
    n_step: int = option(1, "n-step returns (cut at episode ends; time limits bootstrap from the final "
                            "observation)", "dqn", check=POSITIVE)


@dataclasses.dataclass(frozen=True)
class ActorCriticNets:
    """What the MLP actor-critics read (nets/factory.py, nets/actor_critic.py): the actor's and the
    critic's widths, observation normalisation (PPO, SAC, TD3)."""
    GROUPS = {"ppo": "PPO: its loss, minibatches and epochs, normalisation, actor and critic widths"}
    normalize_obs: bool = option(False, "normalise observations by their running mean and standard deviation "
                                        "over all devices and processes (Brax's normalize_observations; the "
                                        "statistics are kept with the params, so checkpoints and evaluation use "
                                        "them)", "ppo", applies=WITH_MLP, state=True)
    actor_hidden: str | None = option(None, "widths of the actor MLP's hidden layers, comma-separated (e.g. "
                                            "32,32,32,32; default: --num-layers x --hidden-size)", "ppo",
                                      applies=WITH_MLP, state=True, metavar="WIDTHS")
    critic_hidden: str | None = option(None, "widths of the critic MLP's hidden layers, comma-separated (e.g. "
                                             "256,256,256,256,256; default: --num-layers x --hidden-size)", "ppo",
                                       applies=WITH_MLP, state=True, metavar="WIDTHS")


@dataclasses.dataclass(frozen=True)
class RewardScale:
    """Rewards scaled in the learner (PPO, SAC, TD3)."""
    reward_scale: float = option(1.0, "multiply rewards by this in the learner (Brax's reward_scaling); episode "
                                      "returns are logged unscaled", "ppo", check=POSITIVE, sweep=True)


@dataclasses.dataclass(frozen=True)
class ActionDistribution:
    """The action distribution of an actor-critic made by nets/actor_critic.make (PPO's)."""
    action_dist: str = option("clipped_normal", "with Box actions: clipped_normal (a Gaussian with a learned "
                                                "state-independent std, samples clipped to the bounds for the env) "
                                                "or tanh_normal (Brax's: a Gaussian with a state-dependent std, "
                                                "squashed by tanh into the bounds)", "ppo",
                              choices=("clipped_normal", "tanh_normal"), applies=FOR_MLP, state=True)
