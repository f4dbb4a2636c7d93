"""`python -m jaxrl_mgpu.bench`: steady-state training throughput.

    python -m jaxrl_mgpu.bench --algo ppo --env CartPole-v1 --num-envs 4096 --num-steps 128
    python -m jaxrl_mgpu.bench --envs-per-device 2048 16384 --devices 1 2 --baseline

Each measurement compiles a chunk of `--updates` training updates (the same compiled chunk
`train` runs), runs it once to warm up, then times `--repeats` calls (blocking on the result)
and reports the median env-steps/s (DQN learns from the first update: its steady state). One
JSON line per measurement, then a table. Any training flag (`--lr`, `--hidden-size`, ...) is
passed through to the config. `--baseline` also times the hand-fused single-device PPO of
reference_ppo.py on one device with the same work.
`--transformer-step` instead times single training steps of the transformer policy,
`--steps-per-timing` of them dispatched back to back per timing as a training loop runs them,
and reports tokens/s and MFU: model FLOPs a second against the median of bf16 matmul ceilings
measured in the same run, before the first row and after every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import statistics
import sys
import time

import jax
import optax

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import chunks, parallel
from jaxrl_mgpu import autoscale
from jaxrl_mgpu.tools import reference_ppo
from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu.algos import learner
from jaxrl_mgpu import cli
from jaxrl_mgpu.cli import USER_ERRORS, fail
from jaxrl_mgpu.nets import factory


def bench_args(argv):
    # allow_abbrev=False: training flags pass through, and `--env` must not be taken for an
    # abbreviation of `--envs-per-device`.
    p = cli.Parser(prog="python -m jaxrl_mgpu.bench", description=__doc__, allow_abbrev=False,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, nargs="+", default=None, help="device counts to measure (default: all)")
    p.add_argument("--num-envs", type=int, nargs="+", default=None, help="GLOBAL environment counts")
    p.add_argument("--envs-per-device", type=int, nargs="+", default=None,
                   help="environments per device (global = this x devices); fixed per-device work")
    p.add_argument("--updates", type=int, default=5, help="updates per timed call (one compiled chunk)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per measurement; the median is reported")
    p.add_argument("--baseline", action="store_true", help="also time reference_ppo.py on one device")
    p.add_argument("--out", default=None, help="append the JSON lines to this file too")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also write a jax.profiler trace of two calls per measurement under DIR "
                        "(TensorBoard's profile plugin or Perfetto open it)")
    p.add_argument("--transformer-step", action="store_true",
                   help="instead: time one training step (forward, backward, training's clipped Adam) of the "
                        "transformer policy on [--batch, --context-len] sequences, in each of --precisions, and "
                        "report tokens/s and MFU against a bf16 matmul ceiling measured in the same run")
    p.add_argument("--batch", type=int, default=256, help="sequences per transformer step")
    p.add_argument("--steps-per-timing", type=int, default=10,
                   help="with --transformer-step: steps dispatched back to back per timing, as a training loop "
                        "runs them (1: block on every step, which adds the host's dispatch and sync to each)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=config_lib.PRECISIONS,
                   help="with --transformer-step (fp32 is timed once, with XLA's attention and MLP: the "
                        "reference of the speed-up column)")
    p.add_argument("--attention", nargs="+", default=["xla"], choices=["xla", "cudnn", "pallas"],
                   help="attention of the transformer policy (with --transformer-step: each one is timed)")
    p.add_argument("--mlp", nargs="+", default=["xla"], choices=["xla", "pallas"],
                   help="MLP (and output heads) of the transformer policy, pallas = fused_mlp.py and fused_heads.py "
                        "(with --transformer-step: each one is timed)")
    args, rest = p.parse_known_args(argv)
    for name in ("devices", "num_envs", "envs_per_device", "updates", "repeats", "batch", "steps_per_timing"):
        values = getattr(args, name)
        for value in values if isinstance(values, list) else [values]:
            if value is not None and value < 1:
                raise config_lib.ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args, rest


def time_calls(fn, state, repeats: int, trace: str | None = None, per_timing: int = 1) -> tuple[list[float], object]:
    """Warm-up call, then `repeats` timings of `per_timing` calls dispatched back to back (one
    block on the result at the end; the time per call is recorded); the state is threaded
    through (donated). With a `trace` directory (--profile), two more calls run under
    `jax.profiler.trace`, untimed."""
    state = jax.block_until_ready(fn(state))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(per_timing):
            state = fn(state)
        state = jax.block_until_ready(state)
        times.append((time.perf_counter() - t) / per_timing)
    if trace:
        with jax.profiler.trace(trace):
            for _ in range(2):
                state = jax.block_until_ready(fn(state))
    return times, state


def trace_dir(profile: str | None, name: str) -> str | None:
    return f"{profile}/{name}" if profile else None


def measure(cfg, devices: int, updates: int, repeats: int, profile: str | None = None) -> dict:
    trainer = chunks.Trainer(plan_lib.on_devices(cfg, parallel.setup(cfg.parallel, devices)))  # checks the split
    par = trainer.par
    state = trainer.init_state()
    t = time.perf_counter()
    chunk = trainer.chunk_fn(updates, state)
    compile_s = time.perf_counter() - t
    times, _ = time_calls(lambda s: chunk(s)[0], state, repeats,
                          trace_dir(profile, f"jaxrl_mgpu-{par.num_devices}dev-{cfg.num_envs}envs"))
    row = result(cfg, "jaxrl_mgpu", par.num_devices, updates, times, compile_s, trainer.algorithm.agents_per_env)
    # XLA's analysis of the chunk (per device) against the allocator's peak: what --auto-scale
    # predicts from, and whether it holds.
    stats = par.local_devices[0].memory_stats() or {}
    return {**row, "compiled_bytes": autoscale.compiled_bytes(trainer.compiled),
            "peak_bytes_in_use": stats.get("peak_bytes_in_use")}


def measure_baseline(cfg, updates: int, repeats: int, profile: str | None = None) -> dict:
    init, run = reference_ppo.make_update_loop(cfg, updates)
    carry = init(jax.random.PRNGKey(cfg.seed))
    t = time.perf_counter()
    run = run.lower(carry).compile()  # a plain single-device jit
    compile_s = time.perf_counter() - t
    times, _ = time_calls(run, carry, repeats, trace_dir(profile, f"reference_ppo-{cfg.num_envs}envs"))
    return result(cfg, "reference_ppo", 1, updates, times, compile_s)


def result(cfg, impl: str, devices: int, updates: int, times: list[float], compile_s: float,
           agents: int = 1) -> dict:
    """A measurement's row. Steps count whole training updates (rollout and learning); a
    multi-agent env step is `agents` agent steps."""
    median = statistics.median(times)
    return {"impl": impl, "algo": cfg.algo, "env": cfg.env, "policy": cfg.policy, "precision": cfg.precision,
            "parallel": cfg.parallel, "devices": devices, "device_kind": jax.devices()[0].device_kind,
            "num_envs": cfg.num_envs, "envs_per_device": cfg.num_envs // devices, "num_steps": cfg.num_steps,
            "updates_per_call": updates, "repeats": len(times),
            "env_steps_per_s": updates * cfg.batch_size / median, "agents": agents,
            "agent_steps_per_s": agents * updates * cfg.batch_size / median,
            "update_ms": 1e3 * median / updates, "spread": (max(times) - min(times)) / median,
            "compile_s": compile_s}


def matmul_ceiling(n: int | None = None, repeats: int = 10, per_timing: int = 1) -> float:
    """Achieved bf16 TFLOP/s of an n x n x n matmul on device 0: the MFU denominator (timed like
    the steps it is the ceiling of). n: 8192 on accelerators, 512 on a CPU, whose bf16 matmuls
    are emulated and slow (a CPU's MFU is only ever a smoke test)."""
    n = n or (512 if jax.default_backend() == "cpu" else 8192)
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jax.numpy.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jax.numpy.bfloat16)
    mm = jax.jit(lambda x, y: x @ y)
    times, _ = time_calls(lambda _: mm(a, b), None, repeats, per_timing=per_timing)
    return 2 * n ** 3 / statistics.median(times) / 1e12


