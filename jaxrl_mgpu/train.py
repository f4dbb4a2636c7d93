"""`python -m jaxrl_mgpu.train`: config -> devices -> algorithm -> runner.

With no arguments it trains PPO on CartPole-v1 on all local devices. The same command with
`--resume` continues the run in `--run-dir` from its latest complete checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

import jax

# Only light imports here: environments (gymnax) start JAX's backend when imported, and
# `jax.distributed.initialize` must come first, so they are imported inside main().
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.config import ConfigError  # envs.EnvError is a ConfigError
from jaxrl_mgpu.log import RunLog, truncate_metrics
from jaxrl_mgpu.parallel import DistributedError, ParallelError

USER_ERRORS = (ConfigError, ParallelError, DistributedError)


def fail(error: Exception) -> None:
    """Bad input: one line naming the problem, exit code 2, no traceback."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def plan_run_dir(cfg) -> tuple[Path, int | None]:
    """The run directory and the checkpoint step to resume from (None: a fresh start).
    Checks only; creates nothing. A run directory is never clobbered."""
    from jaxrl_mgpu.algos import ALGOS
    from jaxrl_mgpu.checkpoint import Checkpoints
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(parallel.broadcast(int(time.time()))))
    path = Path(cfg.run_dir or f"runs/{cfg.env}-{cfg.algo}-{stamp}")  # the same name on every process
    occupied = path.exists() and (not path.is_dir() or any(path.iterdir()))
    if not cfg.resume:
        if occupied:
            raise ConfigError(f"--run-dir {path} already exists and is not empty; choose a new directory "
                              f"or continue it with --resume")
        return path, None
    if not occupied:
        if cfg.resume == "auto":
            return path, None
        raise ConfigError(f"--resume: --run-dir {path} holds no run to resume")
    saved_path = path / "config.json"
    if not saved_path.is_file():
        raise ConfigError(f"--resume: --run-dir {path} is not a run directory (no config.json)")
    saved = json.loads(saved_path.read_text())
    differ = config_lib.incompatible(saved, cfg, config_lib.STATE_KEYS + ALGOS[cfg.algo].STATE_KEYS)
    if differ:
        raise ConfigError(f"--resume: the run in {path} has a different {', '.join(differ)}")
    step = Checkpoints(path, read_only=True).latest_step() if (path / "checkpoints").is_dir() else None
    if step is None and cfg.resume == "latest":
        raise ConfigError(f"--resume: the run in {path} has no complete checkpoint (use --resume auto to start it over)")
    return path, step


def banner(cfg, par: parallel.Parallel, layout: dict, per_update: str) -> dict:
    """The start-up summary of the distributed setup. `layout` is the algorithm's
    {what: (global, per device)} split of the batch (its `check`)."""
    device = par.devices[0]
    rows = {
        "jaxrl_mgpu": f"{cfg.algo} on {cfg.env}" + ("" if cfg.algo == "ad" else f", policy {cfg.policy}")
                      + ("" if cfg.mode == "both" else f", --mode {cfg.mode}"),
        "processes": f"{jax.process_count()} (this is process {jax.process_index()})",
        "devices": f"{par.num_local_devices} local, {par.num_devices} global: "
                   f"{getattr(device, 'device_kind', device.platform)} ({device.platform})",
        "parallel": f"{par.backend} over axis '{parallel.AXIS}'",
    }
    rows.update({what: f"{total} global, {per_device} per device" for what, (total, per_device) in layout.items()})
    rows.update({
        "per update": per_update,
        "updates": f"{cfg.total_updates}, {cfg.log_every} per compiled chunk",
        "precision": f"{cfg.precision} compute, fp32 params" + (f", {cfg.grad_accum} micro-batches per step"
                                                                if cfg.grad_accum > 1 else ""),
        **({"kernels": f"attention {cfg.attention}, mlp {cfg.mlp}"
                       + ("" if device.platform == "gpu" or "pallas" not in (cfg.attention, cfg.mlp)
                          else f" (no GPU: the Pallas kernels run through the Pallas interpreter on "
                               f"{device.platform}, correct but slow)")}
           if (cfg.attention, cfg.mlp) != ("xla", "xla") else {}),
        "run dir": cfg.run_dir,
    })
    return rows


