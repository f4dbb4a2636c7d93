"""Algorithms. Each module has `check(cfg, num_devices) -> base.Split` (the batch over the
devices, checked once, or a one-line ConfigError), `algorithm(cfg, env, env_params, split, par)
-> base.Algorithm` (what the runner runs), `make(cfg, env, env_params, split)` (its per-device
functions),
STEP_UNIT and `steps_per_update(cfg)` (how progress is counted). The options that shape an
algorithm's checkpointed state are declared with the options (config.state_keys)."""

from jaxrl_mgpu import envs
from jaxrl_mgpu.algos import ad, dqn, mappo, ppo

ALGOS = {"ppo": ppo, "dqn": dqn, "ad": ad}


def module_for(cfg):
    """The module that trains `cfg`: `--algo`'s, except that PPO on a multi-agent game is
    multi-agent PPO (one network per team)."""
    if cfg.algo == "ppo" and envs.is_multi_agent(envs.make(cfg.env, cfg.env_args)[0]):
        return mappo
    return ALGOS[cfg.algo]
