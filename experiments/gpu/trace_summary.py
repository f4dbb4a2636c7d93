"""Where a jax.profiler trace spends device time: `python experiments/gpu/trace_summary.py DIR...`
prints, per trace under each DIR, the kernels per profiled call, device busy time against the
wall span of the device events, and the top kernels by time (from the .trace.json.gz that
`bench --profile` or `train --profile` writes). `--host` reads the CPU events instead (for a CPU-only trace);
`--all` lists every kernel, not the top 25."""
import collections
import glob
import gzip
import json
import sys

host = "--host" in sys.argv
top = None if "--all" in sys.argv else 25
for root in [a for a in sys.argv[1:] if a not in ("--host", "--all")]:
    for path in sorted(glob.glob(f"{root}/**/*.trace.json.gz", recursive=True)):
        events = json.load(gzip.open(path))["traceEvents"]
        procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
        want = {p for p, n in procs.items() if ("/host:CPU" in n if host else "/device:GPU:0" in n)}
        kernels = [e for e in events if e.get("ph") == "X" and e.get("pid") in want and "dur" in e]
        if not kernels:
            print(f"{path}: no device events ({sorted(set(procs.values()))})")
            continue
        # Only the compute stream(s): skip memcpy rows, count every kernel once.
        by_name = collections.defaultdict(lambda: [0.0, 0])
        for e in kernels:
            by_name[e["name"]][0] += e["dur"]
            by_name[e["name"]][1] += 1
        busy = sum(e["dur"] for e in kernels)
        span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
        print(f"== {path.split(root)[-1] or path}\n   {len(kernels)} device events, busy {busy / 1e3:.2f} ms "
              f"over a {span / 1e3:.2f} ms span (2 profiled calls)")
        for name, (dur, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"   {dur / 1e3:9.3f} ms {100 * dur / busy:5.1f}%  x{n:<6} {name[:110]}")