class StopSignal:
    """SIGTERM (cluster preemption) or SIGINT (Ctrl-C): finish the current chunk, save, exit 0.
    A second signal, a second or more after the first, stops at once. Closer together they are
    one request: `timeout` and some schedulers signal the process and then its whole process
    group, so the same request arrives twice within microseconds."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    REPEAT_S = 1.0  # a signal this soon after the first is the same request

    def __init__(self, log):
        self.requested, self.log, self.first_at = False, log, 0.0
        self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        if self.requested:
            if time.monotonic() - self.first_at < self.REPEAT_S:
                return
            raise KeyboardInterrupt
        self.requested, self.first_at = True, time.monotonic()
        self.log.print(f"{signal.Signals(signum).name}: stopping after the current chunk, with a checkpoint")

    def __call__(self) -> bool:
        # Every process must stop at the same chunk, even if the signal reached only some.
        return parallel.any_process(self.requested)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = config_lib.parse_args(argv)
        parallel.initialize(cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.local_device_ids,
                            cfg.failure_timeout)
        cfg = config_lib.validate(cfg)
        from jaxrl_mgpu import elastic, elastic_ad, runner
        from jaxrl_mgpu.algos import ALGOS
        from jaxrl_mgpu.checkpoint import CheckpointMismatch, Checkpoints
        # --mode learn|collect: DQN from episodes, or AD from learning histories, in the run's store
        asynchronous = elastic_ad if cfg.algo == "ad" else elastic
        par = parallel.setup(cfg.parallel, cfg.devices)
        config_lib.check_platform(cfg, par.devices[0].platform)
        layout = (ALGOS[cfg.algo].check if cfg.mode == "both" else asynchronous.check)(cfg, par.num_devices)
        if cfg.mode == "collect":
            if not cfg.run_dir:
                raise ConfigError("--mode collect needs --run-dir: the run whose store it fills")
            return collect(cfg, par, asynchronous)
        run_dir, resume_step = plan_run_dir(cfg)
    except USER_ERRORS as e:
        fail(e)
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))

    parallel.barrier("run directory checked")  # every process checks it before process 0 writes in it
    # A learner (--mode learn) has no trainer: it counts its own updates, and the env steps
    # are the collectors'.
    trainer = runner.Trainer(cfg, par) if cfg.mode == "both" else None
    # The trainer builds its fresh state in runner.train; a learner starts from this one.
    state, state_layout = (None, None) if trainer is not None else asynchronous.initial_state(cfg, par)
    if resume_step is not None:
        # Restored before process 0 rewrites config.json and metrics.jsonl, so that a checkpoint
        # this version cannot read leaves the run directory as it was.
        target, state_layout = (trainer.init_state(), trainer.layout) if trainer is not None else (state, state_layout)
        reader = Checkpoints(run_dir, read_only=True)
        try:
            state, recreated = reader.restore(resume_step, target, state_layout, par)
        except CheckpointMismatch as e:
            fail(ConfigError(f"--resume: {e}"))
        finally:
            reader.close()
    if parallel.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(config_lib.dump(cfg))
        # Rows logged after the checkpoint we resume from are logged again by this run.
        truncate_metrics(run_dir / "metrics.jsonl", resume_step or 0)
    parallel.barrier("run directory ready")
    if trainer is not None:
        unit, per_update = trainer.step_unit, trainer.steps_per_update
        log = RunLog(run_dir, cfg.total_updates * per_update, unit=unit)
        log.banner(banner(cfg, par, layout, f"{per_update:,} {unit}"))
    else:
        unit = "env_steps"  # received from the collectors
        log = RunLog(run_dir, cfg.total_updates, unit="update")
        log.banner(banner(cfg, par, layout, asynchronous.per_update(cfg)))
    ckpts = Checkpoints(run_dir, keep=cfg.keep_checkpoints)
    start = 0
    if resume_step is None:
        if cfg.resume == "auto":
            log.print("  --resume auto: no checkpoint yet, starting fresh")
    elif trainer is not None:  # (a learner says where it resumed in elastic.start)
        start = resume_step
        log.print(f"  resumed from the checkpoint at update {start} ({start * per_update:,} {unit})"
                  + (f"; re-created {', '.join(recreated)} (the saved ones do not fit {par.num_devices} devices"
                     f" x {cfg.num_envs} envs)" if recreated else ""))

    stop = StopSignal(log)
    try:
        if cfg.mode == "learn":
            last = asynchronous.learn(cfg, par, run_dir, log, ckpts, stop, resume_step, state)
            done = cfg.total_updates  # the learner stops on env steps received, not on updates
        else:
            hooks = trainer_hooks(cfg, trainer, par, ckpts, stop)
            _, last, done = runner.train(trainer, log, state, start, hooks, stop_at=cfg.stop_at_update)
    except runner.NonFinite as e:
        ckpts.wait()
        last_good = ckpts.latest_step()
        print(f"error: {e}; stopped, the last good checkpoint is at update {last_good}", file=sys.stderr)
        return 1
    finally:
        stop.restore()
        log.close()
        ckpts.close()  # waits for the asynchronous saves
    ret = last.get("episode_return")
    summary = f"final mean episode return {ret:.1f}" if ret is not None and ret == ret else "no episode finished"
    if done < cfg.total_updates:
        log.print(f"stopped at update {done} of {cfg.total_updates} with a checkpoint; continue with --resume")
    log.print(f"done: {last.get(unit, 0):,} {unit} in {last.get('time', 0):.0f}s, {summary}")
    log.print(f"results in {run_dir}/: config.json, metrics.jsonl, TensorBoard events, checkpoints/ "
              f"(tensorboard --logdir {run_dir})")
    return 0


def trainer_hooks(cfg, trainer, par: parallel.Parallel, ckpts, stop):
    """What `--mode both` does between chunks (runner.Hooks): checkpoints, and evaluations that
    also keep the best parameters so far (checkpoints/best)."""
    from jaxrl_mgpu import runner
    unit, per_update = trainer.step_unit, trainer.steps_per_update
    best = {"return": float("-inf")}

    def meta(update):
        return {"update": update, unit: update * per_update, "num_envs": cfg.num_envs, "config": cfg.to_dict()}

    def checkpoint(update, state):
        ckpts.save(update, state, trainer.layout, par, meta(update))

    def evaluate(update, state):
        result = trainer.evaluate(state.params, update)
        if result["mean_return"] > best["return"]:
            best["return"] = result["mean_return"]
            ckpts.save_best(update, state.params, par, {**meta(update), "eval": result})
        return {"eval/episode_return": result["mean_return"], "eval/episode_return_std": result["std_return"]}

    return runner.Hooks(checkpoint=checkpoint, evaluate=evaluate if cfg.eval_every else None, stop_requested=stop)


def collect(cfg, par, asynchronous) -> int:
    """`--mode collect`: no run directory of its own; it adds episodes (or, for --algo ad,
    learning histories) to `--run-dir`'s store."""
    log = RunLog(None, 0)
    log.print(f"collector on {par.num_devices} {par.devices[0].platform} device(s), "
              + (f"{cfg.ad_history_tasks} tasks" if cfg.algo == "ad" else f"{cfg.num_envs} envs")
              + f", store {cfg.run_dir}/store")
    stop = StopSignal(log)
    try:
        total = asynchronous.collect(cfg, par, log, stop)
    finally:
        stop.restore()
    log.print(f"collector done: {total:,} env steps written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
