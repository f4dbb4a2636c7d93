"""Main-process output: start-up banner, progress, metrics.jsonl, TensorBoard, the run summary,
and what many runs add up to.

Every process builds a `RunLog`; only the main process's writes anything, so callers never
branch on the process index.

Many runs (--num-seeds, --sweep; the second half of this module) are summarised per
configuration across its seeds in the conventions of rliable (Agarwal et al., 2021, "Deep RL at
the edge of the statistical precipice"): the mean and the interquartile mean (IQM: the mean of
the middle 50% of runs) of the final return, each with a 95% percentile-bootstrap confidence
interval, the fraction of seeds whose final return is above --target-return, and a PNG of the
learning curves (mean across seeds, with a 95% bootstrap band). A run's final return is its
`episode_return` in the last row of metrics.jsonl that has one; a run that diverged (a
non-finite loss or parameter: multirun.py stops its learning alone, and its rows say
`diverged_at`) is summarised by the returns its last finite parameters reach, and listed.
Everything is read back from metrics.jsonl, so a resumed run is summarised over all of its
rows.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from jaxrl_mgpu.parallel import is_main

# How often a long wait (a compile, a slow first chunk) says it is still working.
HEARTBEAT_S = 30.0


def _clean(value):
    """JSON and TensorBoard want plain floats; NaN (no episode finished) becomes null."""
    value = float(value) if not isinstance(value, (int, str, type(None))) else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunLog:
    def __init__(self, run_dir: Path | None, total_steps: int, unit: str = "env_steps", episodic: bool = True,
                 runs: list[dict] | None = None, console: tuple = (), rate: str | None = None):
        self.enabled = is_main()
        # Many runs (multirun.py): what identifies each (index, seed, swept values). A row then
        # carries each run's metrics under "runs": metrics.jsonl gets one line per run, each
        # run its own TensorBoard run (runs/<name>), the console and the top-level TensorBoard
        # run the means over runs.
        self.runs = runs
        self.unit = unit  # the row key progress is counted in
        self.rate = rate or unit.replace("env_", "")  # what a row's "sps" counts, per second
        self.episodic = episodic  # False: the rows carry no episode returns (AD's training)
        self.console = console  # what the progress line shows of a row, where it has it: (label, key, format)
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.tty = sys.stdout.isatty()
        self.last: dict = {}
        self.best: dict = {}  # the best episode_return and eval/episode_return logged, with their step
        self.latest_return: float | None = None  # the last episode_return logged (a row may have none)
        self.timeline: dict = {}  # start-up phases in seconds (the summary reports them)
        self._jsonl = self._tb = self._bar = None
        self.track: Callable[[list[dict]], None] | None = None  # the run's trackers take each point's lines (tracking.py)
        self._activity: tuple[str, float, float] | None = None  # (what, started, last said)
        self._lock = threading.Lock()
        self._last_said: dict[str, float] = {}
        if self.enabled and run_dir is not None:
            self._jsonl = open(run_dir / "metrics.jsonl", "a", buffering=1)
            # TensorBoard's writer takes a second or more to import and open on some machines:
            # it is made on a thread, while the run compiles, and waited for at the first row.
            self._tb = concurrent.futures.ThreadPoolExecutor(1).submit(_tensorboard_writers, run_dir, runs or [])
        if self.enabled:
            threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True).start()

    def print(self, text: str = "") -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def banner(self, rows: dict) -> None:
        width = max(map(len, rows))
        self.print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows.items()))

    def start(self, initial_steps: int = 0) -> None:
        if self.enabled and self.tty:
            from tqdm import tqdm
            self._bar = tqdm(total=self.total_steps, initial=initial_steps, unit="step", unit_scale=True,
                             dynamic_ncols=True, smoothing=0.3)

    @contextlib.contextmanager
    def waiting(self, what: str):
        """Says every HEARTBEAT_S seconds that `what` is still under way, if it takes that long,
        so a slow compile or first chunk is not mistaken for a hang."""
        now = time.monotonic()
        with self._lock:
            self._activity = (what, now, now)
        try:
            yield
        finally:
            with self._lock:
                self._activity = None

    def due(self, what: str, seconds: float) -> bool:
        """True at the first call for `what` and then at most once every `seconds`: for lines
        a loop prints per interval rather than per iteration."""
        now = time.monotonic()
        if now - self._last_said.get(what, -math.inf) < seconds:
            return False
        self._last_said[what] = now
        return True

    def _heartbeat(self) -> None:
        while True:
            time.sleep(1.0)
            with self._lock:
                if self._activity is None:
                    continue
                what, started, said = self._activity
                now = time.monotonic()
                if now - said < HEARTBEAT_S:
                    continue
                self._activity = (what, started, now)
            self.print(f"  ... {what}: {now - started:.0f}s so far")

    def write(self, row: dict) -> None:
        """One log point: a metrics.jsonl line, TensorBoard scalars, and the console."""
        if not self.enabled:
            return
        per_run = row.get("runs")
        row = {k: _clean(v) for k, v in row.items() if k != "runs"}
        lines = [row] if per_run is None else [self._run_row(row, i, r) for i, r in enumerate(per_run)]
        self.last = row
        if row.get("episode_return") is not None:
            self.latest_return = row["episode_return"]
        for key in ("episode_return", "eval/episode_return"):
            if row.get(key) is not None and row[key] > self.best.get(key, (-math.inf,))[0]:
                self.best[key] = (row[key], row[self.unit])
        if self._jsonl is not None:
            self._jsonl.write("".join(json.dumps(line) + "\n" for line in lines))
        if self.track is not None:
            self.track(lines)
        if self._tb is not None:
            writers = self._tb.result()
            self._scalars(writers[0], row, ())
            if per_run is not None:
                for tb, line, identity in zip(writers[1:], lines, self.runs):
                    self._scalars(tb, line, identity)
        parts = []
        if self.episodic:
            ret = row.get("episode_return")
            gone = 0 if per_run is None else sum("diverged_at" in r for r in per_run)
            parts.append("return " + ("n/a (no episode ended)" if ret is None else f"{ret:.1f}")
                         + ("" if per_run is None else f" (mean of {len(per_run) - gone} runs"
                            + (f"; {gone} diverged)" if gone else ")")))
        if row.get("eval/episode_return") is not None:
            parts.append(f"eval {row['eval/episode_return']:.1f}")
        parts += [f"{label} {row[key]:{fmt}}" for label, key, fmt in self.console if row.get(key) is not None]
        rate = f"{row['sps']:,.0f} {self.rate}/s" if row.get("sps") is not None else ""
        if row.get("agent_sps") is not None:
            rate += f" ({row['agent_sps']:,.0f} agent steps/s)"
        if self._bar is not None:
            self._bar.update(row[self.unit] - self._bar.n)
            self._bar.set_postfix_str("  ".join(parts + [rate]), refresh=False)
        else:
            progress = (f"update {row['update']:,}/{self.total_steps:,}" if self.unit == "update" else
                        f"update {row['update']}  {self.unit} {row[self.unit]:,}/{self.total_steps:,}")
            print("  ".join([progress] + parts + [rate, f"time {row['time']:.0f}s"]), flush=True)

    def _run_row(self, row: dict, run: int, metrics: dict) -> dict:
        """Run `run`'s metrics.jsonl line: the row's progress and timing, the run's identity and
        its own metrics."""
        shared = {k: row[k] for k in ("update", self.unit) if k in row}
        timing = {k: row[k] for k in ("sps", "agent_sps", "time") if k in row}
        return {**shared, **self.runs[run], **{k: _clean(v) for k, v in metrics.items()}, **timing}

    def _scalars(self, tb, row: dict, skip) -> None:
        """The row's numbers as ONE TensorBoard event (a Summary of many values, as TensorFlow's
        merged summaries are): an event per scalar made 2,800 events per log point of 256 runs."""
        from tensorboardX.proto.summary_pb2 import Summary  # loaded with the writers
        values = [Summary.Value(tag=k, simple_value=v) for k, v in row.items()
                  if k not in ("update", self.unit, "diverged_at") and k not in skip
                  and isinstance(v, (int, float))]
        tb.add_summary(Summary(value=values), row[self.unit])

    def summary(self, values: dict) -> None:
        """The run's end: `summary.json` in the run directory, and the same in a few lines."""
        if not self.enabled:
            return
        if self.run_dir is not None:
            path = self.run_dir / "summary.json"
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({k: _clean(v) if not isinstance(v, (dict, list)) else v
                                       for k, v in values.items()}, indent=2) + "\n")
            tmp.replace(path)
        width = max(map(len, values))
        self.print("summary:\n" + "\n".join(f"  {k:<{width}}  {_text(v)}" for k, v in values.items()))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        for sink in [self._jsonl] + ([] if self._tb is None else self._tb.result()):
            if sink is not None:
                sink.close()
        self._jsonl = self._tb = None


