"""Algorithms: each a module of per-device functions (ppo.py, dqn.py, ad.py, mappo.py) and the
frozen `Spec` that says everything the host reads of it (spec.py), registered here by name as
`--algo NAME`. Adding one is a module and a `register` call; `spec_for(cfg)` is the spec a run
trains with (PPO on a multi-agent game is multi-agent PPO). The options that shape an
algorithm's checkpointed state are declared with the options (config.state_keys)."""

import dataclasses

from jaxrl_mgpu import envs
from jaxrl_mgpu.algos import ad, dqn, mappo, ppo
from jaxrl_mgpu.algos.spec import Spec, for_run, get, names, register

register("ppo", dataclasses.replace(ppo.SPEC, multi_agent=mappo.SPEC))
register("dqn", dqn.SPEC)
register("ad", ad.SPEC)


def spec_for(cfg) -> Spec:
    """The spec that trains `cfg`: `--algo`'s, for `--env`'s kind of game."""
    return for_run(cfg.algo, envs.make(cfg.env, cfg.env_args)[0])


__all__ = ["Spec", "get", "names", "register", "spec_for"]
