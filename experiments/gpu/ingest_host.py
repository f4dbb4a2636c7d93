"""The asynchronous DQN learner's host work per poll of its feed (issue 31), without a GPU:
shards of Breakout-MinAtar's size (71k transitions of 10x10x4 bytes, as a 256-env collector
writes them) arrive, and each poll takes its replay blocks from the queue
(algos/dqn_ingest.py: `_host_blocks`) and reads them as the copy to the device does. Prints the
mean and the longest poll, and the mean of the polls in which a shard arrived.
    python experiments/gpu/ingest_host.py [--shards 8] [--polls-per-shard 5]"""
import argparse
import time

import numpy as np

from jaxrl_mgpu.algos.replay import Transitions
from jaxrl_mgpu.asynchronous import ingest

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--shards", type=int, default=8)
p.add_argument("--polls-per-shard", type=int, default=5)
p.add_argument("--shard-steps", type=int, default=71_000)
args = p.parse_args()


def shard(n: int) -> Transitions:
    """Arrays whose pages are touched, as those of a shard unpickled from the decoder are."""
    obs = np.ones((n, 10, 10, 4), np.uint8)
    return Transitions(obs, np.ones(n, np.int32), np.ones(n, np.float32), np.ones(n, np.float32), obs.copy())


pending, times = [], []
for _ in range(args.shards):
    pending.append(shard(args.shard_steps))
    for _ in range(args.polls_per_shard):
        start = time.perf_counter()
        blocks, pending = ingest._host_blocks(pending, 1, ingest.INSERT_BUDGET)
        for block in blocks:
            block.obs.sum()  # read, as the copy to the device reads it
        times.append(time.perf_counter() - start)
ms = np.asarray(times) * 1e3
print(f"per poll: mean {ms.mean():.1f} ms, longest {ms.max():.1f} ms; "
      f"polls in which a shard arrived: mean {ms[::args.polls_per_shard].mean():.1f} ms")
