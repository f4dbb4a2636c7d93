"""Many independent runs in one compiled program: `--num-seeds K` and `--sweep NAME=v1,v2,...`.

The runs are the configurations of the sweep (the cross product of its values; one without
--sweep) times K seeds, configuration major: run `c * K + s` is configuration c with seed
`seed + s`, so every configuration sees the same K seeds. Each run has its own params,
optimizer state, environments (--num-envs of them) and keys; nothing is averaged across runs.

How they run: the algorithm's per-device `init` and `update` are vmapped over the runs a
device holds (parallel.Parallel.with_runs lays the runs out over the devices), and inside
that vmap each run's swept values replace the config's numbers as traced scalars, so the
algorithm's code, written for one run, reads `cfg.lr` as it always does and one compiled
program serves every value. The swept values travel as the algorithm's `data` (inputs every
update reads and none changes), laid out [devices, runs per device]. The collectives on AXIS
inside the vmap are batched over runs, so they average within each run.

Run i of the program equals the single run with `--seed seed + i % K` and run i's values: its
initial state comes from the same key, and the update is the same computation. Initial states
do not read the swept values (optimizer states and the rest are built from shapes only), so
`init` is the algorithm's own, mapped over the runs' keys.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.algos.base import Algorithm, all_finite
from jaxrl_mgpu.checkpoint import PER_DEVICE, REPLICATED, Layout
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.config import parse_sweep
from jaxrl_mgpu.parallel import Parallel


@dataclasses.dataclass(frozen=True)
class Runs:
    """The runs of a multi-run config: configurations x seeds."""
    seed: int                      # --seed: run i's seed is seed + i % seeds
    seeds: int                     # --num-seeds
    names: tuple[str, ...]         # the swept options, in --sweep's order
    grid: tuple[tuple[float, ...], ...]  # the configurations: one value per swept option

    @staticmethod
    def of(cfg) -> "Runs | None":
        """The runs of `cfg`, or None for a plain single run (no runs axis at all)."""
        if cfg.num_seeds == 1 and not cfg.sweep:
            return None
        sweep = parse_sweep(cfg)
        names = tuple(name for name, _ in sweep)
        return Runs(cfg.seed, cfg.num_seeds, names, tuple(itertools.product(*(values for _, values in sweep))))

    @property
    def count(self) -> int:
        return len(self.grid) * self.seeds

    def config_index(self, run: int) -> int:
        return run // self.seeds

    def seed_of(self, run: int) -> int:
        return self.seed + run % self.seeds

    def hparams(self, run: int) -> dict:
        """Run `run`'s swept values, {option: value}."""
        return dict(zip(self.names, self.grid[self.config_index(run)]))

    def configurations(self) -> list[dict]:
        """Every configuration's swept values, {option: value}, in order (none for seeds alone)."""
        return [dict(zip(self.names, values)) for values in self.grid] if self.names else []

    def describe(self, run: int) -> dict:
        """What identifies a run in its log rows: its index, seed and swept values."""
        return {"run": run, "seed": self.seed_of(run), **self.hparams(run)}

    def values(self) -> dict:
        """Every run's swept values, {option: float32 [runs]} (the traced per-run inputs)."""
        return {name: np.array([self.hparams(i)[name] for i in range(self.count)], np.float32)
                for name in self.names}

    def keys(self, offset: int = 0) -> np.ndarray:
        """[runs, 2] keys: run i's is the single run's PRNGKey(its seed + offset)."""
        return np.stack([np.asarray(jax.random.PRNGKey(self.seed_of(i) + offset)) for i in range(self.count)])


class _RunsReplicated(Layout):
    """A field identical on a run's devices: saved once per run, [runs, ...]."""

    def saved(self, value, par):
        return par.runs_of(value)

    def target(self, value, par, meta):
        return jax.tree.map(lambda x: np.zeros((par.runs,) + x.shape[2:], x.dtype), value)

    def placed(self, restored, par):
        return par.shard_runs(restored)