def measure_transformer_step(cfg, batch: int, repeats: int, profile: str | None = None,
                             per_timing: int = 1) -> dict:
    """One PPO-shaped training step of the transformer policy on full context windows, with the
    kernels of cfg.attention and cfg.mlp; `per_timing` steps dispatched back to back per timing."""
    L, A, obs_dim = cfg.context_len, 8, 16
    net = factory.transformer(cfg, A, 1, context_len=L, across_episodes=True)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    obs = jax.random.normal(keys[0], (batch, L, obs_dim))
    actions = jax.random.randint(keys[1], (batch, L), 0, A)
    rewards = jax.random.normal(keys[2], (batch, L))
    first = jax.numpy.zeros((batch, L), bool).at[:, 0].set(True)
    params = net.init(keys[3], None, obs[:1], actions[:1], rewards[:1], first[:1])
    # Training's optimizer (clipping, Adam on the flattened parameters); the schedule's length
    # changes no work.
    tx = learner.adam(cfg, total_steps=1000)

    # The minibatch is an argument of the step, not a constant it closes over: as a constant,
    # XLA would fold the work that depends only on it (the action gather's transpose, the masks)
    # into the compiled program, which a training step cannot do.
    def loss(p, minibatch):
        obs, actions, rewards, first = minibatch
        logits, values, _ = net.apply(p, None, obs, actions, rewards, first)
        logp = jax.numpy.take_along_axis(jax.nn.log_softmax(logits), actions[..., None], -1)
        return -logp.mean() + jax.numpy.mean((values - rewards) ** 2)

    def step(carry, minibatch):
        p, o = carry
        u, o = tx.update(jax.grad(loss)(p, minibatch), o, p)
        return optax.apply_updates(p, u), o

    run = functools.partial(jax.jit(step, donate_argnums=0), minibatch=(obs, actions, rewards, first))
    times, _ = time_calls(run, (params, tx.init(params)), repeats,
                          trace_dir(profile, f"transformer-d{cfg.d_model}-L{cfg.n_layers}-b{batch}-{cfg.precision}-"
                                             f"{cfg.attention}-mlp-{cfg.mlp}"), per_timing)
    matmul_params = sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(params)
                        if "kernel" in jax.tree_util.keystr(path))
    tokens = batch * L
    # PaLM's accounting: 6 N per token for the matmuls (forward + backward) plus 12 x layers x
    # d_model x L for attention scores and values (not halved for causality).
    flops = tokens * (6 * matmul_params + 12 * cfg.n_layers * cfg.d_model * L)
    median = statistics.median(times)
    return {"impl": "transformer_step", "precision": cfg.precision, "attention": cfg.attention, "mlp": cfg.mlp,
            "device_kind": jax.devices()[0].device_kind, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads, "context_len": L, "batch": batch, "params": matmul_params,
            "tokens_per_s": tokens / median, "tflops": flops / median / 1e12, "step_ms": 1e3 * median,
            "steps_per_timing": per_timing,
            "spread": (max(times) - min(times)) / median}