def _tensorboard_writers(run_dir: Path, runs: list[dict]) -> list:
    """The run directory's TensorBoard writer, then one per run in runs/<name> (many runs)."""
    return [_tensorboard_writer(run_dir)] + [_tensorboard_writer(run_dir / "runs" / run_name(r)) for r in runs]


def run_name(identity: dict) -> str:
    """A run's directory name from its identity, e.g. run03-seed3-lr=0.001."""
    return f"run{identity['run']:02d}-seed{identity['seed']}" + "".join(
        f"-{k}={v:g}" for k, v in identity.items() if k not in ("run", "seed"))


# Events a TensorBoard writer queues for its thread. tensorboardX's default (10) blocks the
# training loop on the writer's thread whenever more events than that come at once: with many
# runs (one writer each) a log point could take longer than the chunk it logged.
MAX_QUEUED_EVENTS = 1024


def _tensorboard_writer(run_dir: Path):
    # tensorboardX imports PyTorch, where it is installed, only to recognise its tensors: seconds
    # of start-up for rows of plain floats. Unless PyTorch is loaded already, it is hidden while
    # tensorboardX loads.
    hide_torch = "torch" not in sys.modules
    if hide_torch:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects
    try:
        from tensorboardX import FileWriter  # only the main process needs it
    finally:
        if hide_torch:
            del sys.modules["torch"]
    return FileWriter(str(run_dir), max_queue=MAX_QUEUED_EVENTS)


