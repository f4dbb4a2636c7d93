"""`--auto-scale`: size the per-device work (environments per device; AD: sequences per device)
before training, from XLA's own memory analysis of the real training chunk and, in `throughput`
mode, short timed probes; minibatch count, epochs and the learning rate stay as configured.

The rules, in the order they bind: no size that leaves the run fewer than
`--auto-scale-min-updates` updates (`ceiling`); no size whose predicted bytes (a least-squares
line through the compiled sizes' `memory_analysis()`) pass `--auto-scale-memory` of the device
(`memory_limit`), each confirmed by its compile; no size started that would take the search past
`--auto-scale-seconds`. Within those, `throughput` climbs (`next_size`: a fixed-plus-per-env
model of an update's time) while bigger is faster, and takes the smallest size within 5% of the
fastest (`smallest_within`); `memory` takes the largest that fits. One device is probed (the
program is the same on every device); process 0 decides and broadcasts, and the choice goes into
config.json, so a resume keeps it. The guide: docs/auto-scale.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from typing import Callable

import jax

from jaxrl_mgpu import parallel
from jaxrl_mgpu.autoscale import host
from jaxrl_mgpu.parallel import memory_limit
from jaxrl_mgpu.autoscale.rules import (MIN_PER_DEVICE, WITHIN, between, doubling_gain, fit_line,
                                            next_size, smallest_within)
from jaxrl_mgpu.chunks import Trainer
from jaxrl_mgpu.cli import count
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.log import RunLog

MAX_PER_DEVICE = 2 ** 18
FIRST = (2 ** 10, 2 ** 14)  # the first two sizes compiled (together): the line, and the first probes
PROBE_S = 0.25          # a timed probe call runs about this long (at least one update)
PROBE_MAX_UPDATES = 64
PROBE_REPEATS = 2       # timed calls after the warm-up (the fastest counts)
PROBE_CAP_S = 5.0       # no size is tried whose one update would take longer (the probe's bound)


@dataclasses.dataclass
class Row:
    per_device: int
    updates: int | None = None       # the run's updates at this size (None: AD's --num-updates)
    predicted_bytes: float | None = None
    compiled_bytes: int | None = None
    steps_per_s: float | None = None
    update_s: float | None = None    # one update's seconds in the probe
    compile_s: float | None = None
    note: str = ""                   # why the size was not compiled, probed or taken
    chosen: bool = False


def knob(spec) -> str:
    """The option auto-scaling sets: the algorithm's (environments; AD: sequences per update)."""
    return spec.options.size


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


def with_size(cfg, spec, per_device: int, num_devices: int):
    """`cfg` with `per_device` of the knob on each of `num_devices` devices; nothing else changes
    (the run keeps the --total-timesteps it was given)."""
    return dataclasses.replace(cfg, **{knob(spec): per_device * num_devices})


def probe_config(cfg, spec, per_device: int):
    """The one-device config the search compiles and times at `per_device`: in its steady state,
    and with at least one update of training, so that the probe's programs exist where the run's
    total is less than one update at this size. Only this copy is raised: such a size leaves the
    run fewer than --auto-scale-min-updates (>= 1) updates, so `ceiling` keeps the run from it."""
    cfg = spec.steady_state(with_size(cfg, spec, per_device, 1))
    if cfg.num_updates is None and cfg.total_timesteps < cfg.batch_size:
        cfg = dataclasses.replace(cfg, total_timesteps=cfg.batch_size)
    return cfg


def run_updates(cfg, spec, per_device: int, num_devices: int) -> int | None:
    """The run's updates at `per_device` on `num_devices` devices, or None where it counts
    --num-updates (AD), which no size changes."""
    return None if cfg.num_updates is not None else with_size(cfg, spec, per_device, num_devices).total_updates