def transformer_table(rows: list[dict], ceilings: list[float]) -> str:
    """The rows as a table under a line that gives the bf16 matmul ceiling readings `ceilings`:
    their median (what the rows' MFU is against), count and range."""
    fp32 = {(r["d_model"], r["n_layers"], r["context_len"], r["batch"]): r["tokens_per_s"]
            for r in rows if r["precision"] == "fp32" and r["attention"] == "xla" and r["mlp"] == "xla"}
    tflops = lambda x: f"{x:.0f}" if x >= 10 else f"{x:.2f}"  # a CPU's is a fraction of one
    lines = [f"bf16 matmul ceiling: {tflops(statistics.median(ceilings))} TFLOP/s, the median of {len(ceilings)} "
             f"measurements ({tflops(min(ceilings))}-{tflops(max(ceilings))}) ({rows[0]['device_kind']})",
             f"{'model':<22}{'batch':>6}{'prec':>6}{'attn':>7}{'mlp':>7}{'tokens/s':>13}{'TFLOP/s':>9}{'MFU':>7}{'vs fp32':>9}"]
    for r in rows:
        key = (r["d_model"], r["n_layers"], r["context_len"], r["batch"])
        model = f"d{r['d_model']} L{r['n_layers']} h{r['n_heads']} ctx{r['context_len']}"
        # No fp32 row without fp32 among --precisions: the column says so rather than "nan".
        speedup = f"{r['tokens_per_s'] / fp32[key]:.2f}" if key in fp32 else "-"
        lines.append(f"{model:<22}{r['batch']:>6}{r['precision']:>6}{r['attention']:>7}{r['mlp']:>7}{r['tokens_per_s']:>13,.0f}"
                     f"{r['tflops']:>9.1f}{r['mfu']:>7.1%}{speedup:>9}")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """env-steps/s with speed-up and efficiency against one device at the same per-device work."""
    base = {(r["impl"], r["envs_per_device"]): r["env_steps_per_s"] for r in rows if r["devices"] == 1}
    agents = any(r.get("agents", 1) > 1 for r in rows)
    lines = [f"{'impl':<14}{'devices':>8}{'envs/dev':>10}{'envs':>8}{'steps/s':>14}"
             + (f"{'agent steps/s':>16}" if agents else "") + f"{'ms/update':>11}{'speed-up':>10}{'effic.':>8}"]
    for r in rows:
        one = base.get((r["impl"], r["envs_per_device"]))
        speedup = r["env_steps_per_s"] / one if one else float("nan")
        lines.append(f"{r['impl']:<14}{r['devices']:>8}{r['envs_per_device']:>10}{r['num_envs']:>8}"
                     f"{r['env_steps_per_s']:>14,.0f}" + (f"{r['agent_steps_per_s']:>16,.0f}" if agents else "")
                     + f"{r['update_ms']:>11.2f}{speedup:>10.2f}"
                     f"{speedup / r['devices']:>8.2f}")
    return "\n".join(lines)


