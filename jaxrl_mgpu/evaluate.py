"""`python -m jaxrl_mgpu.evaluate`: a trained run's policy on fresh episodes.

    python -m jaxrl_mgpu.evaluate --run-dir DIR [--step S | --best] --episodes K [--greedy]

loads a checkpoint (the latest by default) of a run written on any number of devices, runs K
episodes spread over the local devices, and prints one JSON line with `mean_return`,
`std_return`, `episodes` and `step`. For a multi-agent game (the Tag envs) it prints one line
per pairing of trained and uniform-random teams (trained taggers against trained runners, each
against a random opponent, and random against random, on the same games): per team the mean
return per agent and mean steps in the game (for runners: survival), tags per episode and
episode length. `--in-context` (Algorithm Distillation runs) is an alias
of `python -m jaxrl_mgpu.incontext`.

A run directory of many runs (--num-seeds, --sweep) is evaluated run by run, each on the same
episodes (the same key), one JSON line per run with its `run`, `seed` and swept values;
`--run i` evaluates run i only.

    python -m jaxrl_mgpu.evaluate --run-dir DIR --video FILE.gif|FILE.mp4 [--video-stride K] [--greedy]

instead writes a video of ONE episode of the policy (the first of the evaluation episodes of
--seed, on one device; a many-run directory: run 0, or --run i) and prints one JSON line with
its length and return. Gymnasium's renderer draws classic control (CartPole, Acrobot, ...),
gymnax's visualizer the other environments it knows (MinAtar, ...); DarkRoom and the Tag games are drawn by the project (Tag: taggers red, runners
blue, a tagged runner grey and crossed); other suites' tasks, and an environment of the
user's with a `render_rgb(state, params)` method, draw themselves. The video has the state
before the first step and after each step, L + 1 frames for L steps; `--video-stride K` keeps
every K-th and the last, ceil(L / K) + 1 frames. It needs the video extra: pip install -e ".[video]".
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import jax
import numpy as np

from jaxrl_mgpu import cli, parallel, tracking
from jaxrl_mgpu.tools import incontext, video
from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.episodes import make_episodes, summarize
from jaxrl_mgpu.runs import load_params, load_run, readable_params  # noqa: F401  (load_params: for callers)


def _args(argv):
    p = cli.Parser(prog="python -m jaxrl_mgpu.evaluate", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="a training run's directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None, help="checkpoint step (update); default: the latest")
    which.add_argument("--best", action="store_true", help="the checkpoint with the best evaluation return")
    p.add_argument("--episodes", type=int, default=None, help="episodes, spread over all devices (default 64)")
    p.add_argument("--greedy", action="store_true", help="act greedily (argmax) instead of sampling")
    p.add_argument("--devices", type=int, default=None, help="use the first k local devices (default: all)")
    p.add_argument("--parallel", default="pmap", choices=parallel.BACKENDS)
    p.add_argument("--seed", type=int, default=1, help="seed of the evaluation episodes")
    p.add_argument("--run", type=int, default=None, help="a run directory of many runs (--num-seeds, --sweep): "
                                                         "evaluate run i only (default: every run; --video: run 0)")
    p.add_argument("--video", default=None, metavar="FILE",
                   help="write one episode of the policy to FILE (.gif, or .mp4 with imageio-ffmpeg) instead of "
                        "evaluating --episodes; needs the video extra: pip install -e \".[video]\"")
    p.add_argument("--video-stride", type=int, default=None, metavar="K",
                   help="--video: draw every K-th state and the last (default 1: every state)")
    p.add_argument("--track", action="store_true",
                   help="--video: also add the video to the run's tracked run (a run trained with --track: "
                        "W&B media, an MLflow artifact)")
    p.add_argument("--in-context", action="store_true",
                   help="--algo ad runs: E consecutive episodes on held-out goals with a rolling context and "
                        "frozen weights: the same as python -m jaxrl_mgpu.incontext (see its --help)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--in-context" in argv:  # an alias of `python -m jaxrl_mgpu.incontext` (AD: its own options and outputs)
        return incontext.main(argv)
    try:
        args = _args(argv)
        check_video_args(args)
        args.episodes = 64 if args.episodes is None else args.episodes
        if args.episodes < 1:
            raise ConfigError(f"--episodes must be at least 1, got {args.episodes}")
        cfg, ckpts = load_run(args.run_dir)
        if args.track:
            tracking.check_tracked(Path(args.run_dir))
        plan = plan_lib.of_config(cfg)
        if plan.spec.evaluated_by == "in-context":
            raise ConfigError(f"--run-dir {args.run_dir} is an --algo ad run: it acts from its context of past "
                              f"episodes, so evaluate it with --in-context")
        env, env_params, runs = plan.env, plan.env_params, plan.runs
        if args.video is not None:
            video.check_env(cfg.env, env)
        par = None if args.video is not None else parallel.setup(args.parallel, args.devices)
        if args.run is not None and not (runs is not None and 0 <= args.run < runs.count):
            raise ConfigError(f"--run {args.run}: the run directory holds " +
                              ("one run (no --num-seeds or --sweep)" if runs is None else f"runs 0..{runs.count - 1}"))
        template = plan.params_shapes()
        if runs is not None:  # every run's params, [runs, ...]
            template = jax.tree.map(lambda x: jax.ShapeDtypeStruct((runs.count,) + x.shape, x.dtype), template)
        step, params = readable_params(ckpts, args.run_dir, template, args.step, args.best)
        ckpts.close()
    except cli.USER_ERRORS as e:
        cli.fail(e)

    if args.video is not None:
        try:
            record_video(plan, params, step, args)
        except cli.USER_ERRORS as e:
            cli.fail(e)
        return 0
    if runs is not None:
        evaluate_runs(plan, params, step, par, args)
        return 0
    policy = plan.policy()
    params, key = par.replicate(params), par.replicate(np.asarray(jax.random.PRNGKey(args.seed)))
    evaluation = plan.evaluation()
    if evaluation is not None:  # its own episodes (a game's teams)
        # Every pairing of trained and uniform-random sides, on the same games (the same key).
        for random_sides in itertools.product(*[((), (name,)) for name in evaluation.sides]):
            random_sides = sum(random_sides, ())
            episodes, summarize_sums = evaluation.episodes(args.episodes, par.num_devices, args.greedy, random_sides)
            result = summarize_sums(par.first(par.map(episodes)(params, key)))
            sides = {name: "random" if name in random_sides else "trained" for name in evaluation.sides}
            print(json.dumps({**sides, **result, "step": step, "greedy": args.greedy}), flush=True)
        return 0
    run = par.map(make_episodes(policy, env, env_params, args.episodes, par.num_devices, args.greedy))
    totals = run(params, key)
    print(json.dumps({**summarize(par.first(totals)), "step": step, "greedy": args.greedy}))
    return 0


def check_video_args(args) -> None:
    """--video's options, before anything is loaded: a new .gif or .mp4 in a writable place, no
    option that only the evaluation of many episodes reads."""
    if args.video is None:
        for option, given in (("--video-stride", args.video_stride is not None), ("--track", args.track)):
            if given:
                raise ConfigError(f"{option} applies only with --video")
        return
    # --episodes 1 says what --video does anyway
    for option, value, why in (("--episodes", None if args.episodes == 1 else args.episodes, "records one episode"),
                               ("--devices", args.devices, "records one episode on one device")):
        if value is not None:
            raise ConfigError(f"{option} {value}: --video {why}; leave {option} out")
    args.video_stride = 1 if args.video_stride is None else args.video_stride
    if args.video_stride < 1:
        raise ConfigError(f"--video-stride must be at least 1, got {args.video_stride}")
    video.check_output(args.video)
    video.headless()


def record_video(plan, params, step: int, args) -> None:
    """One episode of the checkpoint's policy (of run `--run`, default 0, in a many-run
    directory: `params` holds every run's), drawn into `--video`; one JSON line says what it
    shows."""
    cfg, runs, env, env_params, which = plan.cfg, plan.runs, plan.env, plan.env_params, {}
    if runs is not None:
        run = 0 if args.run is None else args.run
        cfg, which = dataclasses.replace(cfg, **runs.hparams(run)), runs.describe(run)
        params = jax.tree.map(lambda x: x[run], params)
    episode = video.record(plan.policy(cfg), env, env_params, params, jax.random.PRNGKey(args.seed), args.greedy,
                           args.video_stride, plan.evaluation())
    frames, fps = video.frames(cfg.env, env, env_params, episode)
    video.write(args.video, frames, fps)
    if args.track:
        tracking.attach(Path(args.run_dir), plan.cfg, [Path(args.video)], 0 if args.run is None else args.run)
    print(json.dumps({**which, "video": args.video, "frames": len(frames), "stride": args.video_stride,
                      **video.summary(env, episode), "step": step, "greedy": args.greedy}), flush=True)


def evaluate_runs(plan, params, step: int, par, args) -> None:
    """Every run of a many-run directory (or `--run`), one JSON line each, on the same episodes;
    `params`: every run's, [runs, ...]."""
    cfg, runs, env, env_params = plan.cfg, plan.runs, plan.env, plan.env_params
    key = par.replicate(np.asarray(jax.random.PRNGKey(args.seed)))
    episodes = {}  # per configuration: its swept values may shape the policy (DQN's --eps-end)
    for i in range(runs.count) if args.run is None else (args.run,):
        config = runs.config_index(i)
        if config not in episodes:
            run_cfg = dataclasses.replace(cfg, **runs.hparams(i))
            episodes[config] = par.map(make_episodes(plan.policy(run_cfg), env, env_params, args.episodes, par.num_devices,
                                                     args.greedy))
        totals = episodes[config](par.replicate(jax.tree.map(lambda x: x[i], params)), key)
        print(json.dumps({**runs.describe(i), **summarize(par.first(totals)), "step": step, "greedy": args.greedy}),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
