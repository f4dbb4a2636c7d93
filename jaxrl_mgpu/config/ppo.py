"""The options of PPO (algos/ppo.py; multi-agent PPO, algos/mappo.py, reads them too). Some are
shared with SAC and TD3 (the MLP widths, --normalize-obs, --reward-scale). `Config` takes these
fields from here."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import (FOR_MLP_ACTOR_CRITIC, FOR_PPO, FOR_PPO_MLP, FOR_REWARD_SCALE, NON_NEGATIVE,
                                       OFF_POLICY_ALGOS, POSITIVE, PPO, UNIT, option)


@dataclasses.dataclass(frozen=True)
class PpoOptions:
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
                                        "them)", PPO, applies=FOR_MLP_ACTOR_CRITIC, state=("ppo",) + OFF_POLICY_ALGOS)
    reward_scale: float = option(1.0, "multiply rewards by this in the learner (Brax's reward_scaling); episode "
                                      "returns are logged unscaled", PPO, check=POSITIVE, applies=FOR_REWARD_SCALE,
                                 sweep=("ppo",) + OFF_POLICY_ALGOS)
    clip_value: bool = option(True, "clip the value loss around the rollout's values by --clip-eps, as PureJaxRL "
                                    "and CleanRL do (--no-clip-value: Brax's unclipped value loss, for value "
                                    "targets far from unit size, e.g. with --reward-scale)", PPO, applies=FOR_PPO)
    actor_hidden: str | None = option(None, "widths of the actor MLP's hidden layers, comma-separated (e.g. "
                                            "32,32,32,32; default: --num-layers x --hidden-size)", PPO,
                                      applies=FOR_MLP_ACTOR_CRITIC, state=("ppo",) + OFF_POLICY_ALGOS, metavar="WIDTHS")
    critic_hidden: str | None = option(None, "widths of the critic MLP's hidden layers, comma-separated (e.g. "
                                             "256,256,256,256,256; default: --num-layers x --hidden-size)", PPO,
                                       applies=FOR_MLP_ACTOR_CRITIC, state=("ppo",) + OFF_POLICY_ALGOS, metavar="WIDTHS")
    action_dist: str = option("clipped_normal", "with Box actions: clipped_normal (a Gaussian with a learned "
                                                "state-independent std, samples clipped to the bounds for the env) "
                                                "or tanh_normal (Brax's: a Gaussian with a state-dependent std, "
                                                "squashed by tanh into the bounds)", PPO,
                              choices=("clipped_normal", "tanh_normal"), applies=FOR_PPO_MLP, state=("ppo",))
