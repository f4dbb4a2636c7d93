"""`--auto-scale`: size the per-device work to the device before training, from XLA's own
memory analysis of the real training chunk and, in `throughput` mode, a short timed probe.

What is sized: the environments per device (PPO with either policy, multi-agent PPO, DQN), or
AD's sequences per device (`--ad-batch-size`). Everything else that depends on the batch
follows one rule: the number of minibatches, epochs and the learning rate stay as configured,
so each minibatch grows with the batch (the same number of gradient steps per update, each on
more data). DQN's replay batch stays as configured too.

How (no out-of-memory trial ever runs):
1. Memory from the compiler. The per-device training chunk is compiled for ONE device of this
   host at two sizes (1,024 and 16,384; 4,096 or 256 where those do not fit) and
   `compiled.memory_analysis()` gives its argument + output + temporary - aliased bytes (the
   state is donated, so its input and output share buffers). Bytes grow linearly with the size;
   a least-squares line through the compiled sizes predicts the others, and no size is compiled
   whose prediction exceeds `--auto-scale-memory` of the device's memory
   (`memory_stats()['bytes_limit']`, XLA's allocator limit); a compile confirms each. A backend
   without a memory limit (the CPU) uses the rule printed with the table: host RAM / local
   devices.
2. Throughput (`--auto-scale` = `--auto-scale throughput`, the default mode): steps/s
   saturates long before memory is full, and a bigger batch then buys nothing but fewer
   updates. Each compile costs seconds to tens of seconds on a GPU (on an H200 8-23 s for
   the DQN chunk, 11-13 s for CartPole's, 18-42 s for Breakout PPO's conv net, over half of it
   XLA's autotuning of GEMMs and convolutions at each size's shapes: experiments/RESULTS.md),
   so the search climbs rather than compiling every size. Each size gets a short steady-state
   probe (DQN in its learning phase: `steady_state`). The next size up is where a model of an update's time (a fixed part
   plus a part per environment, through the sizes probed) puts steps/s at 95% of their limit,
   4x to 16x the largest so far (2x where the model says the largest is there already; half
   that where it does not fit or split); the climb goes on while each step up is more than 5%
   faster than every smaller size, or more than 2.5% per doubling. Then the sizes below the
   choice whose interpolated steps/s might be within 5% of the fastest are probed too, and the
   run takes the smallest size within 5% of the fastest. `memory` mode takes the largest size
   that fits (powers of 2, confirmed by its compile).

The per-device program is the same on every device of a data-parallel run (weak scaling), so
one device is probed. Process 0 decides and broadcasts its choice; the choice is written into
the run's config.json (`--num-envs` or `--ad-batch-size`), so a resumed run reuses it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import time
from typing import Callable

import jax
import numpy as np

from jaxrl_mgpu import parallel
from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.runner import Trainer

MIN_PER_DEVICE = 2 ** 8
MAX_PER_DEVICE = 2 ** 18
FIRST = (2 ** 10, 2 ** 14)  # the first two sizes compiled (together): the line, and the first probes
WITHIN = 0.05           # throughput: the smallest size within 5% of the best
PROBE_S = 0.25          # a timed probe call runs about this long (at least one update)
PROBE_MAX_UPDATES = 64
PROBE_REPEATS = 2       # timed calls after the warm-up (the fastest counts)


@dataclasses.dataclass
class Row:
    per_device: int
    predicted_bytes: float | None = None
    compiled_bytes: int | None = None
    steps_per_s: float | None = None
    compile_s: float | None = None
    chosen: bool = False


def knob(cfg) -> str:
    """The option auto-scaling sets: sequences per update for AD, else environments."""
    return "ad_batch_size" if cfg.algo == "ad" else "num_envs"


def compiled_bytes(compiled) -> int | None:
    """Peak device bytes of a compiled program by XLA's analysis, or None without one."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # a backend without the analysis
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes + m.generated_code_size_in_bytes)


