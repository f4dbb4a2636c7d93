"""Devices and hosts: the only module that knows about them.

Every per-device function in this project is written for ONE device's slice of the work and
uses collectives on the single named axis `AXIS`. This module maps such a function over the
devices, with `jax.pmap` (default) or `jax.jit(jax.shard_map(...))` over a 1-D mesh.

Both backends use the same array layout: every leaf of the training state carries a leading
device axis of length `num_devices` (global over all hosts), sharded one slice per device. So
a state made by one backend can be fed to the other, checkpoints look the same, and the
per-device code never sees the device axis.

Many runs (--num-seeds, --sweep: multirun.py) add a second mesh axis, `RUNS`, beside the data
axis: the devices form `groups` x `data_devices`, each group of `data_devices` devices trains
`runs_per_device` runs (vmapped inside the per-device function, the same runs on every device
of the group), and the collectives on AXIS reach only the devices of one group, so they never
mix runs. The leading device axis stays one flat axis of `num_devices` (groups major), so
everything above keeps its layout; each leaf's second axis is then the runs axis.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxrl_mgpu.cli import UserError, count

AXIS = "devices"
RUNS = "runs"  # the mesh axis over groups of devices that train different runs (multirun.py)
BACKENDS = ("pmap", "shard_map")


class ParallelError(UserError):
    """A request for devices that cannot be met (the CLI turns it into a one-line error)."""


@dataclasses.dataclass(frozen=True)
class Parallel:
    """Which devices take part and how per-device functions are mapped over them."""

    backend: str
    devices: tuple  # global devices on the axis, in axis order
    mesh: Mesh
    runs: int | None = None  # many runs (with_runs): how many, over all devices; None: one run, no runs axis
    groups: int = 1          # groups of devices on the RUNS axis, each training its own runs

    @property
    def num_devices(self) -> int:
        """Devices on the axis, over all hosts."""
        return len(self.devices)

    @property
    def data_devices(self) -> int:
        """Devices that share one run's batch (the size of AXIS): all of them for one run."""
        return self.num_devices // self.groups

    @property
    def runs_per_device(self) -> int:
        return self.runs // self.groups

    @property
    def axes(self):
        """The mesh axes the leading device axis is split over (groups major)."""
        return AXIS if self.runs is None else (RUNS, AXIS)

    def with_runs(self, runs: int) -> "Parallel":
        """The same devices laid out for `runs` independent runs. shard_map: gcd(runs, devices)
        groups, so that runs >= devices puts runs / devices runs on each device (when it
        divides) and runs < devices gives each run devices / runs devices (when that divides);
        other counts take the largest layout that splits both evenly. pmap has no 2-D mesh:
        runs / devices runs on each device when it divides, else every run on every device."""
        if self.backend == "shard_map":
            groups = math.gcd(runs, self.num_devices)
        else:
            groups = self.num_devices if runs % self.num_devices == 0 else 1
        mesh = Mesh(np.array(self.devices).reshape(groups, -1), (RUNS, AXIS), axis_types=(AxisType.Auto,) * 2)
        return dataclasses.replace(self, mesh=mesh, runs=runs, groups=groups)

    @property
    def local_devices(self) -> tuple:
        return tuple(d for d in self.devices if d.process_index == jax.process_index())

    @property
    def num_local_devices(self) -> int:
        return len(self.local_devices)

    @property
    def sharding(self) -> NamedSharding:
        """Leading axis split over devices: the layout of every state leaf."""
        return NamedSharding(self.mesh, P(self.axes))

    def map(self, fn: Callable, donate: bool = False) -> Callable:
        """Maps a per-device function over all devices; every argument and result carries the
        leading device axis. `donate` hands the first argument's buffers to the result, so the
        training state is updated in place."""
        donate_argnums = (0,) if donate else ()
        if self.backend == "pmap":
            axis = AXIS
            if self.groups > 1:  # (with_runs: then one device per group) pmap maps the groups,
                axis, fn = RUNS, _alone_on_axis(fn)  # and the data axis is one device long
            mapped = jax.pmap(fn, axis_name=axis, devices=self.devices, donate_argnums=donate_argnums)
            if jax.process_count() == 1:
                return mapped
            # Across processes pmap returns process-local arrays; keep the global layout.
            return lambda *args: jax.tree.map(self._global, mapped(*args))

        def per_device(*args):
            # shard_map hands each device a slice whose device axis has length 1
            out = fn(*jax.tree.map(lambda x: x[0], args))
            return jax.tree.map(lambda x: x[None], out)

        # No varying-manual-axes typing (check_vma): environments of other suites (and users')
        # branch with lax.cond between a value of the state and a constant, which that typing
        # refuses; the per-device code never differentiates through a collective (gradients are
        # averaged after they are taken), so nothing depends on it.
        mapped = jax.shard_map(per_device, mesh=self.mesh, in_specs=P(self.axes), out_specs=P(self.axes),
                               check_vma=False)
        return jax.jit(mapped, donate_argnums=donate_argnums)

    def _global(self, local: jax.Array) -> jax.Array:
        """A process-local [num_local_devices, ...] array as the global [num_devices, ...] one."""
        return jax.make_array_from_single_device_arrays(
            (self.num_devices,) + local.shape[1:], self.sharding, [s.data for s in local.addressable_shards])

    def compile(self, mapped: Callable, *args) -> Callable:
        """`mapped` (from `map`) compiled ahead of time for `args`. Across processes, pmap's
        ahead-of-time path expects process-local shapes while its call takes global arrays, so
        there it compiles on the first call instead."""
        if self.backend == "pmap" and jax.process_count() > 1:
            return mapped
        return mapped.lower(*args).compile()

    def replicate(self, tree: Any) -> Any:
        """The same host value on every device (leading device axis added)."""
        return self.shard(jax.tree.map(lambda x: np.broadcast_to(np.asarray(x)[None],
                                                                (self.num_local_devices,) + np.shape(x)), tree))

    def shard(self, local_tree: Any) -> Any:
        """Host-local values with a leading axis of `num_local_devices` -> global arrays with one
        slice per device (every host passes its own slices)."""
        return jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(self.sharding, np.asarray(x)), local_tree)

    def first(self, tree: Any) -> Any:
        """Device 0's slice of each leaf, as numpy. Reads the first addressable shard instead
        of indexing (`x[0]` would gather, and fails across hosts)."""
        return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data)[0], tree)

    def local_rows(self, tree: Any) -> Any:
        """This process's device rows of host arrays laid out [num_devices, ...] (what `shard`
        takes from each process)."""
        index = [d.id for d in self.devices].index(self.local_devices[0].id)
        return jax.tree.map(lambda x: x[index:index + self.num_local_devices], tree)

    def shard_runs(self, tree: Any) -> Any:
        """Host values with a leading runs axis [runs, ...] -> global arrays [num_devices,
        runs_per_device, ...]: each device gets the runs of its group."""
        positions = [self.devices.index(d) for d in self.local_devices]
        per_group = self.runs_per_device
        return self.shard(jax.tree.map(lambda x: np.stack(
            [np.asarray(x)[p // self.data_devices * per_group:][:per_group] for p in positions]), tree))

    def runs_of(self, tree: Any) -> Any:
        """Every run's values [runs, ...] as numpy, from global arrays [num_devices,
        runs_per_device, ...] (the first device of each group: the others hold the same)."""
        def gather(x):
            rows = _everything(x)[::self.data_devices]
            return rows.reshape((-1,) + rows.shape[2:])
        return jax.tree.map(gather, tree)

    def run_envs_of(self, tree: Any) -> Any:
        """Every run's environments [runs, envs per run, ...] as numpy, from global arrays
        [num_devices, runs_per_device, envs per device, ...] (a run's environments are spread
        over the devices of its group, in device order)."""
        def gather(x):
            full = _everything(x)
            full = full.reshape((self.groups, self.data_devices) + full.shape[1:]).swapaxes(1, 2)
            return full.reshape((self.runs, -1) + full.shape[4:])
        return jax.tree.map(gather, tree)

    def shard_run_envs(self, tree: Any) -> Any:
        """The inverse of `run_envs_of`: [runs, envs per run, ...] -> global arrays."""
        positions = [self.devices.index(d) for d in self.local_devices]
        per_group, n = self.runs_per_device, self.data_devices

        def split(x):
            x = np.asarray(x)
            e = x.shape[1] // n
            return np.stack([x[p // n * per_group:][:per_group, p % n * e:][:, :e] for p in positions])
        return self.shard(jax.tree.map(split, tree))

    def local(self, tree: Any) -> Any:
        """This host's slices of each leaf, stacked on the device axis, as numpy."""
        def gather(x):
            shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
            return np.concatenate([np.asarray(s.data) for s in shards], axis=0)
        return jax.tree.map(gather, tree)


def _everything(x: jax.Array) -> np.ndarray:
    """All of a global array, on every process, as numpy."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _alone_on_axis(fn: Callable) -> Callable:
    """`fn` with AXIS bound as a vmapped axis of length 1, where each device trains runs of its
    own under pmap: its collectives on AXIS then reduce over this one device."""
    def alone(*args):
        out = jax.vmap(fn, axis_name=AXIS)(*jax.tree.map(lambda x: x[None], args))
        return jax.tree.map(lambda x: x[0], out)
    return alone


class DistributedError(UserError):
    """The processes of a multi-host job could not connect (the CLI prints one line)."""


def cluster_detected() -> bool:
    """A multi-process launch by a cluster manager JAX knows (SLURM, Open MPI)."""
    return any(int(os.environ.get(var, "1")) > 1 for var in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: str | None = None, timeout: int = 60) -> None:
    """Starts JAX's multi-controller runtime (`jax.distributed`) when this is one process of
    several: explicit flags, or a cluster JAX detects. Must run before any other JAX call.
    After it, `jax.devices()` lists every device of every process, and the device axis spans
    them all. A process that dies is noticed by the others within `timeout` seconds (missed
    heartbeats), and they exit instead of hanging in a collective. Once started, a second call
    does nothing (train.main starts it before the parse where that imports a user's code)."""
    if jax.distributed.is_initialized() or (coordinator_address is None and not cluster_detected()):
        return
    if coordinator_address is not None and process_id:
        # JAX aborts the whole process (no Python exception) when the coordinator cannot be
        # reached, so look for it first and fail with a message instead.
        _wait_for(coordinator_address, timeout)
    # Collectives between CPU processes (tests, laptops) go through gloo; GPUs use NCCL.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    ids = [int(i) for i in local_device_ids.split(",")] if local_device_ids else None
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id, local_device_ids=ids,
                                   initialization_timeout=timeout, heartbeat_timeout_seconds=timeout,
                                   shutdown_timeout_seconds=timeout)
    except Exception as e:  # JAX raises several kinds; all mean the job cannot start
        where = coordinator_address or "the address the cluster manager gave"
        raise DistributedError(f"could not start the multi-process job: coordinator {where} not reachable "
                               f"or peers missing within --failure-timeout {timeout}s "
                               f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def leave_job() -> None:
    """Leaves a multi-process job together with the others, after a run that ended well. The
    coordination service lives in process 0: if process 0 exits first, a process that is still
    winding down loses its connection and JAX aborts it (exit 134), so every process waits here
    for the others (at most --failure-timeout seconds) before any exits."""
    if jax.distributed.is_initialized():
        try:
            jax.distributed.shutdown()
        except Exception as e:  # a peer that never came: the run itself is done and saved
            print(f"warning: process {jax.process_index()}: the job's processes did not leave together "
                  f"({type(e).__name__}: {str(e).splitlines()[0][:200]})", file=sys.stderr)


def start_backend() -> None:
    """Starts JAX's backend (the CUDA client: a second or two on a GPU) on a thread, so that it
    overlaps with the imports that follow; the first device query waits for it. Call it after
    `initialize`."""
    threading.Thread(target=jax.devices, name="backend-start", daemon=True).start()


def _wait_for(address: str, timeout: float) -> None:
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise DistributedError(f"--coordinator-address {address}: no coordinator (process 0) answered "
                                       f"within --failure-timeout {timeout}s") from None
            time.sleep(0.2)


def barrier(name: str) -> None:
    """Waits until every process gets here (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
    """True on every process if `flag` is true on any (e.g. a stop signal that reached only
    some hosts), so all processes take the same branch."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(np.asarray(multihost_utils.process_allgather(np.array(flag))).any())


def agree(flag: bool, count: int) -> tuple[bool, int]:
    """`(any process's flag, the smallest count)` on every process, in one collective: what the
    loop decides between chunks (a stop, the next chunk's length) must be the same everywhere."""
    if jax.process_count() == 1:
        return flag, count
    from jax.experimental import multihost_utils
    both = np.asarray(multihost_utils.process_allgather(np.array([int(flag), count], np.int64)))
    return bool(both[:, 0].any()), int(both[:, 1].min())


def broadcast(value: int) -> int:
    """Process 0's value of an int, on every process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils
    return int(multihost_utils.broadcast_one_to_all(np.array(value, np.int64)))


def broadcast_after(key: str, value: int | None, timeout_s: float = 3600.0) -> int:
    """Process 0's `value`, on every process, however long process 0 takes to produce it (a
    search of minutes): through the coordination service's key-value store, where a collective
    would give up on a peer that is late (gloo waits 30 s)."""
    if jax.process_count() == 1:
        return int(value)
    from jax._src import distributed
    client = distributed.global_state.client
    if jax.process_index() == 0:
        client.key_value_set(f"jaxrl_mgpu/{key}", str(int(value)))
        return int(value)
    return int(client.blocking_key_value_get(f"jaxrl_mgpu/{key}", int(timeout_s * 1000)))


def setup(backend: str = "pmap", devices: int | None = None) -> Parallel:
    """Chooses the devices: all of them by default, or the first `devices` local devices of
    each host. Raises ParallelError with a message naming the option when it cannot."""
    if backend not in BACKENDS:
        raise ParallelError(f"--parallel {backend!r} is not a backend; choose from: {', '.join(BACKENDS)}")
    local = jax.local_devices()
    if devices is not None:
        if devices < 1 or devices > len(local):
            raise ParallelError(f"--devices {devices} is not available: this host has {len(local)} "
                                f"{local[0].platform.upper()} device(s); choose 1..{len(local)}")
    per_host = devices or len(local)
    # The first `per_host` devices of every host, hosts in process order.
    chosen = []
    for p in range(jax.process_count()):
        host = sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
        chosen.extend(host[:per_host])
    mesh = Mesh(np.array(chosen), (AXIS,), axis_types=(AxisType.Auto,))
    return Parallel(backend=backend, devices=tuple(chosen), mesh=mesh)


def this_device() -> Parallel:
    """This process's first local device alone (shard_map, so it compiles ahead of time in any
    process count): where --auto-scale compiles and probes the per-device program."""
    device = jax.local_devices()[0]
    return Parallel(backend="shard_map", devices=(device,),
                    mesh=Mesh(np.array([device]), (AXIS,), axis_types=(AxisType.Auto,)))


def device_index() -> jax.Array:
    """This device's position on the axis (inside a mapped function)."""
    return jax.lax.axis_index(AXIS)


def all_mean(tree):
    """`lax.pmean(tree, AXIS)` as ONE all-reduce: the leaves travel as a single flat float32
    buffer. Per-leaf collectives cost a launch and a latency each, and with small networks that
    latency, not bandwidth, is what a gradient all-reduce costs. Identity on one device. Like
    `lax.pmean`, integer leaves come back as float32 means."""
    return _fused(jax.lax.pmean, tree, lambda x: jnp.result_type(x, jnp.float32))


def all_sum(tree):
    """`lax.psum(tree, AXIS)` as one all-reduce (see `all_mean`); leaves keep their dtype
    (integers travel as float32: exact below 2**24, which the counts summed here stay under)."""
    return _fused(jax.lax.psum, tree, jnp.result_type)


def _fused(collective: Callable, tree, out_dtype: Callable):
    if jax.lax.axis_size(AXIS) == 1:
        # No packing on one device; the collective itself stays (XLA drops a one-device
        # all-reduce), since under shard_map it is what makes the result the same on every
        # device by type, which loops that carry it need.
        return jax.tree.map(lambda x: collective(jnp.asarray(x, out_dtype(x)), AXIS), tree)
    flat, unflatten = ravel_pytree(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree))
    out = unflatten(collective(flat, AXIS))
    return jax.tree.map(lambda o, x: o.astype(out_dtype(x)), out, tree)


def zeros(shape: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros of an abstract value (`jax.eval_shape`'s), varying over the same mesh axes: under
    shard_map a loop's carry and a cond's branches must keep their types, and with many runs
    per-run values vary over the runs axis even after the collectives on AXIS."""
    varying = tuple(getattr(getattr(shape, "manual_axis_type", None), "varying", ()))
    out = jnp.zeros(shape.shape, shape.dtype)
    return jax.lax.pcast(out, varying, to="varying") if varying else out


@jax.jit
def copy_on_devices(tree):
    """A copy of `tree` where its arrays lie, in one program for every leaf: a snapshot of
    values the next chunk takes (donates), for a thread that saves or publishes them."""
    return jax.tree.map(jnp.copy, tree)


def global_indices(local_count: int) -> jax.Array:
    """Global indices of this device's `local_count` items (environments, samples), inside a
    mapped function. Items are laid out device after device, so item i of the global batch
    is the same whatever the device count."""
    return device_index() * local_count + jnp.arange(local_count)


def is_main() -> bool:
    """Only the main process writes logs, metrics and configs."""
    return jax.process_index() == 0


def split_evenly(total: int, parts: int, what: str) -> int:
    """`total / parts`, or a ParallelError naming the option when it does not divide."""
    if total % parts:
        raise ParallelError(f"{what} {total} is not divisible by {count(parts, 'device')}; "
                            f"use a multiple of {parts}")
    return total // parts


def host_cores() -> int:
    """The CPU cores this process may run on (its affinity: what a container or taskset leaves it)."""
    return len(os.sched_getaffinity(0))


def host_memory() -> tuple[int, str]:
    """The host's memory available to new allocations now, in bytes, and where the number comes
    from (Linux's MemAvailable; elsewhere its physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib * 1024, "MemAvailable"
    except (OSError, StopIteration):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"


def memory_limit(device) -> tuple[int, str]:
    """The bytes a program may use on `device`, and where the number comes from."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "memory_stats()['bytes_limit']"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(len(jax.local_devices()), 1), "no device memory limit: host RAM / local devices"