def _text(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_text(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:,.2f}" if math.isfinite(value) else "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    return "n/a" if value is None else str(value)


def truncate_metrics(path: Path, update: int) -> None:
    """Keeps only the rows up to `update` (atomically: a temporary file, then a rename), so a
    resumed run does not log the same updates twice."""
    if not path.exists():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["update"] <= update]
    if len(kept) != len(rows):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)


# -- many runs: what they add up to, per configuration across its seeds ----------------------

BOOTSTRAP_SAMPLES = 2000
LEVEL = 0.95
IDENTITY = ("run", "seed")  # besides the swept options: what a run's rows carry that is not a metric


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean along `axis`: the mean of the sorted values with the lowest and the
    highest quarter (rounded down, as scipy.stats.trim_mean(x, 0.25)) left out."""
    x = np.sort(x, axis=axis)
    n = x.shape[axis]
    cut = int(0.25 * n)
    return np.take(x, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def bootstrap_ci(x: np.ndarray, statistic, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of `statistic` (vectorised: `statistic(x, axis=-1)`)
    of the values `x`, from `samples` resamples with replacement (a fixed seed: the same
    numbers every time)."""
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return float("nan"), float("nan")
    resampled = x[np.random.default_rng(seed).integers(0, len(x), (samples, len(x)))]
    values = statistic(resampled, axis=-1)
    tail = (1 - LEVEL) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def configurations(rows: list[dict], swept: tuple[str, ...]) -> dict[tuple, dict[int, list[dict]]]:
    """Rows grouped {configuration (swept values): {run: its rows in order}}."""
    out: dict[tuple, dict[int, list[dict]]] = {}
    for row in rows:
        config = tuple(row.get(name) for name in swept)
        out.setdefault(config, {}).setdefault(row["run"], []).append(row)
    return out


