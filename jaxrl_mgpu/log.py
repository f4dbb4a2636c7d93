"""Main-process output: start-up banner, progress, metrics.jsonl and TensorBoard.

Every process builds a `RunLog`; only the main process's writes anything, so callers never
branch on the process index.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from jaxrl_mgpu.parallel import is_main


def _clean(value):
    """JSON and TensorBoard want plain floats; NaN (no episode finished) becomes null."""
    value = float(value) if not isinstance(value, (int, str, type(None))) else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunLog:
    def __init__(self, run_dir: Path | None, total_steps: int, unit: str = "env_steps"):
        self.enabled = is_main()
        self.unit = unit  # the row key progress is counted in
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.tty = sys.stdout.isatty()
        self._jsonl = self._tb = self._bar = None
        if self.enabled and run_dir is not None:
            self._jsonl = open(run_dir / "metrics.jsonl", "a", buffering=1)
            from tensorboardX import SummaryWriter  # imported here: only the main process needs it
            self._tb = SummaryWriter(str(run_dir))

    def print(self, text: str = "") -> None:
        if self.enabled:
            (self._bar.write if self._bar is not None else print)(text)

    def banner(self, rows: dict) -> None:
        width = max(map(len, rows))
        self.print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows.items()))

    def start(self, initial_steps: int = 0) -> None:
        if self.enabled and self.tty:
            from tqdm import tqdm
            self._bar = tqdm(total=self.total_steps, initial=initial_steps, unit="step", unit_scale=True,
                             dynamic_ncols=True, smoothing=0.3)

    def write(self, row: dict) -> None:
        """One log point: a metrics.jsonl line, TensorBoard scalars, and the console."""
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in row.items()}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k not in ("update", self.unit) and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, row[self.unit])
        ret = row.get("episode_return")
        ret_text = "n/a" if ret is None else f"{ret:.1f}"
        if row.get("eval/episode_return") is not None:
            ret_text += f"  eval {row['eval/episode_return']:.1f}"
        if self._bar is not None:
            self._bar.update(row[self.unit] - self._bar.n)
            self._bar.set_postfix_str(f"return {ret_text}  {row['sps']:,.0f} steps/s", refresh=False)
        else:
            progress = (f"update {row['update']:,}/{self.total_steps:,}" if self.unit == "update" else
                        f"update {row['update']}  {self.unit} {row[self.unit]:,}/{self.total_steps:,}")
            print(f"{progress}  "
                  f"return {ret_text}  steps/s {row['sps']:,.0f}  time {row['time']:.0f}s", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        for sink in (self._jsonl, self._tb):
            if sink is not None:
                sink.close()
        self._jsonl = self._tb = None


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
