"""In-context evaluation of Algorithm Distillation, and the AD input-pipeline throughput.

    python -m jaxrl_mgpu.incontext --run-dir DIR --episodes E [--goals test|train]
                                  [--envs-per-goal N] [--step S] [--seed K] [--greedy]

loads an `--algo ad` checkpoint (the latest by default) and lets the model play E consecutive
episodes on every goal of a split of the run's Dark Room, `N` environments per goal, spread
over all devices, with NO weight updates: the model's only memory is its rolling context (the
transformer's KV cache of the last n_transit steps, across episodes), and actions are sampled
from its predicted distribution. The goal split is the one the source's learning histories
were drawn with (its seed is read from the dataset's metadata), so `--goals test` (default)
are goals AD never saw; `--greedy` takes the most likely action instead of sampling. It writes
`incontext-<goals>[-greedy].json` (every environment's per-episode returns, their mean per
episode, a uniform-random baseline on the same goals, the source's learning curve from the
dataset, and the source's curve on the evaluation goals, run afresh: tabular, so cheap) and `incontext-<goals>[-greedy].png` into the run directory, and prints
one JSON line: the mean return of each in-context episode, and the source's first and final
episode returns for reference, in the dataset and on the same goals.

    python -m jaxrl_mgpu.incontext --throughput --dataset DIR [training flags, e.g. --config darkroom-ad]

prints one JSON line comparing the host-side reader (`data.read` of this process's tasks, what
a host input pipeline could deliver) with what the compiled AD update consumes (windows/s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import chunks, cli, parallel
from jaxrl_mgpu.algos.ad import histories
from jaxrl_mgpu.algos.ad import asynchronous as async_ad
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu.algos.ad import ad
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.data import rlds
from jaxrl_mgpu.envs import darkroom, vec
from jaxrl_mgpu.nets import actor_critic
from jaxrl_mgpu.parallel import AXIS, global_indices
from jaxrl_mgpu.runs import load_run, readable_params


def make_incontext(policy, env, goals: np.ndarray, envs_per_goal: int, episodes: int, num_devices: int,
                   uniform: bool = False, greedy: bool = False):
    """A per-device function `(params, key) -> returns [envs, episodes]` of `episodes`
    consecutive episodes of every environment, on EVERY device (each device fills its own rows,
    then a psum), environment i playing goal `i // envs_per_goal`. The policy's memory is never
    reset, so it carries its context across the episodes. `uniform`: random actions instead;
    `greedy`: the model's most likely action instead of a sample."""
    total = len(goals) * envs_per_goal
    per_device = -(-total // num_devices)
    # Padding environments (past `total`) replay the last goal; the caller drops their rows.
    cells = np.repeat(goals, envs_per_goal, axis=0)[np.minimum(np.arange(per_device * num_devices), total - 1)]
    episode_len = int(env.default_params.max_steps_in_episode)  # Dark Rooms only truncate: fixed length

    def run(params, key):
        ids = global_indices(per_device)
        env_params = env.params_for(jnp.asarray(cells)[ids])  # one goal per environment
        obs, state = jax.vmap(env.reset)(vec.env_keys(key, ids), env_params)

        def step(carry, t):
            obs, state, memory = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t + 1), ids))
            if uniform:
                logits = jnp.zeros((per_device, env.num_actions))
            else:
                logits, _, _, memory = policy.act(params, memory, obs, obs)
            action = actor_critic.sample(logits, keys[:, 0], greedy and not uniform)
            obs, state, reward, terminated, truncated, _ = jax.vmap(env.step)(keys[:, 1], state, action, env_params)
            memory = policy.remember(memory, action, reward, jnp.logical_or(terminated, truncated))
            return (obs, state, memory), reward

        start = (obs, state, policy.init_memory(per_device))
        _, reward = jax.lax.scan(step, start, jnp.arange(episodes * episode_len))
        returns = reward.reshape(episodes, episode_len, per_device).sum(1).T  # [per_device, episodes]
        return jax.lax.psum(jnp.zeros((per_device * num_devices, episodes)).at[ids].set(returns), AXIS)

    return run


