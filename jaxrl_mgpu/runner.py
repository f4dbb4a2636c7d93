"""The outer loop every algorithm shares.

An algorithm gives per-device functions `init(key)` and `update(state)`. The runner fuses
`log_every` updates into one compiled chunk (`lax.scan`), maps it over all devices, and drives
the chunks from the host. Between chunks it logs, evaluates, checkpoints, and honours stop
requests (SIGTERM / SIGINT) — always at a chunk boundary, so a resumed run continues exactly.
The next chunk is dispatched before the previous chunk's metrics are read, except where the
state itself is needed on the host side (evaluation, checkpoint, stop), so the devices never
wait on logging.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.algos import ALGOS
from jaxrl_mgpu.evaluate import make_episodes, summarize
from jaxrl_mgpu.parallel import Parallel


class Chunk(NamedTuple):
    """What the host reads after a chunk (already reduced over devices)."""
    losses: dict        # means over the chunk's updates
    episodes: Any       # vec.EpisodeStats summed over the chunk's updates
    finite: jax.Array   # [length] bool: losses and params finite after each update


class NonFinite(RuntimeError):
    """A loss or parameter became NaN/inf."""


def all_finite(tree) -> jax.Array:
    return jnp.all(jnp.array([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)]))


def make_chunk(update: Callable, length: int) -> Callable:
    """A per-device function running `length` updates in one `lax.scan`. `data` (optional) is
    a read-only input every update sees, e.g. a dataset shard kept on the device."""
    def chunk(state, *data):
        def body(state, _):
            state, (losses, episodes) = update(state, *data)
            return state, (losses, episodes, all_finite(losses) & all_finite(state.params))

        state, (losses, episodes, finite) = jax.lax.scan(body, state, None, length=length)
        return state, Chunk(jax.tree.map(jnp.mean, losses), jax.tree.map(jnp.sum, episodes), finite)
    return chunk


class Trainer:
    """Builds the algorithm for a config and device set, and the compiled pieces to run it."""

    def __init__(self, cfg, par: Parallel):
        self.cfg, self.par = cfg, par
        self.env, self.env_params = envs_lib.make(cfg.env)
        self.algo_module = ALGOS[cfg.algo]
        self.algo = self.algo_module.make(cfg, self.env, self.env_params, par.num_devices)
        self.layout = self.algo_module.STATE_LAYOUT
        # What progress is counted in: environment steps, or what the algorithm consumes.
        self.step_unit = getattr(self.algo_module, "STEP_UNIT", "env_steps")
        self.steps_per_update = getattr(self.algo_module, "steps_per_update", lambda c: c.batch_size)(cfg)
        # Algorithms that learn from a dataset (AD) load this device's shard once, here; it is
        # passed to every update, and not part of the (checkpointed) state.
        load = getattr(self.algo_module, "load_data", None)
        self.data = () if load is None else (load(cfg, par),)
        self._chunks: dict[int, Callable] = {}
        self._eval = None

    def init_state(self):
        return self.par.map(self.algo.init)(self.key(self.cfg.seed))

    def key(self, seed: int):
        return self.par.replicate(np.asarray(jax.random.PRNGKey(seed)))

    def chunk_fn(self, length: int, state) -> Callable:
        """The compiled chunk of `length` updates (compiled once per length, ahead of time)."""
        if length not in self._chunks:
            mapped = self.par.map(make_chunk(self.algo.update, length), donate=True)
            compiled = self.par.compile(mapped, state, *self.data)
            self._chunks[length] = lambda state: compiled(state, *self.data)
        return self._chunks[length]

    def chunk_lengths(self, start_update: int = 0) -> list[int]:
        """Chunks end on multiples of `log_every` (and at the last update), so a run resumed
        from any chunk boundary runs the same chunks as a run that never stopped."""
        every, ends = self.cfg.log_every, []
        update = start_update
        while update < self.cfg.total_updates:
            update = min((update // every + 1) * every, self.cfg.total_updates)
            ends.append(update)
        return [int(n) for n in np.diff([start_update] + ends)]

    def evaluate(self, params, update: int) -> dict:
        """`eval_episodes` episodes with the current params, spread over all devices."""
        if self._eval is None:
            self._eval = self.par.map(make_episodes(self.algo.policy, self.env, self.env_params,
                                                    self.cfg.eval_episodes, self.par.num_devices, greedy=False))
        # A fixed key per evaluation point: a resumed run evaluates like an uninterrupted one.
        key = self.key(self.cfg.seed + 1_000_003 * (update + 1))
        return summarize(self.par.first(self._eval(params, key)))


def read_chunk(par: Parallel, chunk: Chunk, first_update: int) -> dict:
    """Device 0's copy of the (already all-reduced) chunk metrics, as plain numbers."""
    losses, episodes, finite = par.first((chunk.losses, chunk.episodes, chunk.finite))
    if not finite.all():
        bad = first_update + int(np.argmin(finite))
        raise NonFinite(f"non-finite loss or parameters at update {bad}")
    count = float(episodes.count)
    row = {"episode_return": float(episodes.return_sum) / count if count else float("nan"),
           "episode_length": float(episodes.length_sum) / count if count else float("nan"),
           "episodes": int(count)}
    row.update({k: float(v) for k, v in losses.items()})
    return row


