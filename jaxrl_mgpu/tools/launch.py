"""`python -m jaxrl_mgpu.launch`: several training processes on this machine, as one job.

    python -m jaxrl_mgpu.launch --num-processes 2 --devices-per-process 4 -- --num-envs 64 ...

starts N `python -m jaxrl_mgpu.train` processes joined by `jax.distributed` through a free
local port and prefixes every output line with `[process id]` (stdout to stdout, stderr to
stderr; an error line that every process reports alike, once). Each process gets its own
devices: K GPUs through CUDA_VISIBLE_DEVICES where GPUs exist, else K virtual CPU devices. This
is how the multi-host path is tested on one machine; on a cluster start one process per host
instead (README, experiments/slurm/train.sbatch).

Every process is watched. When one fails, the launcher says which and how, and tells the
others (SIGUSR1) that the job is broken: they leave at once with exit code 1 and whatever
complete checkpoints exist, instead of waiting in a collective for the dead process until the
heartbeat timeout aborts them. The launcher's exit code is the failed process's (128 + N for a
process killed by signal N). Ctrl-C or SIGTERM to the launcher go to every process: they
finish the current chunk, save a checkpoint and exit.
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

# A survivor that has not left this long after SIGUSR1 is killed.
GRACE_S = 10.0
# gloo's C++ connection report, printed by every process at start-up; it says nothing a user
# can act on.
NOISE = ("[Gloo] Rank ",)


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


class Relay:
    """Copies each process's output to the launcher's, every line prefixed with `[process id]`:
    stdout to stdout, stderr to stderr. A one-line error that every process reports alike (a bad
    option: each one checks the same command line) is printed once, by the first to say it."""

    def __init__(self):
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, index: int, stream, out) -> None:
        for line in stream:
            if line.startswith(NOISE):
                continue
            with self._lock:
                if line.startswith("error: "):
                    if line in self._said:
                        continue
                    self._said.add(line)
                out.write(f"[{index}] {line}")
                out.flush()


def describe(code: int) -> str:
    """A process's exit status in words."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def exit_status(code: int) -> int:
    """A child's return code as a shell would report it (a signal N as 128 + N)."""
    return 128 - code if code < 0 else code


class _Parser(argparse.ArgumentParser):
    """One error line, exit 2; a training option given before `--` says where it goes."""

    def error(self, message: str):
        hint = (" (the training options go after --: python -m jaxrl_mgpu.launch --num-processes 2 -- --num-envs 64)"
                if message.startswith("unrecognized arguments") else "")
        print(f"error: {message}{hint}", file=sys.stderr)
        sys.exit(2)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = _Parser(prog="python -m jaxrl_mgpu.launch", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-processes", type=int, required=True, help="processes to start (at least 1)")
    p.add_argument("--devices-per-process", type=int, default=None,
                   help="GPUs (or virtual CPU devices) per process; default: the GPUs split evenly, or 1 CPU "
                        "device each")
    p.add_argument("--module", default="jaxrl_mgpu.train", help="the module each process runs")
    return p.parse_args(ours), train_args


def check(args: argparse.Namespace, gpus: int) -> int | None:
    """Devices per process (None: the CPU default), or an error message's exit via SystemExit."""
    if args.num_processes < 1:
        raise SystemExit(f"error: --num-processes must be at least 1, got {args.num_processes}")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        raise SystemExit(f"error: --devices-per-process must be at least 1, got {args.devices_per_process}")
    if not gpus:
        return args.devices_per_process
    per_process = args.devices_per_process or gpus // args.num_processes
    if per_process < 1 or per_process * args.num_processes > gpus:
        raise SystemExit(f"error: --num-processes {args.num_processes} x --devices-per-process "
                         f"{args.devices_per_process or 1} needs more than the {gpus} GPUs of this machine")
    return per_process


def main(argv=None) -> int:
    args, train_args = parse(sys.argv[1:] if argv is None else list(argv))
    gpus = gpu_count()
    try:
        per_process = check(args, gpus)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2

    address = f"localhost:{free_port()}"
    procs, threads, relay = [], [], Relay()
    for i in range(args.num_processes):
        cmd = [sys.executable, "-m", args.module, *train_args, "--coordinator-address", address,
               "--num-processes", str(args.num_processes), "--process-id", str(i)]
        proc = subprocess.Popen(cmd, env=process_env(i, per_process, gpus), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            threads.append(threading.Thread(target=relay, args=(i, stream, out), daemon=True))
            threads[-1].start()

    def signal_all(sig):
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    # Ctrl-C / SIGTERM to the launcher go to every process (they save and exit).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: signal_all(signal.Signals(signum)))
    failed = None  # (index, return code) of the first process that failed
    while True:
        codes = [proc.poll() for proc in procs]  # every process, every time
        if all(code is not None for code in codes):
            break
        if failed is None:
            failed = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None:
                running = [i for i, c in enumerate(codes) if c is None]
                print(f"[launch] process {failed[0]} {describe(failed[1])}; stopping process(es) "
                      f"{', '.join(map(str, running))}", flush=True)
                signal_all(signal.SIGUSR1)
                deadline = time.monotonic() + GRACE_S
        elif time.monotonic() > deadline:
            late = [i for i, proc in enumerate(procs) if proc.poll() is None]
            print(f"[launch] process(es) {', '.join(map(str, late))} still running {GRACE_S:.0f}s after the stop; "
                  f"killing them", flush=True)
            signal_all(signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.1)
    for t in threads:
        t.join(timeout=5)
    if failed is None:
        failed = next(((i, proc.returncode) for i, proc in enumerate(procs) if proc.returncode), None)
    return 0 if failed is None else exit_status(failed[1])


if __name__ == "__main__":
    sys.exit(main())
