"""--auto-scale on CPU (autoscale/): the choice from the compiled chunk's memory analysis,
the throughput probe, the minimum of updates and the time budget, the lines printed as it
searches, the same choice on every device and process, resume, bad input."""

import dataclasses
import json
import subprocess
import sys
import time

import pytest

import jaxrl_mgpu
from jaxrl_mgpu import algos, parallel
from jaxrl_mgpu import autoscale
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import log as log_lib
from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu.cli import ConfigError
from jaxrl_mgpu.log import RunLog

from helpers import run

PPO = algos.get("ppo")

# CartPole PPO, 8 steps per env: about 4 KiB of chunk memory per environment on a CPU, so a
# small fraction of the host's memory makes the ceiling bind in the middle of the sizes. 200,000
# steps are 100 updates of 250 envs on 8 devices: the minimum of updates keeps the search at or
# under 16 per device (on 4 devices, 32).
SMALL = ["--num-steps", "8", "--total-timesteps", "200000", "--hidden-size", "16", "--log-every", "1"]
# A total for which the minimum of updates never binds (131,072 per device leave 128 updates).
LONG = 2 ** 30


def choose(capsys, **overrides):
    """The chosen config and {size per device: autoscale.Row} of a search on 8 devices, and what
    it printed (a line per size as it went, then the table)."""
    cfg = config_lib.validate(config_lib.build(dict(num_steps=8, hidden_size=16, **{"total_timesteps": LONG, **overrides})))
    capsys.readouterr()
    chosen, rows = autoscale.choose(plan_lib.of_config(cfg), parallel.setup("pmap"))
    out = capsys.readouterr().out
    assert out.count("<- chosen") == 1, out
    return chosen, {r.per_device: r for r in rows}, out


def table_of(out: str) -> str:
    return out[out.index("auto-scale (", 1):]  # after the search's first line


def assert_said_as_it_went(out: str, rows: dict) -> None:
    """A line as each size starts compiling and as its compile and its probe end, all before the
    table."""
    progress = out[:out.index("auto-scale (", 1)]
    assert progress.startswith("auto-scale (") and "searching envs per device" in progress
    for n, r in rows.items():
        if r.compile_s is not None:
            assert f"compiling {n:,}" in progress or f"and {n:,} envs" in progress, n
            assert f"compiled {n:,} in {r.compile_s:.1f} s" in progress, n
        if r.steps_per_s is not None:
            assert f"probed {n:,} in " in progress and f"{r.steps_per_s:,.0f} steps/s" in progress, n


@pytest.mark.slow
def test_memory_mode_takes_the_largest_size_that_fits_and_predicts_its_bytes(capsys):
    limit, _ = autoscale.memory_limit(parallel.this_device().devices[0])
    budget = 5 * 2**20   # a few thousand environments' worth
    # (a search time budget that a loaded machine cannot spend: the sizes, not the clock, decide)
    cfg, rows, out = choose(capsys, auto_scale="memory", auto_scale_memory=budget / limit, auto_scale_seconds=3600)
    assert_said_as_it_went(out, rows)
    chosen = cfg.num_envs // 8
    assert rows[chosen].chosen and [n for n in rows if rows[n].chosen] == [chosen]
    assert chosen > 256 and rows[chosen].compiled_bytes <= budget
    # Twice the size would not fit: by the line through the compiled sizes, and by its compile
    # where the search made one.
    compiled = {n: r.compiled_bytes for n, r in rows.items() if r.compiled_bytes is not None}
    line = autoscale.fit_line(sorted(compiled), [compiled[n] for n in sorted(compiled)])
    assert line(2 * chosen) > budget and compiled.get(2 * chosen, budget + 1) > budget
    # The line predicted the chosen size's compiled bytes within 10%.
    assert abs(rows[chosen].predicted_bytes - compiled[chosen]) <= 0.1 * compiled[chosen]
    # Deterministic: the same search again gives the same size.
    assert choose(capsys, auto_scale="memory", auto_scale_memory=budget / limit,
                  auto_scale_seconds=3600)[0].num_envs == cfg.num_envs


