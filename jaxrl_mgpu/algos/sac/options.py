"""SAC's and TD3's options (algos/sac/), beside the replay's they share with DQN and the
actor-critic MLPs' they share with PPO (algos/option_groups.py), and their own defaults. SAC and
TD3 are two algorithms over shared parts: each has its options' dataclass. Light: no JAX."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.algos.option_groups import ActorCriticNets, ReplayOptions, RewardScale
from jaxrl_mgpu.config.declare import (ENV_STEPPING, NON_NEGATIVE, POLICY_NETWORKS, POSITIVE, STORE_SEGMENTS, UNIT_OPEN,
                                       AlgoOptions, Applies, option)

GROUP = "sac-td3"
WITH_CATEGORICAL = Applies("{algos} with --critic categorical", lambda c: c.critic == "categorical")


@dataclasses.dataclass(frozen=True)
class OffPolicyOptions(ReplayOptions, ActorCriticNets, RewardScale):
    """What SAC and TD3 share: the critics, the policy delay."""
    GROUPS = {GROUP: "SAC and TD3, continuous control off-policy: the critics, exploration, the temperature, the "
                     "policy delay (the replay's options are in the dqn group)"}
    critic: str = option("plain", "the critics' output: plain (one Q-value, mean squared error) or categorical (a "
                                  "distribution over --num-atoms values in [--v-min, --v-max], cross-entropy "
                                  "to the projected n-step target: FastTD3's)", GROUP,
                         choices=("plain", "categorical"), state=True)
    num_atoms: int = option(101, "categorical critic: values of its distribution", GROUP, check=POSITIVE,
                            applies=WITH_CATEGORICAL, state=True)
    v_min: float = option(-250.0, "categorical critic: the smallest value of the support (of the discounted "
                                  "return, after --reward-scale)", GROUP, applies=WITH_CATEGORICAL, sweep=True)
    v_max: float = option(250.0, "categorical critic: the largest value of the support", GROUP,
                          applies=WITH_CATEGORICAL, sweep=True)
    clipped_double_q: bool = option(True, "bootstrap from the smaller of the two target critics' values (TD3's "
                                          "clipped double Q); --no-clipped-double-q: from their mean", GROUP)
    critic_layer_norm: bool = option(True, "layer normalisation after each hidden layer of the critics", GROUP,
                                     state=True)
    policy_delay: int = option(2, "gradient steps of the critics per step of the actor (and, TD3, of its target; "
                                  "SAC: of the temperature)", GROUP, check=POSITIVE)


@dataclasses.dataclass(frozen=True)
class SacOptions(OffPolicyOptions):
    init_alpha: float = option(1.0, "SAC: the entropy temperature at the start (then learned towards an entropy "
                                    "of -(action dimensions))", GROUP, check=POSITIVE)


@dataclasses.dataclass(frozen=True)
class Td3Options(OffPolicyOptions):
    noise_std_min: float = option(0.001, "TD3: exploration noise std of environment 0, in actions scaled to "
                                         "[-1, 1]; environment i's std is spread from --noise-std-min to "
                                         "--noise-std-max by its global index (FastTD3's per-environment noise)",
                                  GROUP, check=NON_NEGATIVE, sweep=True)
    noise_std_max: float = option(0.4, "TD3: exploration noise std of the last environment", GROUP,
                                  check=NON_NEGATIVE, sweep=True)
    target_noise: float = option(0.2, "TD3: std of the noise on the target policy's action (target smoothing)",
                                 GROUP, check=NON_NEGATIVE, sweep=True)
    noise_clip: float = option(0.5, "TD3: the target noise is clipped to +-this", GROUP, check=UNIT_OPEN)


# SAC's and TD3's own defaults for the options they share with DQN and PPO (AlgoOptions.defaults):
# the usual settings of CleanRL's and Stable-Baselines3's SAC and TD3 (a 1M replay, batches of 256,
# Polyak targets with tau 0.005, Adam at 3e-4 without decay, two 256-wide ReLU layers), on 8
# environments with a gradient step per 2 env steps. With none of its options
# given, each learns Pendulum-v1 (docs/algorithms.md: the measurement).
OFF_POLICY_DEFAULTS = dict(total_timesteps=1_000_000, num_envs=8, num_steps=8, updates_per_step=4.0,
                           replay_batch_size=256, buffer_size=1_000_000, learning_starts=5_000, tau=0.005, lr=3e-4,
                           anneal_lr=False, max_grad_norm=100.0, hidden_size=256, activation="relu", log_every=50)

_SHARED = dict(defaults=OFF_POLICY_DEFAULTS, uses=ENV_STEPPING + POLICY_NETWORKS + STORE_SEGMENTS, state=("anneal_lr",),
               sweep=("lr", "gamma", "max_grad_norm"))
SAC = AlgoOptions(fields=SacOptions, **_SHARED)
TD3 = AlgoOptions(fields=Td3Options, **_SHARED)