class Hooks(NamedTuple):
    """What the loop does between chunks; any may be None."""
    checkpoint: Callable | None = None   # (update, state) -> None
    evaluate: Callable | None = None     # (update, state) -> dict of eval/ metrics
    stop_requested: Callable | None = None  # () -> bool


def train(trainer: Trainer, log, state=None, start_update: int = 0, hooks: Hooks = Hooks(),
          stop_at: int | None = None) -> tuple[Any, dict, int]:
    """Runs chunks until the last update (or `stop_at`, or a stop request); returns the final
    state, the last log row and the number of updates done."""
    cfg = trainer.cfg
    state = trainer.init_state() if state is None else state
    lengths = trainer.chunk_lengths(start_update)
    t0 = time.perf_counter()
    compiled = {n: trainer.chunk_fn(n, state) for n in set(lengths)}
    log.print(f"  compiled {len(compiled)} chunk size(s) in {time.perf_counter() - t0:.1f}s")
    unit, per_update = trainer.step_unit, trainer.steps_per_update
    log.start(start_update * per_update)
    clock = {"start": time.perf_counter(), "prev": time.perf_counter()}
    last_row: dict = {}

    def emit(update: int, length: int, metrics: Chunk) -> None:
        nonlocal last_row
        row = read_chunk(trainer.par, metrics, update - length + 1)  # blocks until that chunk is done
        now = time.perf_counter()
        last_row = {"update": update, unit: update * per_update, **row,
                    "sps": length * per_update / (now - clock["prev"]), "time": now - clock["start"]}
        clock["prev"] = now

    def due(every: int | None, update: int) -> bool:
        return bool(every) and update % every == 0

    update, pending = start_update, None
    for length in lengths:
        state, metrics = compiled[length](state)  # dispatch; runs while the host logs below
        if pending is not None:
            emit(*pending)
            log.write(last_row)
        update += length
        pending = (update, length, metrics)
        final = update == cfg.total_updates or update == stop_at
        stop = hooks.stop_requested is not None and hooks.stop_requested()
        evaluate = hooks.evaluate is not None and (due(cfg.eval_every, update) or final)
        checkpoint = hooks.checkpoint is not None and (due(cfg.checkpoint_every, update) or final or stop)
        if evaluate or checkpoint or final or stop:
            emit(*pending)  # the state is needed as it is now: read this chunk before the next
            pending = None
            if evaluate:
                last_row.update(hooks.evaluate(update, state))
            log.write(last_row)
            if checkpoint:
                hooks.checkpoint(update, state)
        if final or stop:
            break
    if pending is not None:
        emit(*pending)
        log.write(last_row)
    return state, last_row, update