SOURCE_CURVE_TASKS = 256  # learning histories read for the source's curve (the first ones)


def source_curve(h: rlds.Histories) -> np.ndarray:
    """Mean return over tasks of each episode of the learning histories (cut to the task with
    the fewest episodes)."""
    per_task = [np.add.reduceat(r, np.flatnonzero(np.concatenate([[True], d[:-1]]))) for r, d in zip(h.reward, h.done)]
    n = min(map(len, per_task))
    return np.mean([p[:n] for p in per_task], axis=0)


def source_histories(cfg, run_dir: str) -> tuple[dict, rlds.Histories, str]:
    """The learning histories a run distilled, their metadata and where they are: `--dataset`,
    or for an asynchronous run (`--mode learn`) the histories now in its store."""
    if cfg.mode == "learn":
        meta, h = async_ad.store_histories(cfg, run_dir)
        return meta, h, str(Path(run_dir) / "store")
    meta = ad.open_dataset(cfg)
    # The source's mean learning curve is well estimated from a few hundred tasks; reading all
    # of a large dataset only for it would make evaluation slow.
    tasks = range(min(meta["num_tasks"], SOURCE_CURVE_TASKS))
    return meta, rlds.read(cfg.dataset, env=cfg.env, tasks=tasks), str(cfg.dataset)


def source_on_goals(env_name: str, meta: dict, goals: np.ndarray, envs_per_goal: int, seed: int,
                    par: parallel.Parallel) -> np.ndarray:
    """The source algorithm's mean learning curve [episodes] on `goals` (`envs_per_goal`
    learners each), with the config and length the dataset's metadata records. Tabular, so
    cheap: this is the same-goals baseline, which the dataset (other goals) cannot give."""
    cfg = histories.LearnerConfig(**meta["algo_config"])
    h = histories.run(env_name, np.repeat(goals, envs_per_goal, axis=0), meta["steps"], seed, cfg, par)
    return histories.episode_returns(h, meta["episode_len"]).mean(0)