class _RunsPerEnv(Layout):
    """A field per environment: saved per run over its environments, [runs, envs per run, ...],
    and laid out again where the environments per run are as many. `restores=False`: a field
    per device (a replay of its own), saved the same way but re-created on a resume."""

    def __init__(self, restores: bool = True):
        self.restores = restores

    def saved(self, value, par):
        return par.run_envs_of(value)

    def target(self, value, par, meta):
        envs = par.data_devices * jax.tree.leaves(value)[0].shape[2]
        if not self.restores or meta.get("num_envs") != envs:
            return None
        return jax.tree.map(lambda x: np.zeros((par.runs, envs) + x.shape[3:], x.dtype), value)

    def placed(self, restored, par):
        return par.shard_run_envs(restored)


def per_run(layout: Layout) -> Layout:
    """A single run's field layout (checkpoint.py) for the same field of every run."""
    if layout is REPLICATED:
        return _RunsReplicated()
    return _RunsPerEnv(restores=layout is not PER_DEVICE)


def setup(cfg, par: Parallel) -> Parallel:
    """`par` laid out for `cfg`'s runs (a runs axis), or `par` itself for a single run."""
    runs = Runs.of(cfg)
    return par if runs is None or par.runs is not None else par.with_runs(runs.count)


def algorithm(run, spec, runs: Runs) -> Algorithm:
    """`spec`'s algorithm (algos.Spec) for every run the devices of `run` (the plan, an
    algos.base.Resolved) hold, vmapped over them."""
    cfg = run.cfg
    base = spec.algorithm(run)
    if base.data:
        raise ConfigError(f"--num-seeds / --sweep: --algo {cfg.algo} reads a dataset in its update and trains one "
                          f"run at a time")

    def update(state, values: dict):
        def one(state, run_values):
            # This run's swept values as the config's numbers: traced scalars, not constants.
            run_cfg = dataclasses.replace(cfg, **run_values)
            new, (losses, episodes) = spec.algorithm(dataclasses.replace(run, cfg=run_cfg)).update(state)
            # A run whose update went non-finite (a swept learning rate too large) keeps the
            # parameters it had and gets a NaN optimizer state, so every later update of it is
            # non-finite too (a mark a checkpoint keeps): it never learns again, and its last
            # finite policy goes on acting, its returns logged. The other runs go on. Only these
            # two small parts are chosen per run: choosing the whole state would copy DQN's
            # replay every update. The chunk reads the mark (`finite` below), so flagged and
            # stopped are the same runs.
            learned = {f: getattr(new, f) for f in base.learned}
            optimizers = {f: getattr(new, f) for f in base.optimizers}
            ok = all_finite(losses, learned, optimizers)
            kept = jax.tree.map(lambda a, b: jnp.where(ok, a, b), learned, {f: getattr(state, f) for f in learned})
            marked = jax.tree.map(lambda x: jnp.where(ok, x, jnp.nan) if jnp.issubdtype(x.dtype, jnp.floating)
                                  else x, optimizers)
            return new._replace(**kept, **marked), (losses, episodes)
        return jax.vmap(one)(state, values)

    # The runs' initial states one after another (lax.map), not vmapped: a vmapped orthogonal
    # init is a batched QR, which jaxlib's CPU LAPACK kernels split over XLA's thread pool from
    # inside it, and 128 CartPole runs deadlocked there on a 2-core machine. One run's init is
    # also exactly the single run's (an unbatched QR). It runs once.
    return dataclasses.replace(base, init=lambda keys: jax.lax.map(base.init, keys), update=update,
                               layout={name: per_run(kind) for name, kind in base.layout.items()},
                               data=(run.par.shard_runs(runs.values()),),
                               finite=jax.vmap(lambda losses, state: all_finite(
                                   [getattr(state, f) for f in base.optimizers])))