@pytest.mark.slow
def test_throughput_mode_takes_the_smallest_size_within_5_percent_of_the_best(capsys):
    limit, _ = autoscale.memory_limit(parallel.this_device().devices[0])
    # The memory ceiling keeps the probes to the small sizes a CPU runs in seconds.
    cfg, rows, out = choose(capsys, auto_scale="throughput", auto_scale_memory=5 * 2**20 / limit)
    assert_said_as_it_went(out, rows)
    table = table_of(out)
    rates = {n: r.steps_per_s for n, r in rows.items() if r.steps_per_s is not None}
    chosen = cfg.num_envs // 8
    assert chosen in rates and max(rates.values()) * 0.95 <= rates[chosen]
    assert all(rates[n] < 0.95 * max(rates.values()) for n in rates if n < chosen)
    # The climb stopped where it says.
    stop = table.split("the climb stopped: ")[1]
    top = max(rates)
    if "less than 5% faster" in stop:
        assert autoscale.smallest_within(rates) < top and autoscale.doubling_gain(rates) < 0.025
    elif "memory budget" in stop or "does not split" in stop:
        assert 2 * top in rows and 2 * top not in rates
    elif "was slower" in stop:
        assert max(rates, key=rates.get) < top
    elif "not probed: one update would take" in stop:  # the probe's cap, on a slow or loaded CPU
        assert rows[2 * top].steps_per_s is None and "over 5 s" in rows[2 * top].note
    elif "--auto-scale-seconds" in stop:
        assert 2 * top not in rates
    else:
        assert "over the maximum" in stop and 2 * top > autoscale.MAX_PER_DEVICE
    # No size below the choice that might be within 5% of the fastest was left unprobed.
    below = autoscale.between(rates, chosen)
    assert below is None or (below in rows and below not in rates)  # considered, and did not fit


def test_the_climb_on_rates_measured_on_an_h200():
    # Steps/s from the probes and sweeps of experiments/RESULTS.md (issue 30), one H200.
    # PPO Breakout-MinAtar: from 1,024 and 16,384 the model puts 16,384 at 95% of the limit
    # already, so 2x (32,768), where steps/s gain under 5%; 8,192 interpolates to within 5% of
    # the fastest and is probed; 4,096 does not.
    breakout = {1024: 2.267e6, 16384: 3.121e6}
    assert autoscale.next_size(breakout) == 32768
    breakout[32768] = 3.15e6
    assert autoscale.smallest_within(breakout) == 16384 and autoscale.between(breakout, 16384) == 8192
    breakout[8192] = 3.01e6
    assert autoscale.smallest_within(breakout) == 8192 and autoscale.between(breakout, 8192) is None
    # PPO CartPole (the cold search's probes): >5% faster at 65,536, >2.5% per doubling at
    # 131,072, 262,144 (the maximum) is neither.
    cartpole = {1024: 23.12e6, 16384: 75.6e6}
    assert autoscale.next_size(cartpole) == 65536
    cartpole[65536] = 86.4e6  # the model: 95% of its limit already, so 2x
    assert autoscale.smallest_within(cartpole) == 65536 and autoscale.next_size(cartpole) == 131072
    # 4.5% faster: within 5%, but more than 2.5% per doubling, so on (2x again), to 1.5% more.
    cartpole[131072] = 90.3e6
    assert autoscale.smallest_within(cartpole) == 65536 and autoscale.doubling_gain(cartpole) > 0.025
    assert autoscale.next_size(cartpole) == 262144
    cartpole[262144] = 91.7e6
    assert autoscale.doubling_gain(cartpole) < 0.025
    assert autoscale.smallest_within(cartpole) == 131072 and autoscale.between(cartpole, 131072) is None
    # DQN: far from saturation, a 16x jump (262,144, which does not split: 131,072 is next).
    dqn = {1024: 0.648e6, 16384: 8.38e6}
    assert autoscale.next_size(dqn) == 262144
    dqn[131072] = 36.2e6
    assert autoscale.between(dqn, 131072) is None
    # Time that did not grow with the size: 16x.
    assert autoscale.next_size({1024: 1e6, 4096: 4e6}) == 65536


def test_the_ceiling_leaves_the_run_its_minimum_of_updates():
    cfg = config_lib.build(dict(auto_scale="throughput"))  # CartPole PPO: 3,000,000 steps of 128
    assert autoscale.ceiling(cfg, PPO, 1) == 128  # 183 updates; 256 would leave 91
    assert autoscale.ceiling(cfg, PPO, 2) == 64
    assert autoscale.ceiling(dataclasses.replace(cfg, auto_scale_min_updates=1), PPO, 1) == 2 ** 14
    assert autoscale.ceiling(dataclasses.replace(cfg, total_timesteps=10 ** 12), PPO, 1) == autoscale.MAX_PER_DEVICE
    # Even 1 per device leaves fewer: 1, and the table says so; none at all is an error.
    assert autoscale.ceiling(dataclasses.replace(cfg, total_timesteps=128 * 50), PPO, 1) == 1
    with pytest.raises(ConfigError, match="less than one update even at 1 environment per device"):
        autoscale.ceiling(dataclasses.replace(cfg, total_timesteps=1000), PPO, 8)
    # AD trains --num-updates whatever its batch.
    ad = dataclasses.replace(cfg, algo="ad", num_updates=10)
    assert autoscale.run_updates(ad, algos.get('ad'), 64, 1) is None and autoscale.ceiling(ad, algos.get('ad'), 1) == autoscale.MAX_PER_DEVICE


