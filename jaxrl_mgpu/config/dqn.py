"""The options of DQN (algos/dqn.py) and of the replay it shares with SAC and TD3 (the buffer,
the batch, the updates per step, the n-step targets, the target network's --tau). `Config` takes
these fields from here."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import (DQN, FOR_DQN, FOR_REPLAY, NON_NEGATIVE, POSITIVE, REPLAY_ALGOS, UNIT,
                                       UNIT_OPEN, option)


@dataclasses.dataclass(frozen=True)
class DqnOptions:
    # -- DQN (--algo dqn also uses --num-envs, --num-steps and the learning and network groups) --
    buffer_size: int = option(100_000, "replay capacity in transitions, GLOBAL (per device = buffer-size / "
                                       "devices); a multiple of num-envs", DQN, check=POSITIVE, applies=FOR_REPLAY,
                              state=REPLAY_ALGOS)
    replay_obs_dtype: str = option("float32", "dtype the replay stores observations in: uint8 (a quarter of the "
                                              "memory) where they are whole numbers in 0..255, as MinAtar's 0/1 "
                                              "channel maps are (checked at start-up)", DQN,
                                   choices=("float32", "uint8"), applies=FOR_DQN, state=("dqn",))
    replay_batch_size: int = option(256, "transitions sampled per gradient step, GLOBAL (per device = "
                                         "replay-batch-size / devices)", DQN, check=POSITIVE, applies=FOR_REPLAY)
    updates_per_step: float = option(1.0, "gradient steps per vectorised env step (one step of all num-envs "
                                          "environments): each update steps every env num-steps times, then does "
                                          "num-steps x updates-per-step gradient steps (a whole number)", DQN,
                                     check=POSITIVE, applies=FOR_REPLAY)
    learning_starts: int = option(10_000, "env steps (global) collected before the first gradient step", DQN,
                                  check=NON_NEGATIVE, applies=FOR_REPLAY)
    target_update_every: int = option(500, "copy the online network into the target network every this many "
                                           "gradient steps (used when tau = 1)", DQN, check=POSITIVE,
                                      applies=FOR_REPLAY)
    tau: float = option(1.0, "target update: 1 = hard copy every target-update-every gradient steps; < 1 = "
                             "Polyak averaging target <- tau*online + (1-tau)*target after every gradient step", DQN,
                        check=UNIT_OPEN, applies=FOR_REPLAY)
    eps_start: float = option(1.0, "epsilon-greedy: epsilon at the start", DQN, check=UNIT, applies=FOR_DQN,
                              sweep=("dqn",))
    eps_end: float = option(0.05, "epsilon-greedy: epsilon after eps-decay-steps", DQN, check=UNIT,
                            applies=FOR_DQN, sweep=("dqn",))
    eps_decay_steps: int = option(100_000, "epsilon-greedy: env steps (global) of linear decay from eps-start to "
                                           "eps-end", DQN, check=NON_NEGATIVE, applies=FOR_DQN)
    n_step: int = option(1, "n-step returns (cut at episode ends; time limits bootstrap from the final "
                            "observation)", DQN, check=POSITIVE, applies=FOR_REPLAY)


# DQN's own defaults for the options it shares with PPO (config/options.py ALGO_DEFAULTS) and
# for its replay's: 8 environments stepped 8 times per update, a gradient step per 8 env steps,
# 3-step returns, a target copied every 100 gradient steps (800 env steps), two 128-wide ReLU
# layers, Adam at 1e-3 decayed linearly to 0 (at a constant rate, 2.5e-4 or 1e-3, CartPole's
# return fell back after each peak below 250 and ended under 120). With none of its options given
# it learns CartPole-v1 (docs/algorithms.md: the measurement).
DQN_DEFAULTS = dict(total_timesteps=500_000, num_envs=8, num_steps=8, lr=1e-3, max_grad_norm=10.0, hidden_size=128,
                    activation="relu", n_step=3, target_update_every=100, log_every=50)
