"""Algorithms. Each module has `make(cfg, env, env_params, num_devices) -> Algo(init, update, ...)`
with per-device functions, and `check(cfg, num_devices)` for the batch-layout checks."""

from jaxrl_mgpu.algos import ad, dqn, ppo

ALGOS = {"ppo": ppo, "dqn": dqn, "ad": ad}