def main_transformer(args, base) -> int:
    # fp32, the speed-up's reference, runs with XLA's attention and MLP whichever kernels are asked
    # for (the fused kernels, cuDNN's and ours, are for bf16/fp16): one fp32 row.
    combos = [(precision, attention, mlp) for precision in dict.fromkeys(args.precisions)
              for attention, mlp in ([("xla", "xla")] if precision == "fp32"
                                     else itertools.product(args.attention, args.mlp))]
    cfgs = [dataclasses.replace(base, precision=precision, attention=attention, mlp=mlp)
            for precision, attention, mlp in combos]
    for cfg in cfgs:
        # The step is the cache-free learner path (as AD's): check the kernels' shapes the way
        # training does, before any compile.
        plan_lib.check_kernels(cfg, cfg.context_len)
        config_lib.check_platform(cfg, jax.devices()[0].platform)
    # The ceiling moves between measurements on one card far more than a step's time does:
    # measured before the first row and after every row, every row's MFU is against the
    # median of those, so no single reading moves a row.
    ceilings = [matmul_ceiling(per_timing=args.steps_per_timing)]
    rows = []
    for cfg in cfgs:
        rows.append(measure_transformer_step(cfg, args.batch, args.repeats, args.profile, args.steps_per_timing))
        print(f"timed {cfg.precision} {cfg.attention} / {cfg.mlp}: {rows[-1]['step_ms']:.2f} ms a step",
              file=sys.stderr, flush=True)  # the rows come out once the last ceiling is in
        ceilings.append(matmul_ceiling(per_timing=args.steps_per_timing))
    ceiling = statistics.median(ceilings)
    for row in rows:
        row.update(mfu=row["tflops"] / ceiling, matmul_ceiling_tflops=ceiling, matmul_ceilings_tflops=ceilings)
        emit(row, args.out)
    print(transformer_table(rows, ceilings))
    return 0


def emit(row: dict, out: str | None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main(argv=None) -> int:
    try:
        args, rest = bench_args(argv)
        base = config_lib.from_args(rest)
        if args.transformer_step:
            return main_transformer(args, base)
        if len(args.attention) > 1 or len(args.mlp) > 1:
            raise config_lib.ConfigError("several --attention / --mlp values are for --transformer-step")
        base = dataclasses.replace(base, attention=args.attention[0], mlp=args.mlp[0])  # the policy's kernels
        config_lib.check_platform(base, jax.devices()[0].platform)
        device_counts = args.devices or [len(jax.local_devices())]
        spec = plan_lib.of_config(config_lib.validate(base)).spec  # the algorithm, chosen once
        runs = []
        for d in device_counts:
            parallel.setup(base.parallel, d)  # validates --devices before any work
            envs = [e * d for e in args.envs_per_device] if args.envs_per_device else (args.num_envs or [base.num_envs])
            runs += [(d, spec.steady_state(dataclasses.replace(base, num_envs=e,
                                                               total_timesteps=e * base.num_steps * args.updates)))
                     for e in envs]
        for _, cfg in runs:
            config_lib.validate(cfg)
        if args.baseline and (spec is not reference_ppo.REPRODUCES or base.policy != "mlp"):
            raise config_lib.ConfigError("--baseline is the single-agent PPO of reference_ppo.py: it takes --algo ppo "
                                         "--policy mlp on a single-agent env")
    except USER_ERRORS as e:
        fail(e)

    rows = []
    baselines_done = set()
    for d, cfg in runs:
        jobs = [lambda: measure(cfg, d, args.updates, args.repeats, args.profile)]
        if args.baseline and d == 1 and cfg.num_envs not in baselines_done:
            baselines_done.add(cfg.num_envs)
            jobs.append(lambda: measure_baseline(cfg, args.updates, args.repeats, args.profile))
        for job in jobs:
            rows.append(job())
            emit(rows[-1], args.out)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
