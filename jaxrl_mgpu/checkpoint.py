"""Orbax checkpoints of a training state, restorable on any number of devices.

A training state is a NamedTuple whose leaves all carry the leading device axis. Each
algorithm declares, per field, how that field lies on the devices and is saved (its
`STATE_LAYOUT`, a `Layout` per field):

- REPLICATED (params, optimizer state, keys, counters): identical on every device, so ONE copy
  is saved (device 0's) and it is copied to however many devices restore it;
- PER_ENV (environment states): saved as global arrays over the environment axis
  ([num_envs, ...], each device writing its own slice), so they can be split again over a
  different device count as long as the global number of environments is the same;
- PER_DEVICE (e.g. replay buffers): saved as is; restored only on the same device count,
  else re-created (the caller logs what was re-created).

Many runs in one program (multirun.py) bring layouts of their own; this module only calls a
field's layout.

Saves are asynchronous and atomic: Orbax writes into a temporary directory and renames it
when complete. Deleting an old step is atomic too: Orbax renames it into `deleted/` (a plain
recursive delete killed half-way would leave a listed step with items missing), and the
writer empties `deleted/` before its next save. So a process killed at any moment leaves no
listed checkpoint that fails to restore.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import json
import logging
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_mgpu import parallel
from jaxrl_mgpu.cli import one_line
from jaxrl_mgpu.parallel import Parallel

DELETED = "deleted"  # where Orbax moves the steps it drops, inside each manager's directory


def _split_env_axis(tree, par: Parallel):
    """[devices, envs per device, ...] -> [global envs, ...], still sharded over devices."""
    return jax.jit(lambda t: jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), t),
                   out_shardings=par.sharding)(tree)


def _join_env_axis(tree, par: Parallel):
    """[global envs, ...] -> [devices, envs per device, ...]."""
    n = par.num_devices
    return jax.jit(lambda t: jax.tree.map(lambda x: x.reshape((n, -1) + x.shape[1:]), t),
                   out_shardings=par.sharding)(tree)


class Layout:
    """How a field of the training state lies on the devices ([devices, ...] leaves) and is
    saved: `saved` (what Orbax writes), `target` (what to restore into, given the template's
    value and the checkpoint's metadata; None where the saved value cannot be laid out on
    these devices, and the field is re-created) and `placed` (the restored value back on the
    devices)."""

    def saved(self, value, par: Parallel):
        raise NotImplementedError

    def target(self, value, par: Parallel, meta: dict):
        raise NotImplementedError

    def placed(self, restored, par: Parallel):
        raise NotImplementedError


class _Replicated(Layout):
    def saved(self, value, par):
        return par.first(value)

    def target(self, value, par, meta):
        return jax.tree.map(lambda x: np.zeros(x.shape[1:], x.dtype), value)

    def placed(self, restored, par):
        return par.replicate(restored)


class _PerEnv(Layout):
    def saved(self, value, par):
        return _split_env_axis(value, par)

    def target(self, value, par, meta):
        leaf = jax.tree.leaves(value)[0]
        if meta.get("num_envs") != leaf.shape[0] * leaf.shape[1]:
            return None
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] * x.shape[1],) + x.shape[2:], x.dtype,
                                                           sharding=par.sharding), value)

    def placed(self, restored, par):
        return _join_env_axis(restored, par)


class _PerDevice(Layout):
    def saved(self, value, par):
        return value

    def target(self, value, par, meta):
        if meta.get("num_devices") != par.num_devices:
            return None
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=par.sharding), value)

    def placed(self, restored, par):
        return restored


REPLICATED, PER_ENV, PER_DEVICE = _Replicated(), _PerEnv(), _PerDevice()


class DamagedCheckpoint(Exception):
    """A checkpoint that does not read back whole: a file of it truncated, emptied or missing."""

    def __init__(self, step: int, why: str):
        super().__init__(f"the checkpoint at update {step} cannot be read ({why})")
        self.step, self.why = step, why


class _Dropped(logging.Filter):
    """Drops a logger's records whose message starts with one of `prefixes`."""

    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


# Orbax logs (through absl) every read of a step's metadata file that is not JSON, once per
# listing, and goes on; `Checkpoints._reading` checks that file itself and reports its damage
# in one line.
logging.getLogger("absl").addFilter(_Dropped("Failed to json parse Metadata file"))


_ORBAX = str(Path(ocp.__file__).parent)  # Orbax's code, to tell its coroutines from others


