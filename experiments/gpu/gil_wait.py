"""Does the asynchronous DQN learner's main thread wait for the GIL (issue 31)? Without a GPU.
Between chunks the learner's thread blocks in a call that releases the GIL (the device
running); when that call returns it needs the GIL back, which its reader thread (unpickling
decoded shards) and copier thread (device_put of blocks) may hold. Python hands the GIL over
only after its switch interval (5 ms by default). This stands in for the learner: the main
thread blocks 10 ms at a time (time.sleep releases the GIL) and takes in shards between the
blocks, as Feed.poll does, while a ShardReader with decoder processes reads Breakout-MinAtar
shards and a copier thread puts their blocks on the (CPU) device. It prints how late the main
thread comes back from its 10 ms blocks, with the helper threads idle and busy, at the default
switch interval and at --switch-s.
    python experiments/gpu/gil_wait.py [--shards 30] [--shard-transitions 8192] [--workers 2] [--switch-s 0.0005]"""
import argparse
import concurrent.futures
import functools
import sys
import time

import jax
import numpy as np

from jaxrl_mgpu.asynchronous.reader import ShardReader
from jaxrl_mgpu.algos.replay_async import read_transitions
from random_shards import random_play_store

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--shards", type=int, default=30)
p.add_argument("--shard-transitions", type=int, default=8192)
p.add_argument("--workers", type=int, default=2)
p.add_argument("--switch-s", type=float, default=0.0005)
args = p.parse_args()

store = random_play_store("gil_wait.", args.shards, args.shard_transitions)
device = jax.devices()[0]
BLOCK_S = 0.010


def late_ms(busy: bool) -> np.ndarray:
    """How late (ms) the main thread came back from each of its 10 ms blocks."""
    reader = copier = None
    if busy:
        reader = ShardReader(store, consumed=set(), refill=False, read=None, workers=args.workers,
                             decode=functools.partial(read_transitions, n_step=3, gamma=0.99))
        copier = concurrent.futures.ThreadPoolExecutor(1)
    late, got, copies = [], 0, []
    while (got < args.shards) if busy else len(late) < 300:
        start = time.perf_counter()
        time.sleep(BLOCK_S)  # the device running a chunk
        late.append(1e3 * (time.perf_counter() - start - BLOCK_S))
        if busy:  # the poll: take what the reader has read, and copy it to the device in 4096-row blocks
            for _, _, t in reader.ready():
                got += 1
                for i in range(0, len(t.reward) - 4095, 4096):
                    copies.append(copier.submit(lambda b: jax.block_until_ready(jax.device_put(b, device)),
                                                tuple(x[i:i + 4096] for x in t)))
    if busy:
        concurrent.futures.wait(copies)
        reader.close()
        copier.shutdown()
    return np.array(late)


print(f"{args.shards} shards of ~{args.shard_transitions} transitions, {args.workers} decoder processes")
for switch in (sys.getswitchinterval(), args.switch_s):
    sys.setswitchinterval(switch)
    for busy in (False, True):
        late = late_ms(busy)
        print(f"switch interval {1e3 * switch:.1f} ms, helper threads {'busy' if busy else 'idle'}: back from "
              f"{len(late)} blocks of {1e3 * BLOCK_S:.0f} ms late by {late.mean():.2f} ms on average "
              f"(median {np.median(late):.2f}, p90 {np.percentile(late, 90):.2f}, max {late.max():.1f})")
