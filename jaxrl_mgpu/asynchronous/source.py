"""What the learners' data sources share (`StoreSource`, the base of algos/dqn/asynchronous.py's and
ad.py's; each is a `sources.LearnerSource`): the store, read on a background thread; the ledger
and the checkpoints published with it; the rate limiter with the progress it publishes for
the collectors; the log's data and rate metrics; and the warning when the store holds entries
it cannot read (`stray_warning`)."""

from __future__ import annotations

import concurrent.futures
import copy
import os
import time
from pathlib import Path

from jaxrl_mgpu import parallel
from jaxrl_mgpu.asynchronous import rate
from jaxrl_mgpu.asynchronous.checkpoints import CheckpointPublisher
from jaxrl_mgpu.asynchronous.reader import ShardReader
from jaxrl_mgpu.asynchronous.store import Store
from jaxrl_mgpu.asynchronous.workers import default_workers

# A learner with nothing to learn from looks for new data this often, and while a chunk runs
# takes in what arrived this often (a poll is cheap).
POLL_S = 0.005
# The store holding entries that are not shards this long: the learner says so, once (stray_warning).
STRAY_S = 30.0


class StoreSource:
    """A learner's data source (sources.LearnerSource) fed from the store: the shards, read on a
    background thread; the ledger; the checkpoints; the rate limiter (rate.py) with the progress
    it publishes for the collectors, and the rate metrics of the log. A subclass gives `memory` (what it refills
    on a restart), `counts`, `read(shard)` (a shard as what it inserts; None skips it) and, if
    it can decode a shard in another process, `decode` (a picklable function of the shard)."""

    memory: str
    counts: tuple[str, ...]
    decode = None
    # counts of the subclass (properties): transitions (history steps for AD) received and not
    # yet in the learner's memory; sampled and inserted over the whole run (the rate limiter's
    # terms); in the learner's memory now
    queued: int
    samples: int
    inserts: int
    in_memory: int
    max_chunk: int | None = None  # the most updates a chunk may run (None: as --log-every and the limiter allow)

    def __init__(self, cfg, par, ckpts, layout: dict, log, resume_step: int | None, state):
        self.cfg, self.par, self.log = cfg, par, log
        self.store = Store(cfg.run_dir)
        self.checkpoints = CheckpointPublisher(cfg, par, ckpts, layout, self.store)
        self.ledger = self.checkpoints.start(state, resume_step, self.counts, log, self.memory)
        self.reader = ShardReader(self.store, self.ledger.consumed, refill=resume_step is not None, read=self.read,
                                  decode=self.decode, workers=self.cfg.store_workers or default_workers())
        self.largest_shard, self.waiting_since = 0, None
        self.received_at = time.monotonic()  # when the last shard arrived (or the learner started)
        self._said_strays = False
        self._taken_in = False  # take_in ran since the last poll
        # checkpoints are published on a thread of their own (checkpoint())
        self._background = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-publisher")
        self._publishing: concurrent.futures.Future | None = None
        # What arrived since the last log point, and how the learner's host time went.
        self.window = dict.fromkeys(("collector_wait_s", "learner_wait_s", "ingest_s", "chunks", "chunk_updates",
                                     "between_chunks_s", *(f"collector_wait_s/{why}" for why in rate.HOLD_REASONS)), 0)
        self.per_collector_window: dict[str, int] = {}
        self.steps_logged, self.logged_at = self.ledger.env_steps, time.perf_counter()

    def limit(self, samples_per_iteration: int, min_inserts: int, min_in_flight: int = 0,
              default_target: float | None = None) -> None:
        """Starts the rate limiter: each iteration samples `samples_per_iteration`, none runs
        before the learner's memory holds `min_inserts` transitions; the source's ingest may hold
        back up to `min_in_flight` transitions until more arrive."""
        self.limiter = rate.Limiter(self.cfg, samples_per_iteration, min_inserts, min_in_flight, default_target)
        self.progress = rate.Progress(self.cfg.run_dir, self.limiter)

    def read(self, shard):
        """A shard as what the learner inserts (None skips it), on the reader's thread; not
        called where `decode` is given."""
        raise NotImplementedError

    def arrived(self):
        """(shard, is it new, read(shard)) of the shards read since the last call, oldest
        first; each is counted in the ledger (a new one) and marked consumed."""
        for shard, new, data in self.reader.ready():
            self.received_at = time.monotonic()
            self.ledger.consumed.add(shard.path.name)
            self.largest_shard = max(self.largest_shard, shard.meta["env_steps"])
            if new:
                self.ledger.receive(shard.meta)
                self.window["collector_wait_s"] += shard.meta.get("waited_s", 0.0)
                for why, seconds in shard.meta.get("waited_for_s", {}).items():
                    self.window[f"collector_wait_s/{why}"] += seconds
                who = shard.meta["collector"]
                self.per_collector_window[who] = self.per_collector_window.get(who, 0) + shard.meta["env_steps"]
            yield shard, new, data

    def before(self, update: int, stop, waiting) -> int:
        """Source.before: `poll`, and where it allows nothing, `waiting()` and a poll every
        POLL_S until it allows some or `stop()` (0)."""
        allowed = self.poll(update)
        if allowed:
            return allowed
        waiting()
        with self.log.waiting(self.waiting_for):
            while not (allowed := self.poll(update)) and not stop():
                time.sleep(POLL_S)
        return allowed

    def during(self, update: int, done) -> None:
        """Source.during: `take_in` every POLL_S until `done()`, so data is taken in while
        the devices run, not a chunk later."""
        while not done():
            self.take_in(update)
            time.sleep(POLL_S)

    def poll(self, update: int) -> int:
        """Between chunks: puts what take_in made ready while the last chunk
        ran into the learner's memory (the subclass's `insert_ready`), then the iterations the
        rate limiter allows now; with none, takes in what arrived first (nothing runs) and
        publishes the counts; so too where no take_in ran since the last poll (a chunk done
        before the host looked). Times the learner's waits; says once if the store holds what it
        cannot read (stray_warning). Little else happens here: on a GPU the devices idle between
        chunks (loop.py)."""
        start, self.update = time.perf_counter(), update
        received = not self._taken_in  # no take_in since the last poll: the chunk ended before the host looked
        if received:
            self.receive(update)
        self._taken_in = False
        self.insert_ready(update)
        allowed = self.limiter.iterations(self.samples, self.inserts, self.in_memory)
        if not allowed:
            self.receive(update)
            self.insert_ready(update)
            allowed = self.limiter.iterations(self.samples, self.inserts, self.in_memory)
            received = True
        if received:
            self._publish()
        self.window["ingest_s"] += time.perf_counter() - start
        now = time.perf_counter()
        if allowed == 0 and self.waiting_since is None:
            self.waiting_since = now
        elif allowed and self.waiting_since is not None:
            self.window["learner_wait_s"] += now - self.waiting_since
            self.waiting_since = None
        self.say_strays()
        return min(allowed, self.cfg.total_updates, self.max_chunk or allowed)

    def say_strays(self) -> None:
        """Once, stray_warning's line, when the store has held entries that are not shards for
        STRAY_S (from the reader's last listing: no I/O until then)."""
        if self._said_strays or not self.store.strays():
            return
        line = stray_warning(self.store.root, self.store.strays(), time.monotonic() - self.received_at)
        if line is not None:
            self.log.print(line)
            self._said_strays = True

    def take_in(self, update: int) -> None:
        """While a chunk runs: the shards read since, as far towards the
        learner's memory as the host takes them without touching it (the subclass's `receive`);
        then the counts collectors pace themselves by, published."""
        start, self.update = time.perf_counter(), update
        self.receive(update)
        self._taken_in = True
        self.window["ingest_s"] += time.perf_counter() - start
        self._publish()

    def _publish(self) -> None:
        """The learner's counts for the collectors (rate.Progress: at most every PUBLISH_S)."""
        self.progress.publish(samples=self.samples, inserted=self.inserts, last_read=self.reader.newest_taken,
                              pipeline=self.reader.pipeline_steps + self.queued,
                              max_in_flight=self.limiter.in_flight_bound(self.largest_shard))

    def receive(self, update: int) -> None:
        """Takes the shards the reader has read since (`arrived`) towards the learner's memory,
        host work only: the device memory may be in use by a running chunk."""
        raise NotImplementedError

    def insert_ready(self, update: int) -> None:
        """Puts what `receive` made ready into the learner's device memory (between chunks)."""
        raise NotImplementedError

    def ran(self, updates: int, state, between: tuple[float, float] | None = None) -> None:
        """loop.Callbacks.dispatched: counts the chunk, its updates and the host's time since the chunk
        before (`between`, from the last dispatch's return to this one's start; none after a
        wait for data): where dispatching a chunk returns only once it is done (XLA:GPU,
        loop.py), that time leaves the devices idle. Only its part in this log window
        counts (a row written between chunks falls inside it). (Subclasses extend it.)"""
        w = self.window
        w["chunks"] += 1
        w["chunk_updates"] += updates
        if between is not None:
            w["between_chunks_s"] += max(between[1] - max(between[0], self.logged_at), 0.0)

    def rate_metrics(self, samples: int, inserts: int, queued: int, grad_steps: int) -> dict:
        """The log's data and rate keys for the window since the last call (which they close):
        env steps received per second (also per collector), achieved and target samples per
        insert, waits on both sides, the queue, and where the learner's host time went."""
        now, w = time.perf_counter(), self.window
        elapsed = now - self.logged_at
        out = {"env_steps": self.ledger.env_steps, "sps": (self.ledger.env_steps - self.steps_logged) / elapsed,
               "async/samples_per_insert": self.limiter.achieved(samples, inserts),
               "async/samples_per_insert_target": self.limiter.target,
               "async/inserted": inserts, "async/queued_transitions": queued,
               # written to the store, not yet taken up by the reader (on its way, for the
               # collectors' bound), as the reader last listed it: the learner's thread lists nothing
               "async/unread_transitions": self.reader.untaken_steps,
               "async/learner_wait_s": w["learner_wait_s"], "async/collector_wait_s": w["collector_wait_s"],
               # why collectors waited: no learner yet, shards it has not read, or its samples
               **{f"async/collector_wait_s/{why}": w[f"collector_wait_s/{why}"] for why in rate.HOLD_REASONS},
               # the learner thread's share of the window spent taking in data (decoding is not
               # on it: the reader decodes in a thread or process of its own)
               "async/ingest_fraction": w["ingest_s"] / elapsed,
               "async/decode_s_per_shard": self.reader.decode_seconds(),
               # how the learner's chunks went: their mean length (the limiter may allow fewer
               # than --log-every), and the share of the window the host spent between one chunk's
               # dispatch returning and the next one's (waits for data excepted; on a GPU the
               # devices idle then: loop.py)
               "async/iterations_per_chunk": w["chunk_updates"] / w["chunks"] if w["chunks"] else None,
               "async/between_chunks_fraction": w["between_chunks_s"] / elapsed,
               **{f"async/env_steps_per_s/{c}": n / elapsed for c, n in self.per_collector_window.items()},
               **self.ledger.metrics(grad_steps)}
        self.per_collector_window = {}
        self.window = dict.fromkeys(w, 0)
        self.steps_logged, self.logged_at = self.ledger.env_steps, now
        return out

    def checkpoint(self, update: int, state) -> None:
        """Publishes `state` at `update` (and evicts) on a background thread, so the learner goes
        on learning meanwhile: Orbax's synchronous part, the copies to the host and deleting old
        checkpoints and shards would otherwise keep the devices idle between chunks. The state
        is copied on the devices first, since the next chunk takes (donates) it; the ledger as
        it is now goes with it. One publication at a time: the next waits."""
        self._published()
        snapshot, ledger = parallel.copy_on_devices(state), copy.deepcopy(self.ledger)
        self._publishing = self._background.submit(self.checkpoints.publish_and_evict, update, snapshot, ledger)

    def _published(self) -> None:
        """Waits for the publication in flight (raising its error), and drops the shards it
        evicted from the ledger."""
        if self._publishing is not None:
            publishing, self._publishing = self._publishing, None
            self.ledger.consumed -= publishing.result()

    def finish(self, update: int, state, stopped: bool) -> None:
        self.reader.close()
        self._published()
        self.checkpoints.finish(update, state, self.ledger, stopped)

    def close(self) -> None:
        """Stops the reader and waits for a publication in flight (whose error, if any, the
        learner's own error would only hide: it is logged instead). Called more than once."""
        self.reader.close()
        try:
            self._published()
        except Exception as e:  # noqa: BLE001 - closing after another error
            self.log.print(f"  the last checkpoint publication failed: {type(e).__name__}: {e}")
        self._background.shutdown(wait=True)


