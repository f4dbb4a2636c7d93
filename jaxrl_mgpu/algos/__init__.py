"""Algorithms. Each module has `check(cfg, num_devices) -> base.Split` (the batch over the
devices, checked once, or a one-line ConfigError), `algorithm(cfg, env, env_params, split, par)
-> base.Algorithm` (what the runner runs), `make(cfg, env, env_params, split)` (its per-device
functions),
STEP_UNIT and `steps_per_update(cfg)` (how progress is counted), and STATE_KEYS (the options
that shape its checkpointed state)."""

from jaxrl_mgpu.algos import ad, dqn, ppo

ALGOS = {"ppo": ppo, "dqn": dqn, "ad": ad}
