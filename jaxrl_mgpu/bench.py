"""`python -m jaxrl_mgpu.bench`: steady-state training throughput.

    python -m jaxrl_mgpu.bench --algo ppo --env CartPole-v1 --num-envs 4096 --num-steps 128
    python -m jaxrl_mgpu.bench --envs-per-device 2048 16384 --devices 1 2 --baseline

Each measurement compiles a chunk of `--updates` training updates (the same compiled chunk
`train` runs), runs it once to warm up, then times `--repeats` calls (blocking on the result)
and reports the median env-steps/s. One JSON line per measurement, then a table. Any training
flag (`--lr`, `--hidden-size`, ...) is passed through to the config. `--baseline` also times
the hand-fused single-device PPO of reference_ppo.py on one device with the same work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import jax

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel, runner
from jaxrl_mgpu.algos import ALGOS
from jaxrl_mgpu.train import USER_ERRORS, fail


def bench_args(argv):
    p = argparse.ArgumentParser(prog="python -m jaxrl_mgpu.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, nargs="+", default=None, help="device counts to measure (default: all)")
    p.add_argument("--num-envs", type=int, nargs="+", default=None, help="GLOBAL environment counts")
    p.add_argument("--envs-per-device", type=int, nargs="+", default=None,
                   help="environments per device (global = this x devices); fixed per-device work")
    p.add_argument("--updates", type=int, default=5, help="updates per timed call (one compiled chunk)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per measurement; the median is reported")
    p.add_argument("--baseline", action="store_true", help="also time reference_ppo.py on one device")
    p.add_argument("--out", default=None, help="append the JSON lines to this file too")
    return p.parse_known_args(argv)


def time_calls(fn, state, repeats: int) -> tuple[list[float], object]:
    """Warm-up call, then `repeats` timed calls; the state is threaded through (donated)."""
    state = jax.block_until_ready(fn(state))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        state = jax.block_until_ready(fn(state))
        times.append(time.perf_counter() - t)
    return times, state


def measure(cfg, devices: int, updates: int, repeats: int) -> dict:
    par = parallel.setup(cfg.parallel, devices)
    ALGOS[cfg.algo].check(cfg, par.num_devices)
    trainer = runner.Trainer(cfg, par)
    state = trainer.init_state()
    t = time.perf_counter()
    chunk = trainer.chunk_fn(updates, state)
    compile_s = time.perf_counter() - t
    times, _ = time_calls(lambda s: chunk(s)[0], state, repeats)
    return result(cfg, "jaxrl_mgpu", par.num_devices, updates, times, compile_s)


def measure_baseline(cfg, updates: int, repeats: int) -> dict:
    from jaxrl_mgpu import reference_ppo
    init, run = reference_ppo.make_update_loop(cfg, updates)
    carry = init(jax.random.PRNGKey(cfg.seed))
    t = time.perf_counter()
    run = run.lower(carry).compile()
    compile_s = time.perf_counter() - t
    times, _ = time_calls(run, carry, repeats)
    return result(cfg, "reference_ppo", 1, updates, times, compile_s)


def result(cfg, impl: str, devices: int, updates: int, times: list[float], compile_s: float) -> dict:
    median = statistics.median(times)
    return {"impl": impl, "algo": cfg.algo, "env": cfg.env, "policy": cfg.policy, "precision": cfg.precision,
            "parallel": cfg.parallel, "devices": devices, "device_kind": jax.devices()[0].device_kind,
            "num_envs": cfg.num_envs, "envs_per_device": cfg.num_envs // devices, "num_steps": cfg.num_steps,
            "updates_per_call": updates, "repeats": len(times),
            "env_steps_per_s": updates * cfg.batch_size / median,
            "update_ms": 1e3 * median / updates, "spread": (max(times) - min(times)) / median,
            "compile_s": compile_s}


def table(rows: list[dict]) -> str:
    """env-steps/s with speed-up and efficiency against one device at the same per-device work."""
    base = {(r["impl"], r["envs_per_device"]): r["env_steps_per_s"] for r in rows if r["devices"] == 1}
    lines = [f"{'impl':<14}{'devices':>8}{'envs/dev':>10}{'envs':>8}{'steps/s':>14}{'ms/update':>11}"
             f"{'speed-up':>10}{'effic.':>8}"]
    for r in rows:
        one = base.get((r["impl"], r["envs_per_device"]))
        speedup = r["env_steps_per_s"] / one if one else float("nan")
        lines.append(f"{r['impl']:<14}{r['devices']:>8}{r['envs_per_device']:>10}{r['num_envs']:>8}"
                     f"{r['env_steps_per_s']:>14,.0f}{r['update_ms']:>11.2f}{speedup:>10.2f}"
                     f"{speedup / r['devices']:>8.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args, rest = bench_args(argv)
    try:
        base = config_lib.from_args(rest)
        device_counts = args.devices or [len(jax.local_devices())]
        runs = []
        for d in device_counts:
            parallel.setup(base.parallel, d)  # validates --devices before any work
            envs = [e * d for e in args.envs_per_device] if args.envs_per_device else (args.num_envs or [base.num_envs])
            runs += [(d, dataclasses.replace(base, num_envs=e, total_timesteps=e * base.num_steps * args.updates))
                     for e in envs]
        for _, cfg in runs:
            config_lib.validate(cfg)
    except USER_ERRORS as e:
        fail(e)

    rows = []
    baselines_done = set()
    for d, cfg in runs:
        jobs = [lambda: measure(cfg, d, args.updates, args.repeats)]
        if args.baseline and d == 1 and cfg.num_envs not in baselines_done:
            baselines_done.add(cfg.num_envs)
            jobs.append(lambda: measure_baseline(cfg, args.updates, args.repeats))
        for job in jobs:
            row = job()
            rows.append(row)
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