def stray_warning(root: Path, strays: dict[str, float], idle_s: float, now: float | None = None) -> str | None:
    """The line a learner says once its store (`root`) has held entries that are not shards
    (`strays`: Store.strays) for STRAY_S seconds; None before. The learner never reads nor
    deletes them, so whatever writes them fills the disk, and where they are all that arrives
    the learner starves: a collector of another version, whose --collector-id held a '/', wrote
    its shards into folders of their own, and the learner stayed at update 0 while the store
    grew, saying nothing. `idle_s`: how long the learner has received no shard."""
    now = time.time() if now is None else now
    if not strays or now - next(iter(strays.values())) < STRAY_S:
        return None
    entries = "1 entry that is not a shard" if len(strays) == 1 else f"{len(strays):,} entries that are not shards"
    head = (f"the learner has received nothing for {idle_s:.0f}s, and its store {root} holds"
            if idle_s >= STRAY_S else f"the store {root} holds")
    return (f"warning: {head} {entries} (e.g. {_describe(root / next(iter(strays)))}), which the learner never "
            f"reads nor deletes: written by hand, or by a collector of another version?")


def _describe(path: Path) -> str:
    """What a stray of the store is, for stray_warning."""
    try:
        if not path.is_dir():
            return f"{path.name}, a file"
        inside = sorted(os.listdir(path))
    except OSError:  # gone since the listing
        return path.name
    held = ", ".join(inside[:2]) + (", ..." if len(inside) > 2 else "") if inside else "nothing"
    return f"{path.name}/, a folder without a shard's metadata.json, holding {held}"