def _quiet_failed_read() -> None:
    """After a failed read, TensorStore completes the reads still in flight on its own threads
    and hands each result to Orbax's asyncio loop, which the failure closed: every one is a
    'RuntimeError: Event loop is closed' that Python reports as unraisable, and the tasks (and
    gathers) whose exceptions nobody awaits any more are logged by asyncio, a traceback each
    on stderr. The reads still waiting when the loop closed are left suspended; when the
    garbage collector finalises one, Python closes it (GeneratorExit at its await), Orbax's
    read turns any BaseException into an Exception whose message holds a TensorStore's whole
    repr, and Python reports that as unraisable ("Exception ignored in: <coroutine ...>", some
    65 lines each). The failure itself is reported in one line, so these are dropped (only
    these: of coroutines, only Orbax's, and only an error raised while it was closed). Called
    before every read, not after a failed one: TensorStore's threads may complete a read in
    flight before the failure has reached this module."""
    previous = sys.unraisablehook
    if getattr(previous, "quiet_closed_loop", False):
        return
    logging.getLogger("asyncio").addFilter(_Dropped("Future exception was never retrieved",
                                                    "Task exception was never retrieved",
                                                    "_GatheringFuture exception was never retrieved"))

    def hook(unraisable):
        error = unraisable.exc_value
        closed_loop = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
        abandoned = (inspect.iscoroutine(unraisable.object) and isinstance(error.__context__, GeneratorExit)
                     and unraisable.object.cr_code.co_filename.startswith(_ORBAX))
        if not (closed_loop or abandoned):
            previous(unraisable)

    hook.quiet_closed_loop = True
    sys.unraisablehook = hook


_LOCAL_FILE = re.compile(r'local file "([^"]+)"')  # how TensorStore names a file in its errors
_ARRAY = re.compile(r'Error reading "([^"/]+)/')     # ... and the array (its key in the item's database)


