"""Summary of ncu.sh's reports: per kernel, the launch and throughput figures of the details
page, and the share of warp-stall samples by reason from the per-instruction (SASS) pages.

    python experiments/gpu/ncu_summary.py ncu_details.csv [sass_*.csv ...]"""
import collections
import csv
import sys

METRICS = ["Duration", "Registers Per Thread", "Dynamic Shared Memory Per Block", "Theoretical Occupancy",
           "Achieved Occupancy", "Local Memory Spilling Requests", "DRAM Throughput", "Memory Throughput",
           "L2 Hit Rate", "Compute (SM) Throughput", "Issue Slots Busy", "Eligible Warps Per Scheduler"]

details, *sass = sys.argv[1:]
rows = list(csv.DictReader(open(details)))
kernels = list(dict.fromkeys(r["Kernel Name"] for r in rows))
value = {(r["Kernel Name"], r["Metric Name"]): f"{r['Metric Value']} {r['Metric Unit']}".strip() for r in rows}
print(f"{'':34}" + "".join(f"{k[:22]:>24}" for k in kernels))
for m in METRICS:
    print(f"{m:34}" + "".join(f"{value.get((k, m), '-'):>24}" for k in kernels))

def number(text):
    try:
        return float(text)
    except ValueError:  # blank, or a column that holds no count
        return 0.0


for path in sass:
    kernel_line, *lines = open(path).read().splitlines()
    if not kernel_line.startswith('"Kernel Name"'):  # ncu's error text instead of a source page
        print(f"{path}: no source page ({kernel_line[:80]})")
        continue
    reader = csv.reader(lines)
    header = next(reader)
    stalls = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    totals = collections.Counter()
    for r in reader:
        for i in stalls:
            totals[header[i][len("stall_"):]] += number(r[i])
    total = sum(totals.values()) or 1
    print(f"{next(csv.reader([kernel_line]))[1]:34}stalls: "
          + ", ".join(f"{k} {v / total:.0%}" for k, v in totals.most_common(6)))
