"""PPO's options (algos/ppo/ppo.py; multi-agent PPO, algos/mappo/, reads them too), beside the
actor-critic MLPs' it shares with SAC and TD3 (algos/option_groups.py). Light: no JAX."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.algos.option_groups import FOR_MLP, ActionDistribution, ActorCriticNets, RewardScale
from jaxrl_mgpu.config.declare import ENV_STEPPING, NON_NEGATIVE, POLICY_NETWORKS, POSITIVE, UNIT, AlgoOptions, option

GROUP = "ppo"


@dataclasses.dataclass(frozen=True)
class PpoOptions(ActorCriticNets, RewardScale, ActionDistribution):
    num_minibatches: int = option(4, "minibatches per epoch, GLOBAL (each device takes 1/devices of each)", GROUP,
                                  common=True, brief="minibatches per epoch, GLOBAL", check=POSITIVE)
    update_epochs: int = option(4, "passes over each rollout", GROUP, common=True, check=POSITIVE)
    gae_lambda: float = option(0.95, "GAE lambda", GROUP, common=True, check=UNIT, sweep=True)
    unroll_length: int = option(0, "compute GAE over unrolls of this many steps, in every minibatch with the "
                                   "critic as it is then, minibatches of whole unrolls (Brax's PPO); 0: once "
                                   "per update, over each environment's --num-steps steps", GROUP,
                                check=NON_NEGATIVE, applies=FOR_MLP, metavar="STEPS")
    clip_eps: float = option(0.2, "PPO ratio (and value) clipping", GROUP, common=True, check=POSITIVE, sweep=True)
    ent_coef: float = option(0.01, "entropy bonus coefficient", GROUP, common=True, check=NON_NEGATIVE, sweep=True)
    vf_coef: float = option(0.5, "value loss coefficient", GROUP, common=True, check=NON_NEGATIVE, sweep=True)
    normalize_reward: bool = option(False, "divide rewards by the running standard deviation of the discounted "
                                           "return (statistics over all devices, kept in checkpoints), as "
                                           "PureJaxRL's and CleanRL's continuous-action PPO do", GROUP, state=True)
    clip_value: bool = option(True, "clip the value loss around the rollout's values by --clip-eps, as PureJaxRL "
                                    "and CleanRL do (--no-clip-value: Brax's unclipped value loss, for value "
                                    "targets far from unit size, e.g. with --reward-scale)", GROUP)


OPTIONS = AlgoOptions(fields=PpoOptions, uses=ENV_STEPPING + POLICY_NETWORKS, state=("anneal_lr", "context_len"),
                      sweep=("lr", "gamma", "max_grad_norm"))
