"""DQN's options (algos/dqn/), beside the replay's it shares with SAC and TD3
(algos/option_groups.py), and its own defaults. Light: no JAX."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.algos.option_groups import ReplayOptions
from jaxrl_mgpu.config.declare import (ENV_STEPPING, NON_NEGATIVE, POLICY_NETWORKS, STORE_SEGMENTS, UNIT, AlgoOptions,
                                       option)

GROUP = "dqn"


@dataclasses.dataclass(frozen=True)
class DqnOptions(ReplayOptions):
    replay_obs_dtype: str = option("float32", "dtype the replay stores observations in: uint8 (a quarter of the "
                                              "memory) where they are whole numbers in 0..255, as MinAtar's 0/1 "
                                              "channel maps are (checked at start-up)", GROUP,
                                   choices=("float32", "uint8"), state=True)
    eps_start: float = option(1.0, "epsilon-greedy: epsilon at the start", GROUP, check=UNIT, sweep=True)
    eps_end: float = option(0.05, "epsilon-greedy: epsilon after eps-decay-steps", GROUP, check=UNIT, sweep=True)
    eps_decay_steps: int = option(100_000, "epsilon-greedy: env steps (global) of linear decay from eps-start to "
                                           "eps-end", GROUP, check=NON_NEGATIVE)


# DQN's own defaults for the options it shares with PPO (AlgoOptions.defaults) and
# for its replay's: 8 environments stepped 8 times per update, a gradient step per 8 env steps,
# 3-step returns, a target copied every 100 gradient steps (800 env steps), two 128-wide ReLU
# layers, Adam at 1e-3 decayed linearly to 0 (at a constant rate, 2.5e-4 or 1e-3, CartPole's
# return fell back after each peak below 250 and ended under 120). With none of its options given
# it learns CartPole-v1 (docs/algorithms.md: the measurement).
DQN_DEFAULTS = dict(total_timesteps=500_000, num_envs=8, num_steps=8, lr=1e-3, max_grad_norm=10.0, hidden_size=128,
                    activation="relu", n_step=3, target_update_every=100, log_every=50)

OPTIONS = AlgoOptions(fields=DqnOptions, defaults=DQN_DEFAULTS, uses=ENV_STEPPING + POLICY_NETWORKS + STORE_SEGMENTS,
                      state=("num_envs", "num_steps", "context_len"), sweep=("lr", "gamma", "max_grad_norm"))
