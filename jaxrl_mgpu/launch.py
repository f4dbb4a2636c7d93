"""`python -m jaxrl_mgpu.launch`: several training processes on this machine, as one job.

    python -m jaxrl_mgpu.launch --num-processes 2 --devices-per-process 4 -- --num-envs 64 ...

starts N `python -m jaxrl_mgpu.train` processes joined by `jax.distributed` through a free
local port, prefixes every output line with `[process id]`, and stops all of them as soon as
one fails (its exit code becomes the launcher's). Each process gets its own devices: K GPUs
through CUDA_VISIBLE_DEVICES where GPUs exist, else K virtual CPU devices. This is how the
multi-host path is tested on one machine; on a cluster start one process per host instead
(README, experiments/slurm/train.sbatch).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return out.stdout.count("GPU ") if out.returncode == 0 else 0


def process_env(index: int, per_process: int | None, gpus: int) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if gpus and per_process:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index * per_process + k) for k in range(per_process))
    elif per_process:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={per_process}"])
    return env


def relay(index: int, stream) -> None:
    for line in stream:
        sys.stdout.write(f"[{index}] {line}")
        sys.stdout.flush()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m jaxrl_mgpu.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="GPUs (or virtual CPU devices) per process; default: GPUs split evenly, or 1 CPU device")
    p.add_argument("--module", default="jaxrl_mgpu.train", help="the module each process runs")
    args = p.parse_args(ours)
    gpus = gpu_count()
    per_process = args.devices_per_process or (gpus // args.num_processes if gpus else None)
    if args.num_processes < 1 or (gpus and per_process and per_process * args.num_processes > gpus):
        print(f"error: --num-processes {args.num_processes} x --devices-per-process {per_process} needs more "
              f"than the {gpus} GPUs here", file=sys.stderr)
        return 2

    address = f"localhost:{free_port()}"
    procs, threads = [], []
    for i in range(args.num_processes):
        cmd = [sys.executable, "-m", args.module, *train_args, "--coordinator-address", address,
               "--num-processes", str(args.num_processes), "--process-id", str(i)]
        proc = subprocess.Popen(cmd, env=process_env(i, per_process, gpus), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        procs.append(proc)
        threads.append(threading.Thread(target=relay, args=(i, proc.stdout), daemon=True))
        threads[-1].start()

    def stop_all(sig=signal.SIGTERM):
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, sig)

    # Ctrl-C / SIGTERM to the launcher go to every process (they save and exit).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop_all(signal.Signals(signum)))
    code = 0
    while any(proc.poll() is None for proc in procs):
        failed = [(i, proc.returncode) for i, proc in enumerate(procs) if proc.returncode not in (None, 0)]
        if failed and code == 0:
            index, code = failed[0]
            print(f"[launch] process {index} exited with code {code}; stopping the others", flush=True)
            stop_all()
            deadline = time.time() + 15
            while time.time() < deadline and any(proc.poll() is None for proc in procs):
                time.sleep(0.1)
            stop_all(signal.SIGKILL)
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=5)
    if code == 0:
        code = next((proc.returncode for proc in procs if proc.returncode), 0)
    return code


if __name__ == "__main__":
    sys.exit(main())
