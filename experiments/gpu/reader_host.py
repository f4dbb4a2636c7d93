"""The asynchronous DQN learner's host work per shard it reads (issue 31), without a GPU: writes
shards of Breakout-MinAtar's shape (10x10x4 bytes, episodes of random play, ~10 steps each),
then reads them as the learner does (reader.ShardReader with --store-workers decoder processes,
--mode both's 3-step transitions) and prints the CPU time this process spent per shard and per
transition (the reader thread's share of the learner's process: unpickling, listing, queueing),
and the transitions/s read.
    python experiments/gpu/reader_host.py [--shards 40] [--shard-transitions 8192] [--workers 2]"""
import argparse
import functools
import time


from jaxrl_mgpu.asynchronous.reader import ShardReader
from jaxrl_mgpu.algos.replay_async import read_transitions
from random_shards import random_play_store

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--shards", type=int, default=40)
p.add_argument("--shard-transitions", type=int, default=8192)
p.add_argument("--workers", type=int, default=2)
args = p.parse_args()

store = random_play_store("reader_host.", args.shards, args.shard_transitions)
shards = store.shards()
steps = sum(s.meta["env_steps"] for s in shards)

start, cpu = time.perf_counter(), time.process_time()
reader = ShardReader(store, consumed=set(), refill=False, read=None,
                     decode=functools.partial(read_transitions, n_step=3, gamma=0.99), workers=args.workers)
got = 0
while got < len(shards):
    got += len(reader.ready())
    time.sleep(0.005)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
reader.close()
print(f"{len(shards)} shards of {steps / len(shards):,.0f} transitions, {args.workers} decoders: this process's CPU "
      f"{1e3 * cpu / len(shards):.1f} ms per shard, {1e6 * cpu / steps:.2f} us per transition; "
      f"{steps / wall:,.0f} transitions/s")