def ceiling(cfg, spec, num_devices: int) -> int:
    """The largest size per device the search may take: MAX_PER_DEVICE, or the largest power of
    2 that leaves the run --auto-scale-min-updates updates; 1 where even 1 leaves fewer (taken,
    and said in the table), unless it leaves none."""
    def too_few(n: int) -> bool:
        updates = run_updates(cfg, spec, n, num_devices)
        return updates is not None and updates < cfg.auto_scale_min_updates

    n = MAX_PER_DEVICE
    while n > 1 and too_few(n):
        n //= 2
    if run_updates(cfg, spec, n, num_devices) == 0:
        raise ConfigError(f"--auto-scale: --total-timesteps {cfg.total_timesteps:,} is less than one update even at 1 "
                          f"environment per device ({count(num_devices, 'device')} x --num-steps {cfg.num_steps})")
    return n


class Search:
    """One search, on process 0: a row per size considered, the programs compiled and not yet
    probed, and the clock. `first`, then `climb` (throughput) or `largest_fitting` (memory)."""

    def __init__(self, plan, one: parallel.Parallel, log: RunLog, par: parallel.Parallel):
        self.plan, self.cfg, self.spec, self.one, self.log = plan, plan.cfg, plan.spec, one, log
        self.num_devices = num_devices = par.num_devices  # the run's (`one` is the device probed)
        cfg, spec = self.cfg, self.spec
        self.device = one.devices[0]
        self.limit, self.source = memory_limit(self.device)
        self.memory = cfg.auto_scale_memory * self.limit  # the bytes a size's chunk may take
        self.top = ceiling(cfg, spec, num_devices)
        self.floor = min(MIN_PER_DEVICE, self.top)
        self.first_sizes = FIRST
        self.what = "sequences" if knob(spec) == "ad_batch_size" else "envs"
        self.host_note = None  # where the games step on the host: its cores and memory, in words
        self.host_top = None   # where the host's memory budget bounds the sizes: the largest
        if (most := host.most_per_device(cfg, par, plan.env)) is not None:
            self.host_bound(most)
        self.rows: dict[int, Row] = {}
        self.trainers: dict[int, Trainer] = {}
        self.compiled: list[int] = []  # the sizes compiled within the memory budget, ascending
        self.phases: dict[str, float] = {}  # seconds spent compiling and probing
        self.started = time.monotonic()
        self.stopped: str | None = None  # why the time budget ended the search, where it did

    def host_bound(self, most: int) -> None:
        """Games on the host's cores (Atari): sizes from a few games per simulator thread, and
        none past the host's memory budget (host.py), besides the device's."""
        threads = self.plan.env.threads
        small = 2 ** max(math.ceil(math.log2(2 * threads)), 0)  # 2 games per thread, as a power of 2
        self.first_sizes = (small, 8 * small)
        self.floor = min(small, self.top)
        _, source = host.memory_budget()
        self.host_note = (f"games on the host: {count(parallel.host_cores(), 'core')}, {threads} simulator thread(s) "
                          f"per device's batch; at most {max(most, 0):,} games per device in {source}")
        if 0 < most < self.top:
            self.top = self.host_top = 2 ** int(math.log2(most))

    def row(self, n: int) -> Row:
        if n not in self.rows:
            self.rows[n] = Row(n, updates=run_updates(self.cfg, self.spec, n, self.num_devices))
        return self.rows[n]

    def rates(self) -> dict[int, float]:
        return {n: r.steps_per_s for n, r in self.rows.items() if r.steps_per_s is not None}

    def header(self) -> str:
        """The line printed as the search starts: what it may take, and its bounds."""
        bound = f"up to {self.top:,}"
        if self.top == self.host_top:
            bound += " (more games would not fit the host's memory budget)"
        elif self.top < MAX_PER_DEVICE:
            bound += (f" (more would leave the run fewer than --auto-scale-min-updates "
                      f"{self.cfg.auto_scale_min_updates} updates of --total-timesteps {self.cfg.total_timesteps:,})")
        probes = (f"; probes of about {PROBE_S:g} s (one update where that takes longer; no size whose update would "
                  f"take over {PROBE_CAP_S:g} s)" if self.cfg.auto_scale == "throughput" else "")
        return (f"auto-scale ({self.cfg.auto_scale}): searching {self.what} per device {bound}, for at most about "
                f"{self.cfg.auto_scale_seconds} s (--auto-scale-seconds){probes}"
                + (f"\n  auto-scale: {self.host_note}" if self.host_note else ""))

    # -- compiling --------------------------------------------------------------------------
    def compile(self, sizes: list[int]) -> None:
        """Each size's one-device trainer, compiled (together where several: XLA compiles outside
        the GIL), into `trainers`; a size that does not split gets a note instead."""
        for n in sizes:
            self.row(n)  # before the threads
        names = " and ".join(f"{n:,}" for n in sizes)
        self.log.print(f"  auto-scale: compiling {names} {self.what} per device")
        t = time.perf_counter()
        with self.log.waiting(f"auto-scale: compiling {names} {self.what} per device"), \
                concurrent.futures.ThreadPoolExecutor(len(sizes)) as pool:
            list(pool.map(self._compile_one, sizes))
        self.phases["compiling"] = self.phases.get("compiling", 0.0) + time.perf_counter() - t

    def _compile_one(self, n: int) -> None:
        row = self.row(n)
        try:
            plan = self.plan.on(self.one, probe_config(self.cfg, self.spec, n))
        except ConfigError as e:
            row.note = "does not split"
            self.log.print(f"  auto-scale: {n:,} does not split: {e}")
            return
        trainer = Trainer(plan)
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the initial state's program beside it
            init = pool.submit(trainer.compile_init)
            trainer.compile(trainer.abstract_state())
            init.result()
        row.compile_s = time.perf_counter() - t
        row.compiled_bytes = compiled_bytes(trainer.compiled)
        if row.compiled_bytes is not None and row.compiled_bytes > self.memory:
            row.note = "over the memory budget"
        self.trainers[n] = trainer
        self.log.print(f"  auto-scale: compiled {n:,} in {row.compile_s:.1f} s: {size_text(row.compiled_bytes)}"
                       + (f", {row.note}" if row.note else ""))

    def fits(self, n: int) -> bool:
        """Whether the compiled size n is within the memory budget, by XLA's analysis."""
        if self.rows[n].compiled_bytes is None:
            raise ConfigError(f"--auto-scale: the {self.device.platform} backend gives no memory analysis of the "
                              f"training chunk; set --num-envs by hand")
        return self.rows[n].compiled_bytes <= self.memory

    def fitting(self, sizes: list[int]) -> list[int]:
        """The sizes (ascending) that compiled within the budget; a size that does not fit (or
        cannot split) ends the list and frees the larger ones' programs."""
        fit = []
        for n in sizes:
            if n not in self.trainers:
                continue  # the config does not split at this size
            if not self.fits(n):
                break
            fit.append(n)
        for n in [m for m in self.trainers if m not in fit]:
            self.trainers.pop(n)
        return fit

    def first(self) -> None:
        """The line through two compiles (together), which are also the first probes: FIRST, each
        at most the ceiling; where they do not both fit and split, 4,096 (beside the one that
        did), then the floor."""
        sizes = sorted({min(n, self.top) for n in self.first_sizes})
        self.compile(sizes)
        self.compiled = self.fitting(sizes)
        for extra in ([min(2 ** 12, self.top)] if len(self.compiled) == 1 else []) + [self.floor]:
            if len(self.compiled) < 2 and extra not in self.rows:
                self.compile([extra])
                self.compiled = self.fitting(sorted({extra, *self.compiled}))
        if not self.compiled:
            raise ConfigError(f"--auto-scale: not even {min(self.rows):,} per device fits "
                              f"{self.cfg.auto_scale_memory:g} of the device's {self.limit / 2**30:.1f} GiB, or no "
                              f"size splits (see --num-minibatches)")

    def line(self) -> Callable[[int], float]:
        return fit_line(self.compiled, [self.rows[m].compiled_bytes for m in self.compiled])

    # -- time -------------------------------------------------------------------------------
    def predicted_update_s(self, n: int) -> float:
        """One update's seconds at n: the nearest size probed at or below it, scaled with the size
        (an over-estimate above it, as the fixed part of an update is scaled too)."""
        probed = sorted(m for m, r in self.rows.items() if r.update_s is not None)
        m = max([m for m in probed if m <= n], default=probed[0])
        return self.rows[m].update_s * n / m

    def out_of_time(self, upcoming: float) -> str | None:
        """Why `upcoming` more seconds would take the search past --auto-scale-seconds, or None."""
        spent, budget = time.monotonic() - self.started, self.cfg.auto_scale_seconds
        if spent + upcoming <= budget:
            return None
        return (f"the search's budget of {budget} s (--auto-scale-seconds) was spent" if spent >= budget else
                f"{spent:.0f} s of the search's {budget} s (--auto-scale-seconds) spent, and the next size would take "
                f"about {upcoming:.0f} s")

    def over_cap(self, n: int) -> bool:
        """Whether n's one update would take over PROBE_CAP_S, by `predicted_update_s` (noted in
        its row where it would)."""
        predicted = self.predicted_update_s(n)
        if predicted <= PROBE_CAP_S:
            return False
        self.row(n).note = f"not probed: one update would take about {predicted:.0f} s (over {PROBE_CAP_S:g} s)"
        self.log.print(f"  auto-scale: {n:,} {self.rows[n].note}")
        return True

    def why_not(self, n: int) -> str:
        """Why size n was not taken up, for the table (a size over the ceiling gets a row saying it)."""
        if n > MAX_PER_DEVICE:
            return f"{n:,} is over the maximum"
        if self.host_top is not None and n > self.host_top:
            return f"{n:,} games per device would not fit the host's memory budget"
        if n > self.top:
            row = self.row(n)
            row.note = (f"leaves {row.updates} updates, fewer than --auto-scale-min-updates "
                        f"{self.cfg.auto_scale_min_updates}")
            return f"{n:,} {row.note}"
        return f"{n:,} {self.rows[n].note or 'was not tried'}"

    def start(self, n: int) -> bool:
        """Whether n is now compiled within the memory budget, ready to probe: not over the
        ceiling, tried before, predicted over PROBE_CAP_S or the memory budget, past the time
        budget (`stopped`), unsplittable or over the memory budget by its compile."""
        if n > self.top or self.rows.get(n, Row(n)).note or n in self.compiled:
            return False
        probing = self.cfg.auto_scale == "throughput"
        if probing and self.over_cap(n):
            return False
        compile_s = max(r.compile_s for r in self.rows.values() if r.compile_s is not None)
        self.stopped = self.out_of_time(compile_s + (self.predicted_update_s(n) if probing else 0.0))
        if self.stopped:
            return False
        row = self.row(n)
        row.predicted_bytes = self.line()(n)
        if row.predicted_bytes > self.memory:
            row.note = "predicted over the memory budget"
            return False
        self.compile([n])
        if n not in self.trainers:
            return False
        if not self.fits(n):
            self.trainers.pop(n)
            return False
        self.compiled = sorted({n, *self.compiled})
        return True

    # -- probing ----------------------------------------------------------------------------
    def probe(self, n: int) -> None:
        """Steps/s at n (into its row): one timed update; where it took under PROBE_S, a warm-up,
        then PROBE_REPEATS calls of as many updates as take about PROBE_S (the fastest counts);
        where it took longer, that one update is the probe (its first call: slightly slow, which
        leans the choice to the smaller sizes). `start` kept n's update within PROBE_CAP_S."""
        trainer, row = self.trainers.pop(n), self.rows[n]  # popped: its program is freed after
        t0 = time.perf_counter()
        with self.log.waiting(f"auto-scale: probing {n:,} {self.what} per device"):
            state = trainer.init_state()
            t = time.perf_counter()
            state = jax.block_until_ready(trainer.chunk_fn(1, state)(state)[0])
            seconds, updates = time.perf_counter() - t, 1
            if seconds < PROBE_S:
                updates = int(min(max(PROBE_S // seconds, 1), PROBE_MAX_UPDATES))
                chunk = trainer.chunk_fn(updates, state)  # the same program: the length is an argument
                times = []
                for _ in range(PROBE_REPEATS):
                    t = time.perf_counter()
                    state = jax.block_until_ready(chunk(state)[0])
                    times.append(time.perf_counter() - t)
                seconds = min(times)
        row.update_s = seconds / updates
        row.steps_per_s = updates * trainer.steps_per_update / seconds
        spent = time.perf_counter() - t0
        self.phases["probing"] = self.phases.get("probing", 0.0) + spent
        self.log.print(f"  auto-scale: probed {n:,} in {spent:.1f} s: {row.steps_per_s:,.0f} steps/s "
                       f"({row.update_s:.3g} s an update)")

    # -- the modes --------------------------------------------------------------------------
    def climb(self) -> tuple[int, str]:
        """throughput mode: probe the compiled sizes (the smallest always; the others within the
        probe cap and the time budget), then larger ones (`next_size`, or half of it where that
        does not fit, split or probe, down to 2x) while each step up is more than WITHIN faster
        than every smaller size, or more than WITHIN / 2 per doubling (past that, returns
        diminish: each doubling gains less than the one before as steps/s near their limit,
        and a size two doublings up can still be more than WITHIN faster); where the last
        step was slower, the size between the fastest and it; then the sizes below the choice
        that `between` says might be within WITHIN of the fastest too. Returns the smallest size
        within WITHIN of the fastest, and why the climb stopped (for the table)."""
        self.probe(self.compiled[0])
        for n in self.compiled[1:]:
            if not (self.stopped or self.over_cap(n)):
                self.stopped = self.out_of_time(self.predicted_update_s(n))
            if self.stopped or self.rows[n].note:
                self.trainers.pop(n)
            else:
                self.probe(n)

        while True:
            rates = self.rates()
            top, fastest = max(rates), max(rates, key=rates.get)
            if fastest != top:
                stop = f"{top:,} was slower than {fastest:,}"
                if 2 * fastest < top and self.start(2 * fastest):
                    self.probe(2 * fastest)
                break
            if smallest_within(rates) != top and doubling_gain(rates) < WITHIN / 2:
                stop = (f"{top:,} was less than {WITHIN:.0%} faster than {smallest_within(rates):,}, "
                        f"{doubling_gain(rates):.1%} per doubling")
                break
            n = next_size(rates)
            # Where a size does not fit or split (DQN's replay does not split over 262,144
            # environments on one device), half of it is next: it may still be well faster.
            while n > top and not self.stopped and not self.start(n):
                n //= 2
            if self.stopped:
                stop = self.stopped
                break
            if n == top:
                stop = self.why_not(2 * top)
                break
            self.probe(n)
        chosen = smallest_within(self.rates())
        # Down to any size, below the first sizes compiled too: one as fast but smaller gives the
        # run more updates (where --auto-scale-min-updates binds, what it learns depends on them).
        while not self.stopped and (n := between(self.rates(), chosen, 1)) is not None and self.start(n):
            self.probe(n)
            if smallest_within(self.rates()) == chosen:
                break
            chosen = smallest_within(self.rates())
        if self.stopped and self.stopped != stop:
            stop += f"; then {self.stopped}"
        return chosen, stop

    def largest_fitting(self) -> tuple[int, str | None]:
        """memory mode: the largest power of 2 (at most the ceiling) whose predicted bytes fit,
        confirmed by its compile (stepping down by 2 where the compile says it does not fit), and
        why no larger one where the ceiling or the time budget decided it."""
        self.trainers.clear()
        line = self.line()
        n = max(self.compiled)
        while n * 2 <= self.top and line(n * 2) <= self.memory:
            n *= 2
        while n > max(self.compiled) and not self.start(n) and not self.stopped:
            n //= 2
        self.trainers.clear()
        chosen = max(self.compiled)
        ceiling_decided = 2 * chosen > self.top and line(2 * chosen) <= self.memory
        return chosen, self.stopped or (self.why_not(2 * chosen) if ceiling_decided else None)


def choose(plan, par, log: RunLog | None = None):
    """The plan's config (plan.Plan, without devices) with the knob chosen (on process 0, broadcast to all), and the search's rows
    (process 0's; the others have only the chosen one). `log` (a RunLog without a run directory
    where None) gets each size's lines as it goes, and the table."""
    t0 = time.perf_counter()
    log = log if log is not None else RunLog(None, 0)
    # A one-device run probes its own program (so training then finds the chosen size's chunk in
    # the compilation cache); otherwise one device of this host stands for each.
    one = par if par.num_devices == 1 else parallel.this_device()
    cfg = plan.cfg
    search = Search(plan, one, log, par)
    chosen, stop = None, None
    if jax.process_index() == 0:
        log.print(search.header())
        search.first()
        chosen, stop = search.climb() if cfg.auto_scale == "throughput" else search.largest_fitting()
    search.trainers.clear()
    chosen = parallel.broadcast_after("auto-scale", chosen)
    rows = search.rows
    if chosen in rows:
        rows[chosen].chosen = True
    log.print(table(cfg, search.what, list(rows.values()), search.limit, search.source, time.perf_counter() - t0, chosen,
                    par.num_devices, search.phases, stop, keeps=plan.spec.auto_scale_keeps))
    return with_size(cfg, plan.spec, chosen, par.num_devices), sorted(rows.values(), key=lambda r: r.per_device)


def size_text(b: float | None) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"


def table(cfg, what: str, rows: list[Row], limit: int, source: str, search_s: float, chosen: int, devices: int,
          phases: dict | None = None, stop: str | None = None, *, keeps: str) -> str:
    """The search's table: a row per size (`what` per device: envs, or AD's sequences); `keeps`:
    what the size leaves as configured (the spec's auto_scale_keeps)."""
    counted = cfg.num_updates is None  # PPO, DQN: the updates a size leaves the run
    lines = [f"auto-scale ({cfg.auto_scale}): {what} per device, memory budget {cfg.auto_scale_memory:g} x "
             f"{limit / 2**30:.1f} GiB ({source})",
             f"  {what + '/device':>14}" + (f"{'updates':>10}" if counted else "")
             + f"{'predicted':>12}{'compiled':>12}{'compile s':>11}{'steps/s':>14}"]
    for r in sorted(rows, key=lambda r: r.per_device):
        rate = f"{r.steps_per_s:,.0f}" if r.steps_per_s is not None else "-"
        seconds = "-" if r.compile_s is None else f"{r.compile_s:.1f}"
        note = "<- chosen" if r.chosen else r.note
        lines.append(f"  {r.per_device:>14,}" + (f"{r.updates:>10,}" if counted else "")
                     + f"{size_text(r.predicted_bytes):>12}{size_text(r.compiled_bytes):>12}{seconds:>11}{rate:>14}"
                     + (f"   {note}" if note else ""))
    spent = "".join(f", {phase} {seconds:.1f} s" for phase, seconds in (phases or {}).items())
    spent = f" ({spent[2:]})" if spent else ""
    rule = ("the smallest within 5% of the fastest" if cfg.auto_scale == "throughput" else "the largest that fits")
    left = next((r.updates for r in rows if r.per_device == chosen), None)
    if counted:
        rule += f" of the sizes that leave --auto-scale-min-updates {cfg.auto_scale_min_updates}"
    lines.append(f"  chose {chosen:,} per device ({rule}), {chosen * devices:,} over {count(devices, 'device')}"
                 + ("" if left is None else f", {left:,} updates") + ", in "
                 f"{search_s:.1f} s{spent}; {keeps}")
    if stop:
        lines.append(f"  the {'climb' if cfg.auto_scale == 'throughput' else 'search'} stopped: {stop}")
    if counted and left is not None and left < cfg.auto_scale_min_updates:
        lines.append(f"  even {chosen:,} per device leaves the run {left} updates of --total-timesteps "
                     f"{cfg.total_timesteps:,}, fewer than --auto-scale-min-updates {cfg.auto_scale_min_updates}: the "
                     f"smallest size, taken")
    return "\n".join(lines)
