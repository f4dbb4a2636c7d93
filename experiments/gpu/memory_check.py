"""Where a training run's device memory peaks, against XLA's analysis (issue 30). For one
workload at one size on one GPU: the allocator's peak (`memory_stats()['peak_bytes_in_use']`)
after each phase (compiling the chunk, building the initial state, running the chunk), next to
`memory_analysis()` of the chunk and of the init program. Run it twice with the same
--cache DIR: the second process loads the programs from JAX's compilation cache, so nothing is
autotuned there, and its peak is the programs' alone.
    python3 experiments/gpu/memory_check.py --envs-per-device 65536 --cache /tmp/cc -- --config breakout-minatar"""
import argparse
import json
import time

import jax

p = argparse.ArgumentParser()
p.add_argument("--envs-per-device", type=int, required=True)
p.add_argument("--cache", default=None, help="JAX compilation cache directory (min size/time 0)")
p.add_argument("train_args", nargs="*")
args = p.parse_args()
if args.cache:
    jax.config.update("jax_compilation_cache_dir", args.cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

from jaxrl_mgpu import algos, plan as plan_lib
from jaxrl_mgpu import chunks, config as config_lib, parallel  # noqa: E402
from jaxrl_mgpu import autoscale  # noqa: E402

cfg = config_lib.validate(config_lib.from_args(args.train_args + ["--compile-cache", "off"]))
cfg = autoscale.probe_config(cfg, algos.get(cfg.algo), args.envs_per_device)
par = parallel.this_device()
device = par.devices[0]
stats = lambda: device.memory_stats() or {}  # None on the CPU
peak = lambda: stats().get("peak_bytes_in_use")
out = {"args": " ".join(args.train_args), "envs_per_device": args.envs_per_device, "cached": bool(args.cache),
       "device": device.device_kind, "limit": stats().get("bytes_limit")}
trainer = chunks.Trainer(plan_lib.on_devices(cfg, par))
t = time.perf_counter()
trainer.compile(trainer.abstract_state())
out["compile_s"] = round(time.perf_counter() - t, 1)
out["chunk_analysis"] = autoscale.compiled_bytes(trainer.compiled)
m = trainer.compiled.memory_analysis()
out["chunk_parts"] = {k: getattr(m, k) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                  "temp_size_in_bytes", "alias_size_in_bytes")}
init = par.map(trainer.algorithm.init).lower(trainer.key(cfg.seed)).compile()
out["init_analysis"] = autoscale.compiled_bytes(init)
out["peak_after_compile"] = peak()
state = init(trainer.key(cfg.seed))
jax.block_until_ready(state)
out["peak_after_init"] = peak()
out["in_use_after_init"] = stats().get("bytes_in_use")
chunk = trainer.chunk_fn(1, state)
for _ in range(2):
    state = jax.block_until_ready(chunk(state)[0])
out["peak_after_run"] = peak()
print(json.dumps(out), flush=True)
