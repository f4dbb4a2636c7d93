"""`python -m jaxrl_mgpu.train`: config -> devices -> algorithm -> runner.

With no arguments it trains PPO on CartPole-v1 on all local devices.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel, runner
from jaxrl_mgpu.algos import ALGOS
from jaxrl_mgpu.config import ConfigError
from jaxrl_mgpu.envs import EnvError
from jaxrl_mgpu.log import RunLog
from jaxrl_mgpu.parallel import ParallelError

USER_ERRORS = (ConfigError, ParallelError, EnvError)


def fail(error: Exception) -> None:
    """Bad input: one line naming the problem, exit code 2, no traceback."""
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


def choose_run_dir(cfg) -> Path:
    """The run directory, checked (not created): a run directory is never clobbered."""
    path = Path(cfg.run_dir or f"runs/{cfg.env}-{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"--run-dir {path} already exists and is not empty; choose a new directory")
    return path


def banner(cfg, par: parallel.Parallel, layout: dict) -> dict:
    device = par.devices[0]
    envs, minibatch = layout["envs"], layout["minibatch"]
    return {
        "jaxrl_mgpu": f"{cfg.algo} on {cfg.env}, policy {cfg.policy}",
        "processes": f"{jax.process_count()} (this is process {jax.process_index()})",
        "devices": f"{par.num_local_devices} local, {par.num_devices} global: "
                   f"{getattr(device, 'device_kind', device.platform)} ({device.platform})",
        "parallel": f"{par.backend} over axis '{parallel.AXIS}'",
        "environments": f"{envs[0]} global, {envs[1]} per device",
        "minibatch": f"{minibatch[0]} global, {minibatch[1]} per device",
        "batch per update": f"{cfg.batch_size} transitions ({cfg.num_envs} envs x {cfg.num_steps} steps)",
        "updates": f"{cfg.num_updates}, {cfg.log_every} per compiled chunk",
        "precision": cfg.precision,
        "run dir": cfg.run_dir,
    }


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = config_lib.from_args(argv)
        par = parallel.setup(cfg.parallel, cfg.devices)
        layout = ALGOS[cfg.algo].check(cfg, par.num_devices)
        run_dir = choose_run_dir(cfg)
    except USER_ERRORS as e:
        fail(e)
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))

    if parallel.is_main():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(config_lib.dump(cfg))
    log = RunLog(run_dir, cfg.num_updates * cfg.batch_size)
    log.banner(banner(cfg, par, layout))
    try:
        trainer = runner.Trainer(cfg, par)
        _, last = runner.train(trainer, log)
    finally:
        log.close()
    ret = last.get("episode_return")
    log.print(f"done: {last.get('env_steps', 0):,} env steps in {last.get('time', 0):.0f}s, "
              f"final mean episode return {ret:.1f}" if ret == ret else "done")
    log.print(f"results in {run_dir}/: config.json, metrics.jsonl, TensorBoard events "
              f"(tensorboard --logdir {run_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
