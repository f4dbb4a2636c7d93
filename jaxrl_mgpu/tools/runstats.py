"""What many runs (--num-seeds, --sweep) add up to, per configuration across its seeds, in the
conventions of rliable (Agarwal et al., 2021, "Deep RL at the edge of the statistical
precipice"): the mean and the interquartile mean (IQM: the mean of the middle 50% of runs) of
the final return, each with a 95% percentile-bootstrap confidence interval, the fraction of
seeds whose final return is above --target-return, and a PNG of the learning curves (mean
across seeds, with a 95% bootstrap band).

A run's final return is its `episode_return` in the last row of metrics.jsonl that has one (the
mean return of the episodes that ended in the run's last logged chunk); a run that diverged
(a non-finite loss or parameter: multirun.py stops its learning alone, and its rows say
`diverged_at`) is summarised by the returns its last finite parameters reach, and listed.
Everything is read back from metrics.jsonl, so a resumed run is summarised over all of its
rows, and the module works on any run directory of many runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

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


def write(run_dir: Path, swept: tuple[str, ...], unit: str, target: float | None = None) -> list[dict]:
    """runs_summary.json and learning_curves.png in `run_dir`, from its metrics.jsonl; returns
    the summary (one entry per configuration)."""
    rows = [r for r in read_rows(run_dir / "metrics.jsonl") if "run" in r]
    summary = summarize(rows, swept, target)
    (run_dir / "runs_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(rows, swept, unit, run_dir / "learning_curves.png", target)
    return summary


def lines(summary: list[dict], swept: tuple[str, ...]) -> list[str]:
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