def plot(path: Path, result: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    ad, random = np.asarray(result["mean_return"]), np.asarray(result["random_return"])
    src, stride = np.asarray(result["source"]["mean_return"]), result["source"]["episode_stride"]
    x = np.arange(1, len(ad) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    sem = np.asarray(result["std_return"]) / np.sqrt(result["envs"])
    left.plot(x, ad, "o-", color="C0", label=f"AD in context ({result['goals']} goals, frozen weights)")
    left.fill_between(x, ad - sem, ad + sem, color="C0", alpha=0.2)
    where = f"{result['source']['goals']} goals, from the dataset"
    left.plot(x[:len(src)], src[:len(ad)], "--", color="C1", label=f"source learning by episode index ({where})")
    if stride > 1:  # what AD was trained on: every stride-th episode, consecutive in its context
        seen = src[::stride][:len(ad)]
        left.plot(np.arange(1, len(seen) + 1), seen, ":", color="C1", label=f"source, every {stride}-th episode "
                                                                            f"(the histories AD was trained on)")
    same = np.asarray(result["source_same_goals"]["mean_return"])
    left.plot(x[:len(same)], same[:len(ad)], "-", color="C2", lw=1,
              label=f"source learning on the same {result['goals']} goals")
    left.axhline(same[-1], color="C2", ls="--", lw=0.8, label=f"source's final return there ({same[-1]:.2f})")
    left.plot(x, random, ":", color="gray", label="uniform random actions")
    left.set(xlabel="episode of the in-context run", ylabel="mean episode return",
             title=f"Algorithm Distillation on {result['env']}, checkpoint {result['step']}")
    left.legend(fontsize=7, loc="lower right")
    right.plot(np.arange(1, len(src) + 1), src, color="C1", label=f"{result['source']['goals']} goals (dataset)")
    right.plot(np.arange(1, len(same) + 1), same, color="C2", lw=1, label=f"{result['goals']} goals (run afresh)")
    right.legend(fontsize=7, loc="lower right")
    right.axhline(src[0], color="gray", ls=":", lw=0.8)
    right.set(xlabel="source episode", title=f"source: {result['source']['algo']} ({result['source']['tasks']} "
                                             f"learning histories)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- command line ------------------------------------------------------------------------
def _args(argv):
    p = cli.Parser(prog="python -m jaxrl_mgpu.incontext", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in-context", action="store_true", help="ignored: for `python -m jaxrl_mgpu.evaluate --in-context`")
    p.add_argument("--run-dir", required=True, help="an --algo ad training run's directory")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (update); default: the latest")
    p.add_argument("--episodes", type=int, default=20, help="consecutive episodes per environment (one context)")
    p.add_argument("--goals", choices=darkroom.SPLITS, default="test",
                   help="goal split: test = held out from the source's learning histories")
    p.add_argument("--envs-per-goal", type=int, default=16, help="environments per goal (different random streams)")
    p.add_argument("--devices", type=int, default=None, help="use the first k local devices (default: all)")
    p.add_argument("--parallel", default="pmap", choices=parallel.BACKENDS)
    p.add_argument("--seed", type=int, default=1, help="seed of the evaluation episodes")
    p.add_argument("--greedy", action="store_true", help="act with the model's most likely action instead of "
                   "sampling it (writes incontext-<goals>-greedy.*)")
    return p.parse_args(argv)


def evaluate(argv=None) -> int:
    try:
        args = _args(argv)
        if args.episodes < 1 or args.envs_per_goal < 1:
            raise ConfigError("--episodes and --envs-per-goal must be at least 1")
        cfg, ckpts = load_run(args.run_dir)
        plan = plan_lib.of_config(cfg)
        if plan.spec.evaluated_by != "in-context":
            raise ConfigError(f"--in-context evaluates --algo ad runs; the run in {args.run_dir} is --algo {cfg.algo}")
        meta, h, where = source_histories(cfg, args.run_dir)  # the goal split and seed, the source's curve
        goals = darkroom.goals(cfg.env, args.goals, meta.get("seed", 0))
        par = parallel.setup(args.parallel, args.devices)
        step, params = readable_params(ckpts, args.run_dir, plan.params_shapes(), args.step)
        ckpts.close()
    except cli.USER_ERRORS as e:
        cli.fail(e)

    env, policy = plan.env, plan.policy()
    params = par.replicate(params)
    key = par.replicate(np.asarray(jax.random.PRNGKey(args.seed)))
    envs = len(goals) * args.envs_per_goal
    run = lambda uniform: par.first(par.map(make_incontext(  # noqa: E731
        policy, env, goals, args.envs_per_goal, args.episodes, par.num_devices, uniform, args.greedy))(
        params, key))[:envs]
    returns, random = run(False), run(True)

    source = source_curve(h)
    same_goals = source_on_goals(cfg.env, meta, goals, args.envs_per_goal, args.seed, par)
    by_goal = returns.reshape(len(goals), args.envs_per_goal, args.episodes).mean(1)
    result = {"env": cfg.env, "step": step, "goals": args.goals, "goal_cells": goals.tolist(),
              "envs_per_goal": args.envs_per_goal, "envs": envs, "episodes": args.episodes, "seed": args.seed,
              "greedy": args.greedy,
              "mean_return": returns.mean(0).tolist(), "std_return": returns.std(0).tolist(),
              "random_return": random.mean(0).tolist(), "per_goal_return": by_goal.tolist(),
              "returns": returns.tolist(),
              "source": {"dataset": where, "algo": meta.get("algo"), "goals": meta.get("split"),
                         "tasks": h.num_tasks, "episode_stride": cfg.ad_episode_stride,
                         "mean_return": source.tolist()},
              # The source run afresh on the evaluation goals (the dataset's goals can be harder
              # or easier): the like-for-like reference for AD's in-context curve.
              "source_same_goals": {"goals": args.goals, "envs": envs, "mean_return": same_goals.tolist()}}
    run_dir = Path(args.run_dir)
    name = f"incontext-{args.goals}" + ("-greedy" if args.greedy else "")
    out_json, out_png = run_dir / f"{name}.json", run_dir / f"{name}.png"
    if parallel.is_main():
        out_json.write_text(json.dumps(result))
        plot(out_png, result)
        print(json.dumps({"step": step, "goals": args.goals, "envs": envs, "episodes": args.episodes,
                          "mean_return": [round(r, 3) for r in result["mean_return"]],
                          "random_return": round(float(random.mean()), 3),
                          "source_first": round(float(source[0]), 3), "source_final": round(float(source[-1]), 3),
                          "source_same_goals_first": round(float(same_goals[0]), 3),
                          "source_same_goals_final": round(float(same_goals[-1]), 3),
                          "json": str(out_json), "png": str(out_png)}))
    return 0


# -- throughput ----------------------------------------------------------------------------
def throughput(argv=None, repeats: int = 5) -> int:
    """Host reader (steps/s of `data.read`, and the windows/s that would make) against the
    compiled AD update (windows/s consumed); one JSON line."""
    try:
        cfg = config_lib.check_distributed(config_lib.build({**config_lib.parse_given(argv), "algo": "ad"}))
        cfg = dataclasses.replace(cfg, num_updates=cfg.num_updates or cfg.log_every)
        parallel.initialize(cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.local_device_ids,
                            cfg.failure_timeout)
        cfg = config_lib.validate(cfg)
        plan = plan_lib.on_devices(cfg, parallel.setup(cfg.parallel, cfg.devices))
        par = plan.par
    except cli.USER_ERRORS as e:
        cli.fail(e)

    # The reader: this process's tasks, as load_data reads them (checksums included).
    num_tasks = rlds.info(cfg.dataset)["num_tasks"]
    mine = [t for i, d in enumerate(par.devices) if d.process_index == jax.process_index()
            for t in rlds.shard(num_tasks, par.num_devices, i)]
    t0 = time.perf_counter()
    h = rlds.read(cfg.dataset, env=cfg.env, tasks=mine)
    read_s = time.perf_counter() - t0
    steps_read = h.num_tasks * h.num_steps

    trainer = chunks.Trainer(plan)  # loads the data onto the devices
    state = trainer.init_state()
    chunk = trainer.chunk_fn(cfg.log_every, state)
    state, out = chunk(state)  # warm-up
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, out = chunk(state)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    update_s = float(np.median(times)) / cfg.log_every
    reader_steps_per_s = steps_read * jax.process_count() / read_s  # all processes read in parallel
    train_windows_per_s = cfg.ad_batch_size / update_s
    device = par.devices[0]
    print(json.dumps({
        "bench": "ad_input_pipeline", "dataset": cfg.dataset, "device": getattr(device, "device_kind", device.platform),
        "devices": par.num_devices, "processes": jax.process_count(), "n_transit": cfg.n_transit,
        "ad_batch_size": cfg.ad_batch_size, "d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "precision": cfg.precision, "reader_steps": steps_read * jax.process_count(), "reader_s": round(read_s, 3),
        "reader_steps_per_s": round(reader_steps_per_s), "reader_windows_per_s": round(reader_steps_per_s / cfg.n_transit),
        "train_update_s": update_s, "train_windows_per_s": round(train_windows_per_s),
        "train_tokens_per_s": round(train_windows_per_s * cfg.n_transit),
        "reader_over_train": round(reader_steps_per_s / cfg.n_transit / train_windows_per_s, 3)}))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--throughput" in argv:
        return throughput([a for a in argv if a != "--throughput"])
    return evaluate(argv)


if __name__ == "__main__":
    sys.exit(main())