def final_return(rows: list[dict], key: str = "episode_return") -> float:
    """The last logged value of `key` (NaN if no row has one)."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(values[-1]) if values else float("nan")


def diverged_runs(rows: list[dict]) -> dict[int, int]:
    """{run: the update where it went non-finite} of the runs whose rows say so."""
    out: dict[int, int] = {}
    for r in rows:
        if r.get("diverged_at") is not None:
            out[r["run"]] = min(r["diverged_at"], out.get(r["run"], r["diverged_at"]))
    return out


def summarize(rows: list[dict], swept: tuple[str, ...], target: float | None = None) -> list[dict]:
    """Per configuration: its swept values, seeds, and the statistics of the final returns."""
    out = []
    for config, runs in configurations(rows, swept).items():
        finals = np.array([final_return(r) for r in runs.values()])
        known = finals[~np.isnan(finals)]
        entry = {**dict(zip(swept, config)), "seeds": len(finals), "runs": sorted(runs),
                 "final_return_mean": _num(known.mean()) if len(known) else None,
                 "final_return_mean_ci95": [_num(v) for v in bootstrap_ci(known, np.mean)],
                 "final_return_iqm": _num(iqm(known)) if len(known) else None,
                 "final_return_iqm_ci95": [_num(v) for v in bootstrap_ci(known, iqm)],
                 "final_returns": [_num(v) for v in finals]}
        diverged = diverged_runs([r for rs in runs.values() for r in rs])
        if diverged:
            entry["diverged"] = {str(run): update for run, update in sorted(diverged.items())}  # run: update
        if target is not None:
            # A run without a final return (no episode ended) is not above the target.
            entry["fraction_above_target"] = float(np.mean(np.nan_to_num(finals, nan=-np.inf) > target))
            entry["target_return"] = target
        out.append(entry)
    return out


def curves(rows: list[dict], swept: tuple[str, ...], unit: str) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per configuration: the x values (`unit`) and the [seeds, points] returns (NaN where a run
    logged none)."""
    out = {}
    for config, runs in configurations(rows, swept).items():
        xs = np.array(sorted({r[unit] for rs in runs.values() for r in rs}))
        index = {x: i for i, x in enumerate(xs)}
        returns = np.full((len(runs), len(xs)), np.nan)
        for j, rs in enumerate(runs.values()):
            for r in rs:
                if r.get("episode_return") is not None:
                    returns[j, index[r[unit]]] = r["episode_return"]
        out[config] = (xs, returns)
    return out


def plot(rows: list[dict], swept: tuple[str, ...], unit: str, path: Path, target: float | None = None) -> None:
    """Learning curves: per configuration the mean return across seeds and its 95% bootstrap
    band (over the seeds that logged a return at that point)."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for config, (xs, returns) in curves(rows, swept, unit).items():
        mean, low, high = (np.full(len(xs), np.nan) for _ in range(3))
        for i in range(len(xs)):
            known = returns[:, i][~np.isnan(returns[:, i])]
            if len(known):
                mean[i] = known.mean()
                low[i], high[i] = bootstrap_ci(known, np.mean, samples=500, seed=i)
        label = ", ".join(f"{k}={v:g}" for k, v in zip(swept, config)) or "all runs"
        line, = ax.plot(xs, mean, label=f"{label} ({returns.shape[0]} seeds)")
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel(unit.replace("_", " "))
    ax.set_ylabel("episode return")
    ax.set_title("mean across seeds, 95% bootstrap CI")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_runs_summary(run_dir: Path, swept: tuple[str, ...], unit: str, target: float | None = None) -> list[dict]:
    """runs_summary.json and learning_curves.png in `run_dir`, from its metrics.jsonl; returns
    the summary (one entry per configuration)."""
    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if "run" in r]
    summary = summarize(rows, swept, target)
    (run_dir / "runs_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(rows, swept, unit, run_dir / "learning_curves.png", target)
    return summary


def runs_summary_lines(summary: list[dict], swept: tuple[str, ...]) -> list[str]:
    """The summary as console lines, one per configuration."""
    out = []
    for entry in summary:
        name = ", ".join(f"{k}={entry[k]:g}" for k in swept) or "all runs"
        text = (f"{name}: {entry['seeds']} seeds, final return mean {_fmt(entry['final_return_mean'])} "
                f"[{_fmt(entry['final_return_mean_ci95'][0])}, {_fmt(entry['final_return_mean_ci95'][1])}], "
                f"IQM {_fmt(entry['final_return_iqm'])} "
                f"[{_fmt(entry['final_return_iqm_ci95'][0])}, {_fmt(entry['final_return_iqm_ci95'][1])}]")
        if "fraction_above_target" in entry:
            text += f", {entry['fraction_above_target']:.0%} above {entry['target_return']:g}"
        if "diverged" in entry:
            text += (f"; {len(entry['diverged'])} diverged (" + ", ".join(
                f"run {run} at update {update}" for run, update in entry["diverged"].items()) + ")")
        out.append(text)
    return out


def _num(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"