class Simulated(autoscale.Search):
    """The search's decisions on a made-up device: steps/s 1e6 n / (n + 4,096), saturating (the
    largest size is always the fastest), 1 KiB of chunk per environment, instant compiles."""

    def _compile_one(self, n):
        row = self.row(n)
        row.compile_s, row.compiled_bytes = 0.0, 1024 * n
        self.trainers[n] = None

    def probe(self, n):
        self.trainers.pop(n)
        row = self.rows[n]
        row.steps_per_s = 1e6 * n / (n + 4096)
        row.update_s = n * self.cfg.num_steps / row.steps_per_s


def simulated_search(total: int):
    cfg = config_lib.build(dict(num_steps=8, total_timesteps=total, auto_scale="throughput"))
    plan = plan_lib.Plan(cfg, None, None, PPO, None)  # no environment: the search is simulated
    search = Simulated(plan, parallel.this_device(), RunLog(None, 0), parallel.setup("pmap"))
    search.first()
    chosen, stop = search.climb()
    return chosen, stop, search


def test_the_fastest_size_is_given_up_for_the_minimum_of_updates():
    free, _, search = simulated_search(LONG)
    assert free >= 16384 and search.rows[free].updates >= 100
    # A total that leaves 100 updates at 1,024 per device, and 50 at 2,048: the search stays at
    # 1,024, the fastest size that leaves 100, and says why not more.
    total = 100 * 1024 * 8 * 8
    chosen, stop, search = simulated_search(total)
    assert chosen == 1024 and max(search.rates()) == 1024 and search.rows[1024].updates == 100
    assert stop == "2,048 leaves 50 updates, fewer than --auto-scale-min-updates 100"
    search.rows[chosen].chosen = True
    table = autoscale.table(search.cfg, search.what, list(search.rows.values()), search.limit, search.source, 1.0, chosen, 8,
                            search.phases, stop, keeps=PPO.auto_scale_keeps)
    assert "2,048        50" in table and table.count("fewer than --auto-scale-min-updates 100") == 2
    assert "1,024 per device" in table and "8,192 over 8 devices, 100 updates" in table


@pytest.mark.slow
def test_a_small_total_is_kept_and_sizes_the_run_for_its_minimum_of_updates(capsys, monkeypatch):
    # 200,000 steps of 8 devices x 8 steps: 16 per device leaves 195 updates, 32 leaves 97 (the
    # old search took 1,024 or more per device, 3 updates, and raised the total to one batch).
    # (memory mode, where the sizes decide: both modes search under the same ceiling, and
    # throughput's choice among sizes this small is the noise of a loaded machine's clock)
    monkeypatch.setattr(log_lib, "HEARTBEAT_S", 0.5)  # every compile is slow enough to say so
    cfg, rows, out = choose(capsys, auto_scale="memory", total_timesteps=200_000)
    assert cfg.total_timesteps == 200_000 and cfg.num_envs == 16 * 8 and cfg.total_updates == 195
    assert rows[16].chosen and rows[32].note == "leaves 97 updates, fewer than --auto-scale-min-updates 100"
    assert all(n <= 32 for n in rows)
    assert "the search stopped: 32 leaves 97 updates, fewer than --auto-scale-min-updates 100" in out
    assert_said_as_it_went(out, rows)
    assert "  ... auto-scale: compiling 16 envs per device: " in out  # the heartbeat of a long wait
    # Even 1 per device leaves fewer than asked: 1, said.
    cfg, rows, out = choose(capsys, auto_scale="memory", total_timesteps=6400, auto_scale_min_updates=200)
    assert cfg.num_envs == 8 and cfg.total_timesteps == 6400 and list(rows) == [1, 2]
    assert "even 1 per device leaves the run 100 updates" in out


@pytest.mark.slow
def test_the_time_budget_ends_the_search(capsys, monkeypatch):
    # 256 and 512 per device (the ceiling: 100 updates) are compiled; 256 is probed, as one size
    # always is, and then the 1 s are spent (the probe takes 1 s more, so a quick compile from
    # the compilation cache does not leave time).
    probe = autoscale.Search.probe

    def slow_probe(self, n):
        probe(self, n)
        time.sleep(1.0)

    monkeypatch.setattr(autoscale.Search, "probe", slow_probe)
    cfg, rows, out = choose(capsys, auto_scale="throughput", total_timesteps=100 * 512 * 64, auto_scale_seconds=1)
    assert cfg.num_envs == 256 * 8 and rows[256].steps_per_s is not None and rows[512].steps_per_s is None
    assert "the climb stopped: the search's budget of 1 s (--auto-scale-seconds) was spent" in out


