"""The options of SAC and TD3 (algos/sac.py), beside those they share with DQN (the replay,
the n-step targets, the target network's --tau: config/options.py, group dqn) and with PPO
(the MLP widths, --normalize-obs, --reward-scale). `Config` takes these fields from here."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import (FOR_CATEGORICAL, FOR_OFF_POLICY, FOR_SAC, FOR_TD3, NON_NEGATIVE,
                                       OFF_POLICY, OFF_POLICY_ALGOS, POSITIVE, UNIT_OPEN, option)


@dataclasses.dataclass(frozen=True)
class OffPolicyOptions:
    critic: str = option("plain", "the critics' output: plain (one Q-value, mean squared error) or categorical (a "
                                  "distribution over --num-atoms values in [--v-min, --v-max], cross-entropy "
                                  "to the projected n-step target: FastTD3's)", OFF_POLICY,
                         choices=("plain", "categorical"), applies=FOR_OFF_POLICY, state=OFF_POLICY_ALGOS)
    num_atoms: int = option(101, "categorical critic: values of its distribution", OFF_POLICY, check=POSITIVE,
                            applies=FOR_CATEGORICAL, state=OFF_POLICY_ALGOS)
    v_min: float = option(-250.0, "categorical critic: the smallest value of the support (of the discounted "
                                  "return, after --reward-scale)", OFF_POLICY, applies=FOR_CATEGORICAL)
    v_max: float = option(250.0, "categorical critic: the largest value of the support", OFF_POLICY,
                          applies=FOR_CATEGORICAL)
    clipped_double_q: bool = option(True, "bootstrap from the smaller of the two target critics' values (TD3's "
                                          "clipped double Q); --no-clipped-double-q: from their mean", OFF_POLICY,
                                    applies=FOR_OFF_POLICY)
    critic_layer_norm: bool = option(True, "layer normalisation after each hidden layer of the critics", OFF_POLICY,
                                     applies=FOR_OFF_POLICY, state=OFF_POLICY_ALGOS)
    policy_delay: int = option(2, "gradient steps of the critics per step of the actor (and, TD3, of its target; "
                                  "SAC: of the temperature)", OFF_POLICY, check=POSITIVE, applies=FOR_OFF_POLICY)
    init_alpha: float = option(1.0, "SAC: the entropy temperature at the start (then learned towards an entropy "
                                    "of -(action dimensions))", OFF_POLICY, check=POSITIVE, applies=FOR_SAC)
    noise_std_min: float = option(0.001, "TD3: exploration noise std of environment 0, in actions scaled to "
                                         "[-1, 1]; environment i's std is spread from --noise-std-min to "
                                         "--noise-std-max by its global index (FastTD3's per-environment noise)",
                                  OFF_POLICY, check=NON_NEGATIVE, applies=FOR_TD3)
    noise_std_max: float = option(0.4, "TD3: exploration noise std of the last environment", OFF_POLICY,
                                  check=NON_NEGATIVE, applies=FOR_TD3)
    target_noise: float = option(0.2, "TD3: std of the noise on the target policy's action (target smoothing)",
                                 OFF_POLICY, check=NON_NEGATIVE, applies=FOR_TD3)
    noise_clip: float = option(0.5, "TD3: the target noise is clipped to +-this", OFF_POLICY, check=UNIT_OPEN,
                               applies=FOR_TD3)


# SAC's and TD3's own defaults for the options they share with DQN and PPO (config/options.py
# ALGO_DEFAULTS): the usual settings of CleanRL's and Stable-Baselines3's SAC and TD3 (a 1M
# replay, batches of 256, Polyak targets with tau 0.005, Adam at 3e-4 without decay, two 256-wide
# ReLU layers), on 8 environments with a gradient step per 2 env steps. With none of its options
# given, each learns Pendulum-v1 (docs/algorithms.md: the measurement).
OFF_POLICY_DEFAULTS = dict(total_timesteps=1_000_000, num_envs=8, num_steps=8, updates_per_step=4.0,
                           replay_batch_size=256, buffer_size=1_000_000, learning_starts=5_000, tau=0.005, lr=3e-4,
                           anneal_lr=False, max_grad_norm=100.0, hidden_size=256, activation="relu", log_every=50)
