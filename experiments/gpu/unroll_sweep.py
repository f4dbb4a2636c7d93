"""Compile time and steady-state speed of the PPO training chunk for each GPU rollout unroll
(issue 27, point 4); one JSON line per (unroll, envs).

    python experiments/gpu/unroll_sweep.py 1,4,8 32,2048
"""

import json
import sys

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu.tools import bench
from jaxrl_mgpu.algos.ppo import ppo

for unroll in [int(u) for u in sys.argv[1].split(",")]:
    ppo.GPU_ROLLOUT_UNROLL = unroll
    for envs in [int(e) for e in sys.argv[2].split(",")]:
        cfg = config_lib.validate(config_lib.Config(num_envs=envs, total_timesteps=envs * 128 * 10))
        r = bench.measure(cfg, 1, 10, 5)
        print(json.dumps({"unroll": unroll, "envs": envs, "compile_s": round(r["compile_s"], 2),
                          "update_ms": round(r["update_ms"], 3), "sps": round(r["env_steps_per_s"])}), flush=True)