def _causes(error: BaseException):
    """`error` and the exceptions it was raised from, outermost first."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _damage(step_dir: Path, error: BaseException) -> str:
    """A failed read in words: the damaged part (the checkpoint's item, named after the state's
    field: replay, params, ...), its array, the file and what is wrong with it. TensorStore's
    error names the files but ends with its whole spec as JSON, and Orbax wraps it in an error
    that prints a TensorStore's repr (many lines): only the names and the last reason are kept.
    An error that names no file of the step: its first line."""
    prefix = str(step_dir).rstrip("/") + "/"
    for text in reversed([str(e) for e in _causes(error)]):  # innermost first: TensorStore's own
        text = text.split(" [tensorstore_spec")[0]
        files = [f for f in _LOCAL_FILE.findall(text) if f.startswith(prefix)]
        if files:
            part = files[0][len(prefix):].split("/")[0]
            problem = (text.rsplit(f'local file "{files[-1]}": ', 1)[-1].strip().splitlines() or ["unreadable"])[0]
            array = _ARRAY.search(text)
            name = f" ({array[1].removeprefix(part + '.')})" if array else ""
            return f"damaged {part}{name}: {files[-1].rstrip('/')}: {problem}"
    return one_line(error).split(". See full TensorStore details:")[0]


class CheckpointMismatch(Exception):
    """A saved state whose tree does not fit the state this code builds: written by another
    version (e.g. before the optimizer state became one flat vector) or another model."""


class Checkpoints:
    """`<run-dir>/checkpoints` (latest `keep` states) and `<run-dir>/best` (params of the best
    evaluation)."""

    def __init__(self, run_dir: str | Path, keep: int = 3, read_only: bool = False):
        self.root = Path(run_dir).absolute()
        self._read_only = read_only
        self._best = None
        if read_only or jax.process_count() > 1:
            self._latest = self._manager("checkpoints", keep)
        else:
            # A writer's manager is made on a thread (Orbax's set-up takes a second or more on
            # some machines) while the run compiles; the first save waits for it. Across
            # processes Orbax's set-up synchronises them, so there it is made here.
            self._latest = concurrent.futures.ThreadPoolExecutor(1).submit(self._manager, "checkpoints", keep)

    @property
    def latest(self) -> ocp.CheckpointManager:
        if isinstance(self._latest, concurrent.futures.Future):
            self._latest = self._latest.result()
        return self._latest

    def _manager(self, name: str, keep: int) -> ocp.CheckpointManager:
        # Readers (evaluation, resume checks) must neither create directories nor delete steps.
        return ocp.CheckpointManager(self.root / name, options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=True, create=not self._read_only,
            todelete_subdir=None if self._read_only else DELETED))

    @property
    def best(self) -> ocp.CheckpointManager:
        if self._best is None:
            self._best = self._manager("best", 1)
        return self._best

    @staticmethod
    def _purge_deleted(mgr: ocp.CheckpointManager) -> None:
        """Removes the steps `mgr` dropped. Call only with no save of `mgr` in flight: its
        background finalisation is what moves steps in. Process 0 only, as Orbax deletes."""
        mgr.wait_until_finished()
        if jax.process_index() == 0:
            shutil.rmtree(Path(mgr.directory) / DELETED, ignore_errors=True)

    # -- writing ----------------------------------------------------------------------
    def save(self, step: int, state, layout: dict, par: Parallel, meta: dict) -> None:
        """Starts an asynchronous save of `state`, one Orbax item per field (returns once the
        arrays are copied off the devices, so the caller may donate them to the next chunk)."""
        args = {"meta": ocp.args.JsonSave({**meta, "num_devices": par.num_devices})}
        for name, value in state._asdict().items():
            if not jax.tree.leaves(value):
                continue  # an empty field (e.g. a memoryless policy's memory): nothing to save
            value = layout[name].saved(value, par)
            args[name] = ocp.args.StandardSave({name: value})  # a tree: Orbax refuses bare arrays
        self._purge_deleted(self.latest)  # Orbax's save would wait for the previous one here anyway
        self.latest.save(step, args=ocp.args.Composite(**args), force=True)

    def save_best(self, step: int, params, par: Parallel, meta: dict) -> None:
        self._purge_deleted(self.best)
        self.best.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave({"params": par.first(params)}),
                                                     meta=ocp.args.JsonSave(meta)), force=True)

    def wait(self) -> None:
        self.latest.wait_until_finished()
        if self._best is not None:
            self._best.wait_until_finished()

    def close(self) -> None:
        self.wait()
        for mgr in (self.latest, self._best):
            if mgr is not None:
                if not self._read_only:
                    self._purge_deleted(mgr)
                mgr.close()

    # -- reading ----------------------------------------------------------------------
    def steps(self) -> list[int]:
        self.latest.reload()  # another process (the writer) may have added or deleted steps
        return list(self.latest.all_steps())

    def any_complete(self) -> bool:
        """Whether a complete checkpoint is on disk: a directory that Orbax renamed to its step
        (read from the file system alone, so any thread may ask while a save is in flight)."""
        directory = self.root / "checkpoints"
        return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return max(steps) if steps else None

    def best_step(self) -> int | None:
        self.best.reload()
        return self.best.latest_step()

    def meta(self, step: int, best: bool = False) -> dict:
        """The step's metadata (update, env steps, config), or DamagedCheckpoint."""
        mgr = self.best if best else self.latest
        with self._reading(step, mgr):
            return mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    @contextlib.contextmanager
    def _reading(self, step: int, mgr: ocp.CheckpointManager):
        """Any error while reading `step` (other than a tree that does not fit) is the
        checkpoint's damage: DamagedCheckpoint. Orbax's own metadata file is checked first,
        since Orbax logs its errors and goes on."""
        path = Path(mgr.directory) / str(step) / "_CHECKPOINT_METADATA"
        try:
            if path.exists():
                json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DamagedCheckpoint(step, f"{path.name} is not readable JSON ({e})") from None
        _quiet_failed_read()
        try:
            yield
        except CheckpointMismatch:
            raise
        except Exception as e:  # noqa: BLE001  (Orbax and TensorStore raise many kinds)
            # The reads Orbax had not started when its loop closed are collected later, each a
            # "coroutine ... was never awaited" warning. This project has no coroutines of its
            # own, so after a failed read these are Orbax's: dropped from here on.
            warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning)
            raise DamagedCheckpoint(step, _damage(path.parent, e)) from e

    def set_aside(self, step: int) -> Path:
        """Moves a damaged checkpoint out of the listing, to `<run-dir>/damaged/checkpoints-<step>`
        (never deleted: a user may want what is left of it). Process 0 moves it; every process
        then reads the listing again."""
        source, target = self.root / "checkpoints" / str(step), self.root / "damaged" / f"checkpoints-{step}"
        n = 1
        while target.exists():
            n += 1
            target = self.root / "damaged" / f"checkpoints-{step}-{n}"
        if jax.process_index() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            source.rename(target)
        parallel.barrier(f"checkpoint {step} set aside")
        self.latest.reload()
        return target

    def restore(self, step: int, template, layout: dict, par: Parallel) -> tuple[Any, list[str]]:
        """The state saved at `step`, laid out on `par`'s devices. `template` is a freshly
        initialised state on `par`: it gives the tree structure, and the values of whatever
        cannot be re-laid out. Returns the state and the names of the re-created fields."""
        meta = self.meta(step)
        args, recreated = {}, []
        for name, value in template._asdict().items():
            if not jax.tree.leaves(value):
                continue
            target = layout[name].target(value, par, meta)
            if target is None:
                recreated.append(name)
                continue
            args[name] = ocp.args.StandardRestore({name: target})
        try:
            with self._reading(step, self.latest):
                restored = self.latest.restore(step, args=ocp.args.Composite(**args))
        except DamagedCheckpoint as damaged:
            # Orbax compares the saved tree with the template's before it reads any array.
            e = damaged.__cause__
            if not (isinstance(e, ValueError) and "tree structures do not match" in str(e)):
                raise
            where = next((line.strip().rstrip(":") for line in str(e).splitlines()[1:] if line.strip()), "?")
            raise CheckpointMismatch(
                f"the checkpoint at update {step} in {self.root} does not fit this version's training state "
                f"(first difference: {where}); it was written by another version of jaxrl_mgpu: continue it "
                f"with that version, or start a new --run-dir") from e
        values = template._asdict()
        for name in args:
            values[name] = layout[name].placed(restored[name][name], par)
        return type(template)(**values), recreated

    def restore_params(self, step: int, template_params, best: bool = False):
        """Only the params, as host numpy without the device axis (for evaluation);
        `template_params` gives their shapes."""
        target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), template_params)
        mgr = self.best if best else self.latest
        with self._reading(step, mgr):
            restored = mgr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore({"params": target})))
        return restored["params"]["params"]
