"""Wall-clock time from launching a training command to its first log line with a mean return
of at least --target, and to its exit; one JSON line.

    python experiments/gpu/time_to_solve.py --target 475 -- python -m jaxrl_mgpu.train --run-dir /tmp/r

Reads the command's output as it comes: jaxrl_mgpu's progress lines (`... return 487.3 ...`)
and PureJaxRL's debug lines (`global step=..., episodic return=...`, one per finished episode,
averaged over the last --window of them). Also gives the time to the line that says the
training chunk is compiled, where there is one.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import deque

OURS = re.compile(r"^update \d+ .*\breturn ([-\d.]+)")
PUREJAXRL = re.compile(r"episodic return=([-\d.]+)")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--window", type=int, default=100, help="episodes averaged, for per-episode output")
    p.add_argument("--label", default="")
    p.add_argument("--log", default=None, help="also write the command's output here")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    solved = compiled = None
    recent: deque = deque(maxlen=args.window)
    log = open(args.log, "w") if args.log else None
    for line in proc.stdout:
        now = time.perf_counter() - start
        if log:
            log.write(f"{now:8.2f} {line}")
        if compiled is None and "training chunk" in line and " in " in line:
            compiled = now
        if solved is None:
            if m := OURS.search(line):
                if float(m.group(1)) >= args.target:
                    solved = now
            elif m := PUREJAXRL.search(line):
                recent.append(float(m.group(1)))
                if len(recent) == recent.maxlen and sum(recent) / len(recent) >= args.target:
                    solved = now
    proc.wait()
    end = time.perf_counter() - start
    print(json.dumps({"label": args.label, "returncode": proc.returncode, "chunk_ready_s": compiled,
                      "solved_s": solved, "exit_s": round(end, 2)}))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
