"""Where a py-spy profile's samples went: `python experiments/gpu/pyspy_summary.py FILE...` reads
`py-spy record --format raw --threads [--subprocesses] [--idle]` output (one collapsed stack per
line: frames joined by ';', then a sample count) and prints, per process and thread, its share of
the samples, then for the busiest threads the functions with the most samples: inclusive (the
function or anything it called) and on top of the stack (the function itself)."""
import collections
import re
import sys

TOP = 18


def short(frame: str) -> str:
    """`fn (path/to/file.py:123)` as `fn (file.py:123)`."""
    return re.sub(r"\(([^()]*/)?([^/()]+)\)$", r"(\2)", frame.strip())


for path in sys.argv[1:]:
    threads = collections.defaultdict(collections.Counter)  # (process, thread) -> stack -> samples
    for line in open(path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # --subprocesses puts `process N:"command"` first (a child's after its parent's: keep the
        # innermost; a command may hold ';'), --threads then `thread (id): name`
        process = "process"
        while m := re.match(r'process (\d+):"(.*?)";', stack):
            words = m.group(2).split()
            what = "worker" if "_serve" in m.group(2) else next((w for w in words[1:] if not w.startswith("-")), "")
            process = f"{m.group(1)} {what[:40]}"
            stack = stack[m.end():]
        frames = stack.split(";")
        thread = frames.pop(0) if frames and frames[0].startswith("thread ") else "thread"
        threads[process, thread][tuple(short(f) for f in frames)] += int(count)
    total = sum(sum(c.values()) for c in threads.values())
    print(f"== {path}: {total} samples")
    ranked = sorted(threads.items(), key=lambda kv: -sum(kv[1].values()))
    busiest = sum(ranked[0][1].values()) if ranked else 0
    for (process, thread), stacks in ranked:
        if sum(stacks.values()) < busiest / 50:
            continue  # short-lived threads (Orbax's savers, ...)
        print(f"  {sum(stacks.values()):7d}  {process}  {thread}")
    # the threads that do the work: the learner's (or collector's) main thread, the shard reader,
    # and one worker process (they all do the same); the rest only wait
    shown, worker = [], False
    for (process, thread), stacks in ranked:
        if process.endswith(" worker"):
            if not worker:
                shown.append((process, thread, stacks))
            worker = True
        elif "MainThread" in thread or "shard-reader" in thread:
            shown.append((process, thread, stacks))
    for process, thread, stacks in shown:
        n = sum(stacks.values())
        inclusive, own = collections.Counter(), collections.Counter()
        for frames, c in stacks.items():
            for f in set(frames):
                inclusive[f] += c
            if frames:
                own[frames[-1]] += c
        print(f"-- {process} {thread}: {n} samples\n   inclusive:")
        for f, c in inclusive.most_common(TOP):
            print(f"   {c / n:6.1%}  {f}")
        print("   on top of the stack:")
        for f, c in own.most_common(TOP):
            print(f"   {c / n:6.1%}  {f}")