def memory_limit(device) -> tuple[int, str]:
    """The bytes a program may use on `device`, and where the number comes from."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "memory_stats()['bytes_limit']"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram // max(len(jax.local_devices()), 1), "no device memory limit: host RAM / local devices"


def fit_line(sizes: list[int], values: list[float]) -> Callable[[int], float]:
    """Least squares bytes = a + b * size (exact through two points; through the origin from one,
    which over-estimates, as the fixed part is counted once per size)."""
    b, a = np.polyfit(np.asarray(sizes, float), np.asarray(values, float), 1) if len(sizes) > 1 \
        else (values[0] / sizes[0], 0.0)
    return lambda n: float(a + b * n)


def steady_state(cfg):
    """`cfg` as timed (the probes here, and `bench`): DQN learns from its first update, since
    before --learning-starts an update only collects and is several times faster."""
    return dataclasses.replace(cfg, learning_starts=0) if cfg.algo == "dqn" else cfg


def with_size(cfg, per_device: int, num_devices: int):
    """`cfg` with `per_device` of the knob on each of `num_devices` devices, and at least one
    update of training (the probe's programs must exist even when the run is short)."""
    cfg = dataclasses.replace(cfg, **{knob(cfg): per_device * num_devices})
    if cfg.num_updates is None and cfg.total_timesteps < cfg.batch_size:
        cfg = dataclasses.replace(cfg, total_timesteps=cfg.batch_size)
    return cfg


def choose(cfg, par, module, log: Callable[[str], None] = print):
    """The config with the knob chosen (on process 0, broadcast to all), and the search's rows
    (process 0's; the others have only the chosen one). `log` gets the table."""
    t0 = time.perf_counter()
    # A one-device run probes its own program (so training then finds the chosen size's chunk in
    # the compilation cache); otherwise one device of this host stands for each.
    one = par if par.num_devices == 1 else parallel.this_device()
    device = one.devices[0]
    limit, source = memory_limit(device)
    budget = cfg.auto_scale_memory * limit
    rows: dict[int, Row] = {}
    trainers: dict[int, object] = {}
    phases: dict[str, float] = {}  # seconds the search spent compiling and probing (process 0)

    def timed(phase: str, fn: Callable, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - t

    def compile_at(n: int):
        """The one-device trainer at n per device, compiled; None if the config cannot split."""
        c = steady_state(with_size(cfg, n, 1))
        try:
            split = module.check(c, 1)
        except ConfigError:
            return None
        trainer = Trainer(c, one, split=split)
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the initial state's program beside it
            init = pool.submit(trainer.compile_init)
            trainer.compile(trainer.abstract_state())
            init.result()
        rows.setdefault(n, Row(n)).compile_s = time.perf_counter() - t
        rows.setdefault(n, Row(n)).compiled_bytes = compiled_bytes(trainer.compiled)
        trainers[n] = trainer
        return trainer

    def probe(n: int) -> None:
        """Steps/s at n (into its row): one warm-up update, then PROBE_REPEATS calls of as many updates as
        take about PROBE_S (one, at sizes where an update takes longer: the probe of a large
        size costs about three of its updates, not a fixed count of them)."""
        trainer = trainers[n]
        state = trainer.init_state()
        t = time.perf_counter()
        state = jax.block_until_ready(trainer.chunk_fn(1, state)(state)[0])  # warm-up
        updates = int(min(max(PROBE_S // (time.perf_counter() - t), 1), PROBE_MAX_UPDATES))
        chunk = trainer.chunk_fn(updates, state)  # the same program: the length is an argument
        times = []
        for _ in range(PROBE_REPEATS):
            t = time.perf_counter()
            state = jax.block_until_ready(chunk(state)[0])
            times.append(time.perf_counter() - t)
        rows[n].steps_per_s = updates * trainer.steps_per_update / min(times)
        trainers.pop(n)  # frees its program before the next compile and probe

    chosen, stop = None, None
    if jax.process_index() == 0:
        # The line through two compiles (together: XLA compiles outside the GIL), which are also
        # the first probes; where they do not both fit and split, 4,096 (beside the one that
        # did), then 256.
        timed("compiling", compile_all, FIRST, compile_at)
        compiled = fitting(FIRST, rows, budget, trainers, device)
        if len(compiled) == 1:
            timed("compiling", compile_at, 2 ** 12)
            compiled = fitting(sorted({2 ** 12, *compiled}), rows, budget, trainers, device)
        if len(compiled) < 2:
            timed("compiling", compile_at, MIN_PER_DEVICE)
            compiled = fitting(sorted({MIN_PER_DEVICE, *compiled}), rows, budget, trainers, device)
        if not compiled:
            raise ConfigError(f"--auto-scale: not even {MIN_PER_DEVICE} per device fits {cfg.auto_scale_memory:g} of "
                              f"the device's {limit / 2**30:.1f} GiB, or no size splits (see --num-minibatches)")
        def line() -> Callable[[int], float]:
            return fit_line(compiled, [rows[m].compiled_bytes for m in compiled])

        def compile_fits(n: int) -> bool:
            """n compiled (unless the line says it cannot fit), split and within the budget."""
            if rows.get(n, Row(n)).compiled_bytes is not None:  # compiled before: probed, or did not fit
                return False
            rows.setdefault(n, Row(n)).predicted_bytes = line()(n)
            if rows[n].predicted_bytes > budget:
                return False
            if timed("compiling", compile_at, n) is None or not fits(n, rows, budget, device):
                trainers.pop(n, None)
                return False
            compiled.append(n)
            compiled.sort()
            return True

        if cfg.auto_scale == "throughput":
            chosen, stop = climb(compiled, rows, compile_fits, lambda n: timed("probing", probe, n))
        else:
            trainers.clear()
            chosen = timed("compiling", refine_ceiling, compiled, rows, budget, compile_at)
    trainers.clear()
    chosen = parallel.broadcast_after("auto-scale", chosen)
    if chosen in rows:
        rows[chosen].chosen = True
    search_s = time.perf_counter() - t0
    if parallel.is_main():
        log(table(cfg, list(rows.values()), limit, source, search_s, chosen, par.num_devices, phases, stop))
    return with_size(cfg, chosen, par.num_devices), sorted(rows.values(), key=lambda r: r.per_device)


def compile_all(sizes: list[int], compile_at: Callable) -> None:
    """compile_at for every size, at the same time (one thread each)."""
    if sizes:
        with concurrent.futures.ThreadPoolExecutor(len(sizes)) as pool:
            list(pool.map(compile_at, sizes))


def fits(n: int, rows: dict, budget: float, device) -> bool:
    """Whether the compiled size n is within the budget, by XLA's analysis."""
    if rows[n].compiled_bytes is None:
        raise ConfigError(f"--auto-scale: the {device.platform} backend gives no memory analysis of the "
                          f"training chunk; set --num-envs by hand")
    return rows[n].compiled_bytes <= budget


def fitting(sizes: list[int], rows: dict, budget: float, trainers: dict, device) -> list[int]:
    """The sizes (ascending) that compiled within the budget; a size that does not fit (or cannot
    split) ends the list and frees the larger ones' programs."""
    fit = []
    for n in sizes:
        if n not in trainers:
            continue  # the config does not split at this size
        if not fits(n, rows, budget, device):
            break
        fit.append(n)
    for n in [m for m in trainers if m not in fit]:
        trainers.pop(n)
    return fit


def smallest_within(rates: dict[int, float]) -> int:
    """The smallest size whose steps/s are within WITHIN of the fastest's."""
    return min(n for n in rates if rates[n] >= (1 - WITHIN) * max(rates.values()))


def per_env_model(rates: dict[int, float]) -> tuple[float, float] | None:
    """An update's time per env step at size n as `fixed + per_env * n` (launches, the host and
    the work that does not grow with the batch, plus the work per environment), so steps/s
    approach 1 / per_env from below. per_env is the smallest slope between sizes probed one after
    another, the most optimistic (steps/s grew faster than one line at some sizes on an H200);
    None where time did not grow with the size (all fixed: far from saturation)."""
    sizes = sorted(rates)
    slopes = [(b / rates[b] - a / rates[a]) / (b - a) for a, b in zip(sizes, sizes[1:])]
    slopes = [x for x in slopes if x > 0]
    if not slopes:
        return None
    top = sizes[-1]
    return top / rates[top] - min(slopes) * top, min(slopes)


def doubling_gain(rates: dict[int, float]) -> float:
    """The largest size's gain in steps/s over the next smaller one probed, per doubling of the
    size (a 4x step that gained 4% gained 2% per doubling)."""
    top = max(rates)
    below = max(n for n in rates if n < top)
    return (rates[top] / rates[below]) ** (1 / np.log2(top / below)) - 1


def next_size(rates: dict[int, float]) -> int:
    """The size to probe after the largest so far: the power of 2 where `per_env_model` puts
    steps/s at 95% of their limit (fixed / per_env x 19), at least 4x and at most 16x the
    largest (16x where time did not grow with the size). Where the model says the largest is
    already at 95%, 2x: the smallest step that can show it wrong (the model put CartPole's limit
    3% low on an H200), and on a conv net the cheapest compile (PPO Breakout-MinAtar's chunk took
    41.6 s to compile at 65,536 environments against 21.4 s at 16,384)."""
    top, model = max(rates), per_env_model(rates)
    target = 16 * top if model is None else 19 * max(model[0], 0.0) / model[1]
    least = 2 * top if target <= top else 4 * top
    return int(np.clip(2 ** np.ceil(np.log2(max(target, 1.0))), least, 16 * top))


def between(rates: dict[int, float], chosen: int) -> int | None:
    """The smallest power of 2 between the choice and the largest size probed below it whose
    steps/s, interpolated (time per update linear in the size between the two), would be within
    WITHIN of the fastest: that size is probed next. Where nothing below the choice was probed,
    half the choice (not under MIN_PER_DEVICE)."""
    below = [n for n in rates if n < chosen]
    if not below:
        return chosen // 2 if chosen // 2 >= MIN_PER_DEVICE else None
    low = max(below)
    t_low, t_chosen = low / rates[low], chosen / rates[chosen]
    for k in range(int(np.log2(low)) + 1, int(np.log2(chosen))):
        n = 2 ** k
        rate = n / (t_low + (t_chosen - t_low) * (n - low) / (chosen - low))
        if rate >= (1 - WITHIN) * max(rates.values()):
            return n
    return None


def climb(compiled: list[int], rows: dict, compile_fits: Callable[[int], bool],
          probe: Callable[[int], None]) -> tuple[int, str]:
    """throughput mode: probe the compiled sizes, then larger ones (`next_size`, or half of it
    where that does not fit or split, down to 2x) while each step up is more than WITHIN faster
    than every smaller size, or more than WITHIN / 2 per doubling (past that, returns diminish:
    on an H200 CartPole's probes gained 7%, 4.6% and 1.5% per doubling from 16,384 to 262,144,
    and 131,072 is within 5% of the best, 65,536 is not); where the last step was slower, the
    size between the fastest and it; then the sizes below the choice that `between` says might
    be within WITHIN of the fastest too. Returns the smallest
    size within WITHIN of the fastest, and why the climb stopped (for the table)."""
    for n in compiled:
        probe(n)

    def rates() -> dict[int, float]:
        return {n: rows[n].steps_per_s for n in rows if rows[n].steps_per_s is not None}

    while True:
        top, fastest = max(rates()), max(rates(), key=rates().get)
        if fastest != top:
            stop = f"{top:,} was slower than {fastest:,}"
            if 2 * fastest < top and compile_fits(2 * fastest):
                probe(2 * fastest)
            break
        if smallest_within(rates()) != top and doubling_gain(rates()) < WITHIN / 2:
            stop = (f"{top:,} was less than {WITHIN:.0%} faster than {smallest_within(rates()):,}, "
                    f"{doubling_gain(rates()):.1%} per doubling")
            break
        n = next_size(rates())
        # DQN's replay does not split over 262,144 environments on one device, where 131,072 ran
        # 1.5x as fast as 65,536 on an H200: where a size does not fit or split, half of it is next.
        while n > top and not (n <= MAX_PER_DEVICE and compile_fits(n)):
            n //= 2
        if n == top:
            stop = f"{2 * top:,} " + ("is over the maximum" if 2 * top > MAX_PER_DEVICE else "does not fit or split")
            break
        probe(n)
    chosen = smallest_within(rates())
    while (n := between(rates(), chosen)) is not None and compile_fits(n):
        probe(n)
        if smallest_within(rates()) == chosen:
            break
        chosen = smallest_within(rates())
    return chosen, stop


def refine_ceiling(compiled: list[int], rows: dict, budget: float, compile_at: Callable) -> int:
    """memory mode: the largest power of 2 whose predicted bytes fit, confirmed by its compile
    (stepping down by 2 where the compile says it does not fit)."""
    line = fit_line(compiled, [rows[m].compiled_bytes for m in compiled])
    n = max(compiled)
    while n * 2 <= MAX_PER_DEVICE and line(n * 2) <= budget:
        n *= 2
    while n > max(compiled):
        rows.setdefault(n, Row(n)).predicted_bytes = line(n)
        if compile_at(n) is not None and rows[n].compiled_bytes <= budget:
            return n
        n //= 2
    return max(compiled)


def table(cfg, rows: list[Row], limit: int, source: str, search_s: float, chosen: int, devices: int,
          phases: dict | None = None, stop: str | None = None) -> str:
    what = "sequences" if knob(cfg) == "ad_batch_size" else "envs"
    lines = [f"auto-scale ({cfg.auto_scale}): {what} per device, memory budget {cfg.auto_scale_memory:g} x "
             f"{limit / 2**30:.1f} GiB ({source})",
             f"  {what + '/device':>14}{'predicted':>12}{'compiled':>12}{'compile s':>11}{'steps/s':>14}"]
    def gib(b):
        return "-" if b is None else f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
    for r in sorted(rows, key=lambda r: r.per_device):
        rate = f"{r.steps_per_s:,.0f}" if r.steps_per_s is not None else "-"
        seconds = "-" if r.compile_s is None else f"{r.compile_s:.1f}"
        lines.append(f"  {r.per_device:>14,}{gib(r.predicted_bytes):>12}{gib(r.compiled_bytes):>12}{seconds:>11}"
                     f"{rate:>14}"
                     + ("   <- chosen" if r.chosen else ""))
    spent = "".join(f", {phase} {seconds:.1f} s" for phase, seconds in (phases or {}).items())
    spent = f" ({spent[2:]})" if spent else ""
    rule = ("the smallest within 5% of the fastest" if cfg.auto_scale == "throughput" else "the largest that fits")
    lines.append(f"  chose {chosen:,} per device ({rule}), {chosen * devices:,} over {devices} device(s), in "
                 f"{search_s:.1f} s{spent}; minibatches, epochs and lr as configured (minibatches grow with the batch)")
    if stop:
        lines.append(f"  the climb stopped: {stop}")
    return "\n".join(lines)
