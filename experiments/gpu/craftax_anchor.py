"""The Craftax anchor of issue 50: the Craftax paper's PPO (MichaelTMatthews/Craftax_Baselines,
`ppo.py` with its own defaults: 1,024 environments x 64 steps, optimistic resets) on
Craftax-Classic-Symbolic-v1, timed; one JSON line on stdout.

`ppo.py` logs through wandb (`--use_wandb`, its default): a stand-in `wandb` module here keeps
what it logs, with the time, so its learning curve and its own steps/s come back without wandb
or a network. Its code is run as it is (`runpy`, as `python ppo.py ...`); `--no-log` passes its
own `--no-use_wandb` (no per-update host callback: throughput alone, no curve). It is not part
of jaxrl_mgpu: `fetch` the repository and copy its files into a git-ignored folder that the
device call carries, e.g.

    git -C /work/.mirror/MichaelTMatthews+Craftax_Baselines/repo archive HEAD | tar -x -C .anchors/craftax_baselines
    python experiments/gpu/craftax_anchor.py --baselines .anchors/craftax_baselines --timesteps 1e9

Needs craftax, distrax (with tfp-nightly) and gymnax where it runs.
"""

import argparse
import json
import runpy
import statistics
import sys
import tempfile
import time
import types

import numpy as np


class LogKeeper(types.ModuleType):
    """`wandb` as ppo.py uses it: `init`, `log` (one dict per update) and `run.dir`."""

    def __init__(self, every: int):
        super().__init__("wandb")
        self.rows, self.every, self.started = [], every, time.perf_counter()
        self.run = types.SimpleNamespace(dir=tempfile.mkdtemp(prefix="craftax-anchor-"))

    def init(self, **_):
        return self.run

    def log(self, row: dict):
        row = {k: float(np.mean(v)) for k, v in row.items()}
        row["time"] = time.perf_counter() - self.started
        self.rows.append(row)
        if len(self.rows) % self.every == 1:  # to stderr as it comes: a run cut off still leaves its curve
            print(json.dumps({"update": len(self.rows), **row}), file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--baselines", required=True, help="a copy of MichaelTMatthews/Craftax_Baselines")
    p.add_argument("--env", default="Craftax-Classic-Symbolic-v1")
    p.add_argument("--timesteps", default="1e9")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-log", action="store_true", help="ppo.py's --no-use_wandb: no curve, no per-update callback")
    p.add_argument("--every", type=int, default=100, help="keep every N-th update's row in the curve")
    args = p.parse_args()

    keeper = LogKeeper(args.every)
    sys.modules["wandb"] = keeper
    sys.path.insert(0, args.baselines)
    sys.argv = ["ppo.py", "--env_name", args.env, "--total_timesteps", args.timesteps, "--seed", str(args.seed)] + (
        ["--no-use_wandb"] if args.no_log else [])
    started = time.perf_counter()
    runpy.run_path(f"{args.baselines}/ppo.py", run_name="__main__")
    total = time.perf_counter() - started
    rows = keeper.rows
    steps_per_update = 1024 * 64  # ppo.py's defaults: --num_envs 1024, --num_steps 64
    record = {"impl": "craftax_baselines", "env": args.env, "seed": args.seed, "logged": not args.no_log,
              "env_steps": int(float(args.timesteps)) // steps_per_update * steps_per_update,
              "wall_s": round(total, 1)}
    if rows:
        achievements = {k: v for k, v in rows[-1].items() if k.lower().startswith("achievements/")}
        record.update({
            "final_train_return": rows[-1].get("episode_return"),
            "final_achievements": achievements,
            # its own per-update rate (the time between two logged updates), the median: compile excluded
            "steady_env_steps_per_s": round(statistics.median(r["sps"] for r in rows if "sps" in r)) if len(rows) > 2
            else None,
            "before_first_update_s": round(rows[0]["time"], 1),
            "curve": [((i + 1) * steps_per_update, r.get("episode_return"), round(r["time"], 1))
                      for i, r in enumerate(rows) if i % args.every == args.every - 1 or i == len(rows) - 1]})
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
