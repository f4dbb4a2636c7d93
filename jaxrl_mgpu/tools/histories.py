"""`python -m jaxrl_mgpu.histories`: learning histories of a source RL algorithm, for Algorithm
Distillation (Laskin et al. 2022), written as an RLDS dataset.

The source is AD's tabular Q-learner (algos/ad/histories.py), exploring with a UCB bonus
(`--algo ucb`) or epsilon-greedy (`--algo q`): one learner per task (goal cell) for `--steps`
environment steps, over all local devices. Each task's whole history (steps / episode_len
consecutive episodes) is written by `jaxrl_mgpu.data.rlds` as RLDS episodes to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxrl_mgpu import parallel
from jaxrl_mgpu.algos.ad.histories import LearnerConfig, darkroom_env, episode_returns, run, source_metadata
from jaxrl_mgpu.algos.ad.options import SOURCE_ALGOS as ALGOS
from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.envs import EnvError, darkroom
from jaxrl_mgpu.parallel import ParallelError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise EnvError(message)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="python -m jaxrl_mgpu.histories", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="DarkRoom", help=f"one of {', '.join(darkroom.ROOMS)}")
    p.add_argument("--tasks", type=int, required=True, help="learning histories (tasks), global")
    p.add_argument("--steps", type=int, required=True,
                   help="environment steps per task (a multiple of the episode length)")
    p.add_argument("--out", required=True, help="dataset directory to create (absent or empty)")
    p.add_argument("--seed", type=int, default=0, help="seed of the goal split, the task draw and the learners")
    p.add_argument("--split", choices=darkroom.SPLITS, default="train", help="goals to draw the tasks from")
    p.add_argument("--algo", choices=ALGOS, default="ucb", help="exploration of the Q-learning source")
    return p.parse_args(argv)


def check(args: argparse.Namespace) -> tuple[Any, np.ndarray]:
    """The env and the tasks' goals, or an error naming the bad option. Creates nothing."""
    env, _ = darkroom_env(args.env)
    if args.tasks < 1:
        raise EnvError(f"--tasks {args.tasks} must be at least 1")
    if args.steps < 1 or args.steps % env.episode_len:
        raise EnvError(f"--steps {args.steps} must be a positive multiple of the {args.env} episode length "
                       f"{env.episode_len}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EnvError(f"--out {out} already exists and is not empty; choose a new directory")
    if jax.process_count() > 1:
        raise ParallelError("histories runs in one process (it writes one dataset); use one host")
    # Tasks cycle through a seeded permutation of the split's goals: N <= split size gives
    # distinct goals, more repeat them (each repeat is its own learner, with its own key).
    pool = darkroom.goals(args.env, args.split, args.seed)
    return env, pool[np.resize(np.random.default_rng(args.seed).permutation(len(pool)), args.tasks)]


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
        env, goals = check(args)
        par = parallel.setup()
    except (EnvError, ParallelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = LearnerConfig(algo=args.algo)
    histories = run(args.env, goals, args.steps, args.seed, source, par)
    metadata = source_metadata(args.env, source, args.tasks, args.steps, args.seed, args.split)
    rlds.write(args.out, dataclasses.replace(histories, metadata=metadata))
    returns = episode_returns(histories, env.episode_len).mean(0)
    print(f"wrote {args.tasks} learning histories x {args.steps} steps ({len(returns)} episodes of "
          f"{env.episode_len}) of tabular-q-{args.algo} on {args.env} to {args.out}; mean source return "
          f"first episode {returns[0]:.2f}, last episode {returns[-1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
