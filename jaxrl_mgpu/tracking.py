"""Experiment trackers beside a run's own files (`--track wandb,mlflow`): Weights & Biases and
MLflow, through their own libraries (the `wandb` and `mlflow` extras).

What a tracked run gets: the resolved config as parameters (flattened); every metrics.jsonl
line as metrics at the same step (the row's env steps, or the algorithm's unit); the start-up
facts (devices, hosts, card, version, git commit) as tags; at the end summary.json and the
learning curves as artifacts, and `evaluate --video --track` files as media.

- One tracked run per run: `--resume` continues it (its id is kept in the run directory,
  `tracking.json`, so a requeued job appends and never starts a second one), and rows the
  tracker already has (a resume logs the rows after its checkpoint again) are not sent twice.
  Many runs (`--num-seeds`, `--sweep`) give one tracked run per seed or point, grouped under
  the program's name (`--track-group`, default the run directory's name), each with its own
  seed and swept values as parameters.
- Only the main process talks to the trackers.
- A tracker never costs the training: one that cannot be reached at the start is a one-line
  error before anything is written (`--track-on-failure warn`: a warning, and the run trains
  untracked); one that fails later gives one warning line and is dropped, while metrics.jsonl
  stays whole. Rows go to the trackers from a thread of their own, through a queue of at most
  QUEUE_ROWS rows: a tracker that falls that far behind loses rows (said once), never memory.

The trackers' own environment variables work as their users expect (WANDB_MODE, WANDB_PROJECT,
WANDB_ENTITY, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, ...); the options override them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.cli import ConfigError

STATE = "tracking.json"       # in the run directory: each tracker's run ids and the last step it has
QUEUE_ROWS = 1000             # log points waiting for the trackers at most; more are dropped (said once)
FINISH_S = 60.0               # how long the end of a run waits for the trackers to take what is queued
CHECK_TIMEOUT_S = 10          # an MLflow server that does not answer a start-up request in this long is down
DEFAULT_NAME = "jaxrl_mgpu"   # W&B's project and MLflow's experiment where neither option nor variable names one
INSTALL = 'pip install -e ".[{extra}]"'


def names(cfg) -> list[str]:
    """The trackers `--track` names (none without it)."""
    return [n.strip() for n in (cfg.track or "").split(",") if n.strip()]


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dicts and lists in it) as flat name -> value parameters, `a.b` for nested ones."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {prefix.rstrip("."): json.dumps(tree)}
    return {prefix.rstrip("."): tree}


def parameters(cfg_dict: dict) -> dict[str, Any]:
    """A config (config.json's dict) as a tracked run's parameters: flat, without what belongs to
    one invocation rather than to the run (--run-dir, --resume, --stop-at-update, ...) or is the
    program's own bookkeeping (where a resume counts from): a resumed run's are its first's."""
    own = set(config_lib.per_invocation()) | {n for n, o in config_lib.known_options().items() if o.internal}
    return flat({k: v for k, v in cfg_dict.items() if k not in own})


def git_commit() -> str | None:
    """The commit of the package's source, where it is a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


# -- the trackers ----------------------------------------------------------------------------------

class Wandb:
    """Weights & Biases: one `wandb.Run` per run (several at once: reinit='create_new'), its
    files in the run directory (offline: `wandb sync <run_dir>/wandb` uploads them later)."""
    name, extra = "wandb", "wandb"

    def __init__(self, cfg):
        import wandb
        self.wandb, self.cfg, self.runs = wandb, cfg, []

    def check(self) -> None:
        mode = os.environ.get("WANDB_MODE", "online")
        if mode in ("offline", "disabled", "dryrun"):
            return
        key = os.environ.get("WANDB_API_KEY")
        if not key:
            try:
                import netrc
                host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
                key = (netrc.netrc().authenticators(host) or (None, None, None))[2]
            except (OSError, netrc.NetrcParseError):
                key = None
        if not key:
            raise ConfigError("--track wandb: no W&B credentials; run `wandb login` (or set WANDB_API_KEY), or "
                              "track offline with WANDB_MODE=offline and upload later with `wandb sync`")

    def start(self, run_dir: Path, params: list[dict], tags: dict, names: list[str], group: str,
              saved: dict | None) -> dict:
        ids = (saved or {}).get("runs") or [uuid.uuid4().hex[:12] for _ in params]  # W&B ids: [a-z0-9]
        for run_id, run_params, name in zip(ids, params, names):
            self.runs.append(self.wandb.init(
                project=self.cfg.track_project or os.environ.get("WANDB_PROJECT") or DEFAULT_NAME,
                entity=self.cfg.track_entity, group=group if len(params) > 1 or self.cfg.track_group else None,
                name=name, id=run_id, resume="allow", dir=str(run_dir), config=run_params,
                tags=[*(t for t in (self.cfg.track_tags or "").split(",") if t), *(f"{k}:{v}" for k, v in tags.items())],
                reinit="create_new", allow_val_change=True, settings=self.wandb.Settings(silent=True, console="off")))
        return {"runs": ids}

    @property
    def count(self) -> int:
        return len(self.runs)

    def log(self, run: int, metrics: dict, step: int) -> None:
        self.runs[run].log(metrics, step=step)

    def files(self, run: int, paths: list[Path]) -> None:
        for path in paths:
            if path.suffix in (".gif", ".mp4"):
                self.runs[run].log({path.stem: self.wandb.Video(str(path))})
            elif path.suffix == ".png":
                self.runs[run].log({path.stem: self.wandb.Image(str(path))})
            else:  # a file in the run's own directory is uploaded with it (offline: by `wandb sync`)
                shutil.copy(path, Path(self.runs[run].dir) / path.name)

    def finish(self, status: str) -> None:
        for run in self.runs:
            run.finish(exit_code=0 if status == "FINISHED" else 1)
        self.runs = []


class Mlflow:
    """MLflow: one MLflow run per run in the experiment `--track-experiment` (or
    $MLFLOW_EXPERIMENT_NAME), on the server `--track-uri` (or $MLFLOW_TRACKING_URI), through
    MLflow's client; many runs carry the group as the tag `group` under one parent run."""
    name, extra = "mlflow", "mlflow"

    def __init__(self, cfg):
        from mlflow.tracking import MlflowClient
        self.cfg, self.ids = cfg, []
        self.client = MlflowClient(tracking_uri=cfg.track_uri)

    def check(self) -> None:
        # MLflow retries an unreachable server for minutes by default: at the start, one try.
        saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
        os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT=str(CHECK_TIMEOUT_S))
        try:
            self.client.search_experiments(max_results=1)
        except Exception as e:  # MLflow raises several kinds: all mean it cannot be reached
            where = self.client.tracking_uri
            raise ConfigError(f"--track mlflow: the tracking server {where} cannot be reached "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else 'no answer'})") from None
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def start(self, run_dir: Path, params: list[dict], tags: dict, names: list[str], group: str,
              saved: dict | None) -> dict:
        from mlflow.entities import Param
        if saved:
            self.ids = saved["runs"]
            for run_id in self.ids:
                self.client.update_run(run_id, status="RUNNING")
            return saved
        name = self.cfg.track_experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_NAME
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        user = [t for t in (self.cfg.track_tags or "").split(",") if t]
        shared = {**{k: str(v) for k, v in tags.items()}, **{t: "" for t in user}, "group": group,
                  "run_dir": str(run_dir.absolute())}
        for run_params, run_name in zip(params, names):
            run = self.client.create_run(experiment, run_name=run_name, tags=shared)
            items = [Param(k, json.dumps(v) if not isinstance(v, str) else v) for k, v in run_params.items()]
            for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters a call
                self.client.log_batch(run.info.run_id, params=items[i:i + 100])
            self.ids.append(run.info.run_id)
        return {"runs": self.ids, "experiment": experiment, "uri": self.client.tracking_uri}

    @property
    def count(self) -> int:
        return len(self.ids)

    def log(self, run: int, metrics: dict, step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.ids[run], metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def files(self, run: int, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.ids[run], str(path))

    def finish(self, status: str) -> None:
        for run_id in self.ids:
            self.client.set_terminated(run_id, status)


BACKENDS = {"wandb": Wandb, "mlflow": Mlflow}


def connect(cfg) -> "Tracking | None":
    """The run's trackers, each checked at once (before the run directory is written): its
    extra installed, its server reachable, its credentials there. A ConfigError names what
    is wrong, or, with --track-on-failure warn, a warning line and the run goes on without that
    tracker. Only the main process connects; every process raises together."""
    wanted = names(cfg)
    if not wanted:
        return None
    backends, problem = [], None
    if parallel.is_main():
        for name in wanted:
            try:
                if importlib.util.find_spec(name) is None:
                    raise ConfigError(f"--track {name} needs the {name} package: "
                                      f"{INSTALL.format(extra=BACKENDS[name].extra)}")
                backend = BACKENDS[name](cfg)
                backend.check()
                backends.append(backend)
            except ConfigError as e:
                if cfg.track_on_failure != "warn":
                    problem = e
                    break
                print(f"warning: {e}; training without it (--track-on-failure warn)", file=sys.stderr)
    if parallel.any_process(problem is not None):
        raise problem or ConfigError("--track: a tracker cannot be reached (process 0 says which)")
    return Tracking(cfg, backends) if backends or not parallel.is_main() else None


class Tracking:
    """A run's trackers, fed from a thread of their own through a bounded queue."""

    def __init__(self, cfg, backends: list):
        self.cfg, self.backends = cfg, backends
        self.run_dir: Path | None = None
        self.steps: dict[str, int] = {}   # per tracker, the last step it has (a resume sends none before)
        self.unit = "env_steps"
        self.identity: set[str] = set()   # a many-run line's identity keys (parameters, not metrics)
        self.queue: queue.Queue = queue.Queue(QUEUE_ROWS)
        self.dropped = 0
        self.thread: threading.Thread | None = None
        self.warned: set[str] = set()

    def start(self, run_dir: Path, cfg_dict: dict, runs: list[dict] | None, unit: str, tags: dict) -> None:
        """Begins (or, resumed, continues) the tracked runs: one per run of a many-run program,
        with the config (and the run's own seed and swept values) as parameters."""
        if not parallel.is_main():
            return
        self.run_dir, self.unit = run_dir, unit
        saved = self._read_state()
        params = [parameters(cfg_dict)] if runs is None else [{**parameters(cfg_dict), **r} for r in runs]
        self.identity = set(runs[0]) if runs else set()
        group = self.cfg.track_group or run_dir.absolute().name
        run_names = [group] if runs is None else [f"{group}-{i}" for i in range(len(runs))]
        state = {}
        for backend in list(self.backends):
            entry = saved.get(backend.name)
            try:
                state[backend.name] = {**backend.start(run_dir, params, tags, run_names, group, entry),
                                       "step": (entry or {}).get("step", -1)}
            except Exception as e:
                self._failed(backend, e)
        self.steps = {name: s["step"] for name, s in state.items()}
        self._write_state(state)
        self.thread = threading.Thread(target=self._drain, name="trackers", daemon=True)
        self.thread.start()

    def log(self, lines: list[dict]) -> None:
        """A log point's metrics.jsonl lines (one per run of a many-run program), queued."""
        if self.thread is None:
            return
        try:
            self.queue.put_nowait(("log", lines))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                print(f"warning: the trackers are {QUEUE_ROWS} log points behind; log points are dropped for "
                      f"them until they catch up (metrics.jsonl has every one)", file=sys.stderr)

    def finish(self, files: list[Path], status: str = "FINISHED") -> None:
        """The run's end: its files (those that exist) to every tracked run, and each ended."""
        if self.thread is None:
            return
        self.queue.put(("finish", ([f for f in files if f.exists()], status)))
        self.thread.join(FINISH_S)
        if self.thread.is_alive():
            print(f"warning: the trackers did not take the run's end within {FINISH_S:.0f}s; leaving them",
                  file=sys.stderr)
        self.thread = None

    # -- the thread ------------------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            what, payload = self.queue.get()
            if what == "log":
                self._send(payload)
                continue
            files, status = payload
            for backend in list(self.backends):
                try:
                    for run in range(backend.count):
                        backend.files(run, files)
                    backend.finish(status)
                except Exception as e:
                    self._failed(backend, e)
            return

    def _send(self, lines: list[dict]) -> None:
        step = lines[0].get(self.unit, lines[0].get("update"))
        for backend in list(self.backends):
            if step is None or step <= self.steps.get(backend.name, -1):
                continue  # a resume's rows the tracker already has
            try:
                for run, line in enumerate(lines):
                    metrics = {k: v for k, v in line.items()
                               if k != self.unit and k not in self.identity and isinstance(v, (int, float))
                               and not isinstance(v, bool)}
                    backend.log(run, metrics, int(step))
            except Exception as e:
                self._failed(backend, e)
                continue
            self.steps[backend.name] = int(step)
        self._write_steps()

    def _failed(self, backend, error: Exception) -> None:
        if backend in self.backends:
            self.backends.remove(backend)
        print(f"warning: --track {backend.name} failed ({type(error).__name__}: "
              f"{str(error).splitlines()[0][:200] if str(error) else 'no message'}); training goes on without it, "
              f"metrics.jsonl has every row", file=sys.stderr)

    # -- tracking.json ---------------------------------------------------------------------------
    def _read_state(self) -> dict:
        path = self.run_dir / STATE
        try:
            return json.loads(path.read_text()) if path.exists() else {}
        except (OSError, json.JSONDecodeError):
            return {}

    def _write_state(self, state: dict) -> None:
        path = self.run_dir / STATE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(path)
        self._state = state

    def _write_steps(self) -> None:
        state = {name: {**entry, "step": self.steps.get(name, entry.get("step", -1))}
                 for name, entry in self._state.items()}
        self._write_state(state)


def check_tracked(run_dir: Path) -> dict:
    """The tracked runs of a run directory (tracking.json), or a ConfigError: it has none."""
    path = Path(run_dir) / STATE
    try:
        saved = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--track: {path} cannot be read ({e})") from None
    if not saved:
        raise ConfigError(f"--track: the run in {run_dir} is not tracked (it was trained without --track)")
    return saved


def attach(run_dir: Path, cfg, paths: list[Path], run: int = 0) -> None:
    """Files made after a run (`evaluate --video --track`) to the run's tracked run `run`."""
    saved = check_tracked(run_dir)
    tracking = connect(cfg)
    if tracking is None:
        return
    for backend in tracking.backends:
        entry = saved.get(backend.name)
        if entry is None:
            continue
        if isinstance(backend, Mlflow):
            backend.ids = entry["runs"]
            backend.files(run, paths)
        else:
            runs = entry["runs"]
            started = backend.wandb.init(id=runs[run], resume="must", dir=str(run_dir),
                                         project=cfg.track_project or os.environ.get("WANDB_PROJECT") or DEFAULT_NAME,
                                         entity=cfg.track_entity, reinit="create_new",
                                         settings=backend.wandb.Settings(silent=True, console="off"))
            backend.runs = [None] * len(runs)
            backend.runs[run] = started
            backend.files(run, paths)
            started.finish()
