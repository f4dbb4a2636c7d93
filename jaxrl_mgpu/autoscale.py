"""`--auto-scale`: size the per-device work to the device before training, from XLA's own
memory analysis of the real training chunk and, in `throughput` mode, a short timed probe.

What is sized: the environments per device (PPO with either policy, multi-agent PPO, DQN), or
AD's sequences per device (`--ad-batch-size`). Everything else that depends on the batch
follows one rule: the number of minibatches, epochs and the learning rate stay as configured,
so each minibatch grows with the batch (the same number of gradient steps per update, each on
more data). DQN's replay batch stays as configured too.

How (no out-of-memory trial ever runs):
1. Memory from the compiler. The per-device training chunk is compiled for ONE device of this
   host at two sizes (1,024 and 4,096; 256 where those do not fit) and
   `compiled.memory_analysis()` gives its argument + output + temporary - aliased bytes (the
   state is donated, so its input and output share buffers). Bytes grow linearly with the size;
   a least-squares line through the compiled sizes predicts the others, and no size is compiled
   whose prediction exceeds `--auto-scale-memory` of the device's memory
   (`memory_stats()['bytes_limit']`, XLA's allocator limit); a compile confirms each. A backend
   without a memory limit (the CPU) uses the rule printed with the table: host RAM / local
   devices.
2. Throughput (`--auto-scale` = `--auto-scale throughput`, the default mode): steps/s
   saturates long before memory is full, and a bigger batch then buys nothing but fewer
   updates. Each compile costs seconds to tens of seconds on a GPU (about 7 s for the DQN
   chunk, 10-40 s for PPO's conv net on an H200, most of it the same at every size), so the
   search climbs instead of compiling every size: each size gets a short steady-state probe
   (DQN in its learning phase: `steady_state`), and the next size up (x4) is compiled and
   probed while steps/s still grow, the next size fits and splits, and the sizes are not
   `saturated` (an update's time modelled as a fixed part plus a part per environment, through
   the two largest probes: the choice is already within 5% of the fastest any size can reach).
   Where the climb stopped for another reason, the size between the fastest and its next step
   (x2) is probed too; where the choice is the smallest size probed, the one below it is. The
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
    one = parallel.this_device()
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
        trainer.compile(trainer.abstract_state())
        rows.setdefault(n, Row(n)).compile_s = time.perf_counter() - t
        trainer.compile_init()  # here, in parallel, rather than before its probe
        rows.setdefault(n, Row(n)).compiled_bytes = compiled_bytes(trainer._compiled)
        trainers[n] = trainer
        return trainer

    def probe(n: int) -> float:
        """Steps/s at n: one warm-up update, then PROBE_REPEATS calls of as many updates as
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

    ladder = [n for n in (MIN_PER_DEVICE * 4 ** k for k in range(10)) if n <= MAX_PER_DEVICE]
    chosen, stop = None, None
    if jax.process_index() == 0:
        # The line through two compiles (together: XLA compiles outside the GIL): the second and
        # third rungs, which the throughput search probes anyway; the first only if they do not fit.
        timed("compiling", compile_all, ladder[1:3], compile_at)
        compiled = fitting(ladder[1:3], rows, budget, trainers, device)
        if len(compiled) < 2:
            timed("compiling", compile_all, ladder[:1], compile_at)
            compiled = fitting(ladder[:1] + compiled, rows, budget, trainers, device)
        if not compiled:
            raise ConfigError(f"--auto-scale: not even {MIN_PER_DEVICE} per device fits {cfg.auto_scale_memory:g} of "
                              f"the device's {limit / 2**30:.1f} GiB, or no size splits (see --num-minibatches)")
        line = lambda: fit_line(compiled, [rows[m].compiled_bytes for m in compiled])  # noqa: E731

        def compile_fits(n: int) -> bool:
            """n compiled (unless the line says it cannot fit), split and within the budget."""
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


def saturated(rates: dict[int, float]) -> bool:
    """Whether no larger size can be more than WITHIN faster than the current choice, by the
    model of an update's time as a fixed part (launches, the host, the non-batched work) plus a
    part per environment, through the two largest sizes probed: steps/s then approach
    1 / (seconds per environment step) from below, and the choice is within WITHIN of that."""
    if len(rates) < 2:
        return False
    small, large = sorted(rates)[-2:]
    per_env = (large / rates[large] - small / rates[small]) / (large - small)
    return per_env > 0 and rates[smallest_within(rates)] >= (1 - WITHIN) / per_env


def climb(compiled: list[int], rows: dict, compile_fits: Callable[[int], bool],
          probe: Callable[[int], None]) -> tuple[int, str]:
    """throughput mode: probe the compiled sizes, then x4 larger ones while steps/s still grow and
    are not `saturated`, and while they fit; then the size between the fastest and its next step
    (x2), unless the climb stopped at saturation; then smaller sizes while the choice is the
    smallest probed. Returns the smallest size within WITHIN of the fastest, and why the climb
    stopped (for the table)."""
    for n in compiled:
        probe(n)

    def rates() -> dict[int, float]:
        return {n: rows[n].steps_per_s for n in rows if rows[n].steps_per_s is not None}

    while True:
        top, fastest = max(rates()), max(rates(), key=rates().get)
        if fastest != top:
            stop = f"{top:,} was slower than {fastest:,}"
            break
        if saturated(rates()):
            stop = f"saturated at {top:,} (steps/s against the size's fixed + per-environment model)"
            break
        if top * 4 > MAX_PER_DEVICE or not compile_fits(top * 4):
            stop = f"{top * 4:,} " + ("is over the maximum" if top * 4 > MAX_PER_DEVICE else "does not fit or split")
            break
        probe(top * 4)
    # The steps are x4 apart: where the climb did not stop at saturation, the size between the
    # fastest and its next step may be faster still (DQN's replay does not split over 262,144
    # environments, and 131,072 ran 1.5x as fast as 65,536 on an H200).
    between = fastest * 2
    if not stop.startswith("saturated") and between <= MAX_PER_DEVICE and between not in rates() \
            and compile_fits(between):
        probe(between)
    chosen = smallest_within(rates())
    while chosen == min(rates()) and chosen // 4 >= MIN_PER_DEVICE:  # a smaller size might be within too
        if not compile_fits(chosen // 4):
            break
        probe(chosen // 4)
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
