"""Medians of profile.rs's lines (stdin, the first run left out): the wall time from the host's call to
each step, and the CPU each step of the run's interpreter took (its `CPU` marks)."""

import ast
import re
import statistics
import sys

STEPS = ["H_cgroup_joined", "H_init_told", "H_layers", "H_reseeded", "H_ready_sent", "request_read", "env_sites",
         "display_installed", "compiled", "imports", "frame", "groupby", "plot", "mime_bundle_png", "display_files",
         "chart_data", "value", "saved_open_figures", "result_encoded"]
rows = []
for line in sys.stdin:
    if not line[0].isdigit() or line.startswith("0 ") or " STDERR " not in line:
        continue
    head, rest = line.split(" STDERR ", 1)
    parts = re.findall(r" (\w+)=\+?(-?[\d.]+)", head)
    total, at, cum = float(dict(parts)["total"]), {}, 0.0
    for name, value in parts:
        if name != "total":
            cum += float(value)
            at[name] = cum
    cpu = [(m.split()[1], int(m.split()[2])) for m in ast.literal_eval(rest) if m.startswith("CPU ")]
    steps = {b: (y - x) / 1e6 for (_, x), (b, y) in zip(cpu, cpu[1:])}
    start = dict(cpu).get("one_shot", cpu[0][1])
    steps["run"] = (cpu[-1][1] - start) / 1e6
    rows.append((total, at, steps))
med = statistics.median
print("runs:", len(rows), " wall p50 ms: total %.1f" % med(r[0] for r in rows), end="")
for mark in ("H_got_fds", "code_start", "result_encoded"):
    if all(mark in r[1] for r in rows):
        print(", %s at %.1f" % (mark, med(r[1][mark] for r in rows)), end="")
print(", after the result %.1f" % med(r[0] - r[1].get("result_encoded", r[0]) for r in rows))
print("CPU p50 ms:", " ".join("%s=%.1f" % (k, med(r[2].get(k, 0.0) for r in rows)) for k in STEPS + ["run"]))
