"""Issue 71's figure: evaluation return against wall time from launch (compile included), ours
(ours.sh's ours.jsonl) and Brax's (brax_anchor.py's anchor.jsonl), one panel per task, from the
JSON lines of one or more device calls. A curve of ours is timed from its training start, so its
time before the first step is added; Brax's is timed from the trainer's launch already.
    python experiments/gpu/wall_time_plot.py OUT.png TASK=FILE.jsonl[#TEXT] [...]
e.g. HumanoidWalk=results/X/ours.jsonl#humanoid HumanoidWalk=results/X/anchor.jsonl: #TEXT keeps
the records whose preset, task or flags hold TEXT (a file of several tasks' runs).
"""

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402


def curves(path: str, text: str = ""):
    """(label, [minutes from launch], [return]) of each record with a curve in `path` whose
    preset, task or flags hold `text`."""
    for line in open(path):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if not r.get("curve") or text.lower() not in " ".join(str(r.get(k, "")) for k in ("preset", "task", "flags")).lower():
            continue
        if r["impl"] == "brax":  # timed from the trainer's launch
            label, offset = f"Brax's {r['algo'].upper()} (seed {r['seed']})", 0.0
        else:  # timed from the training start
            label, offset = f"ours, {r.get('preset', '')} {r['flags'][:60]}", r.get("before_first_step_s") or 0.0
        points = [(t + offset, ret) for _, ret, t in r["curve"] if t is not None]
        yield label, [t / 60 for t, _ in points], [ret for _, ret in points]


def main():
    out, panels = sys.argv[1], defaultdict(list)
    for arg in sys.argv[2:]:
        task, _, path = arg.partition("=")
        path, _, text = path.partition("#")
        panels[task].extend(curves(path, text))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (task, lines) in zip(axes[0], panels.items()):
        for label, minutes, returns in lines:
            ax.plot(minutes, returns, "o-" if label.startswith("Brax") else ".-", label=label, ms=3)
        ax.set(title=task, xlabel="wall time from launch (min)", ylabel="evaluation return (128 episodes)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
