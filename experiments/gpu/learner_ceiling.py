"""The asynchronous DQN learner's compiled chunk alone: on a full replay of random transitions,
dispatched back to back with one chunk in flight as the runner does, with no store, feed or
collectors. Prints, per chunk length, gradient steps/s, the share of the wall time the host
spent inside the dispatch call, and the share of chunks dispatched onto devices that were
already idle. Run the same command under different XLA_FLAGS to compare XLA:GPU runtimes (a
`lax.fori_loop` whose trip count is a run-time value is a host-driven while loop unless XLA
may put it in a CUDA graph: `--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL`).

    python experiments/gpu/learner_ceiling.py [--seconds 5] [--lengths 1 5 20] [train options]
"""
import argparse
import os
import time

import jax
import numpy as np

from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import chunks, parallel
from jaxrl_mgpu.algos.dqn import dqn
from jaxrl_mgpu.algos.replay import Transitions, grad_steps_per_update
from jaxrl_mgpu.algos.dqn import asynchronous as learner_lib
from jaxrl_mgpu.algos.ingest import LARGE_BLOCK

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=5.0)
p.add_argument("--lengths", type=int, nargs="+", default=[1, 5, 20])
args, rest = p.parse_known_args()
given = config_lib.parse_given(["--config", "breakout-minatar-dqn", "--num-envs", "256", "--mode", "learn", *rest])
cfg = config_lib.validate(config_lib.Config(**given))
par = parallel.setup(cfg.parallel, cfg.devices)
split = learner_lib.check(cfg, par.data_devices)
algorithm = learner_lib.algorithm(cfg, par, split)
lrn = algorithm.parts
trainer = chunks.Trainer(plan_lib.on_devices(cfg, par), algorithm)
state = trainer.init_state()
replay = lrn.init_replay(par.replicate(np.asarray(jax.random.PRNGKey(0))))

# Fill every device's replay with random transitions, a large block at a time.
rng = np.random.default_rng(0)
rows = LARGE_BLOCK
obs = lambda: rng.integers(0, 2, (par.num_devices, rows) + lrn.obs_shape).astype(dqn.stored_obs_dtype(cfg))
block = Transitions(obs(), rng.integers(0, 6, (par.num_devices, rows)).astype(np.int32),
                    rng.random((par.num_devices, rows), np.float32), np.full((par.num_devices, rows), 0.97, np.float32),
                    obs())
block = par.shard(par.local_rows(block))
for _ in range(split.per_device("replay buffer") // rows):
    replay = lrn.insert(replay, block)
jax.block_until_ready(replay)
trainer.compile(state, (replay,))
per_update = grad_steps_per_update(cfg)
print(f"{jax.devices()[0].device_kind}, {par.num_devices} device(s), XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; "
      f"{per_update} gradient steps of "
      f"{cfg.replay_batch_size} an update", flush=True)
for length in args.lengths:
    chunk = trainer.chunk_fn(length, state, (replay,))
    for timed in (False, True):  # a warm-up pass, then the timed one
        pending, updates, inside, idle, chunks = None, 0, 0.0, 0, 0
        start = time.perf_counter()
        while time.perf_counter() - start < (args.seconds if timed else 1.0):
            idle += pending is None or all(x.is_ready() for x in jax.tree.leaves(pending))
            t = time.perf_counter()
            state, metrics = chunk(state)
            inside += time.perf_counter() - t
            if pending is not None:
                jax.block_until_ready(pending)
            pending, updates, chunks = metrics, updates + length, chunks + 1
        jax.block_until_ready(pending)
        wall = time.perf_counter() - start
    print(f"chunks of {length:3d} updates: {updates * per_update / wall:8.0f} gradient steps/s, host inside the "
          f"dispatch {inside / wall:.0%} of the time, {idle / chunks:.0%} of {chunks} chunks dispatched onto idle "
          f"devices", flush=True)