@pytest.mark.slow
def test_the_choice_is_written_and_a_resume_reuses_it(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setattr(jaxrl_mgpu, "STARTED", time.monotonic() - 1000)  # an interpreter started long ago
    assert run(*SMALL, "--auto-scale", "memory", "--auto-scale-memory", "0.001", "--run-dir", str(run_dir),
               "--stop-at-update", "1") == 0
    out = capsys.readouterr().out
    assert "auto-scale (memory)" in out and "auto-scale: compiled 16 in" in out
    saved = json.loads((run_dir / "config.json").read_text())
    # The largest size that leaves 100 updates of the total given, which config.json keeps.
    assert saved["auto_scale"] == "memory" and saved["num_envs"] == 16 * 8 and saved["total_timesteps"] == 200_000
    # The search's time has a line of its own in the summary, apart from the imports and devices.
    startup = json.loads((run_dir / "summary.json").read_text())["startup"]
    assert list(startup)[:2] == ["imports_and_devices_s", "auto_scale_s"] and startup["auto_scale_s"] > 0
    searched = float(out.split("chose 16 per device")[1].split(" in ")[1].split(" s")[0])
    assert abs(startup["auto_scale_s"] - searched) < 1.0
    # A run started from Python counts from the call, not from the package's import: what it
    # counts without the search, the parsing and the devices, is less than the search's compile.
    assert 0 <= startup["imports_and_devices_s"] < startup["auto_scale_s"]
    assert run("--run-dir", str(run_dir), "--resume", "--stop-at-update", "2") == 0
    out = capsys.readouterr().out
    assert "auto-scale (memory)" not in out, "a resume must not search again"
    assert "auto-scale     memory: --num-envs" in out  # the banner still says how the size was chosen
    assert json.loads((run_dir / "config.json").read_text())["num_envs"] == saved["num_envs"]


@pytest.mark.slow
def test_two_processes_take_process_0s_choice(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "jaxrl_mgpu.launch", "--num-processes", "2", "--devices-per-process",
                          "2", "--", *SMALL, "--auto-scale", "--auto-scale-memory", "0.001", "--run-dir", str(run_dir),
                          "--stop-at-update", "1"],
                         capture_output=True, text=True, timeout=400)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    # decided and printed once: the search's first line, a line per size as it went, the table
    assert text.count("auto-scale (throughput): searching") == 1 and text.count("auto-scale: compiling 32 ") == 1
    assert text.count("auto-scale (throughput): envs per device") == 1
    chosen = json.loads((run_dir / "config.json").read_text())["num_envs"]
    assert f"chose {chosen // 4:,} per device" in text


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--auto-scale", "--num-envs", "64"], "--auto-scale chooses --num-envs itself"),
    (["--auto-scale", "--auto-scale-memory", "0"], "--auto-scale-memory must be in (0, 1]"),
    (["--auto-scale", "--auto-scale-memory", "1.5"], "--auto-scale-memory must be in (0, 1]"),
    (["--auto-scale-memory", "0.5"], "--auto-scale-memory is only for --auto-scale"),
    (["--auto-scale-min-updates", "10"], "--auto-scale-min-updates is only for --auto-scale with --algo ppo, dqn, sac or td3"),
    (["--auto-scale-seconds", "10"], "--auto-scale-seconds is only for --auto-scale"),
    (["--auto-scale", "--auto-scale-min-updates", "0"], "--auto-scale-min-updates must be at least 1"),
    (["--auto-scale", "--auto-scale-seconds", "0"], "--auto-scale-seconds must be at least 1"),
    (["--auto-scale", "fast"], "'fast' is not valid"),
    (["--auto-scale", "--mode", "learn", "--algo", "dqn"], "--auto-scale sizes a --mode both run"),
])
def test_bad_auto_scale_input_is_one_line(argv, message, tmp_path, capsys):
    assert run(*argv, "--run-dir", str(tmp_path / "r")) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_an_occupied_run_directory_is_refused_before_the_search(tmp_path, capsys, monkeypatch):
    """A fresh run's --run-dir that holds a run is refused before --auto-scale compiles or
    probes anything (the search would spend its minutes first), and is left as it was."""
    occupied = tmp_path / "r"
    occupied.mkdir()
    (occupied / "config.json").write_text("{}")
    monkeypatch.setattr(autoscale, "choose", lambda *a, **k: pytest.fail("the search ran"))
    assert run("--auto-scale", *SMALL, "--run-dir", str(occupied)) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --run-dir {occupied} already exists and is not empty; choose a new directory or continue " \
                  f"it with --resume", err
    assert [p.name for p in occupied.iterdir()] == ["config.json"]
