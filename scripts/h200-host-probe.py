"""Characterise a lent GPU host's own noise in about 90 s, with plain torch (no vLLM, no staging).

Why: the Qwen ledger's H200 visits measured the same points with window spreads of 20-50% on some visits and under
2% on another (reports/evidence/2026-12-03-h200-v3-qwen-bf16-visit4). A serving step of a 1.5B model is bound by the
host's CPU (Python, scheduling, kernel launches) more than by the GPU, so this probe times exactly those, in slices,
beside the hypervisor's steal time: a host whose slices spread widely, or that shows steal, is a noisy host before any
engine starts. Then it pins the same Python slice to each vCPU in turn, twice, to tell a slow vCPU from a slow
moment. Writes $OUT/host-probe.json and prints a summary.

    python3 scripts/h200-host-probe.py [SECONDS]                 on the GPU machine
    python3 scripts/h200-host-probe.py --plot PROBE.json OUT.png    here: the slices over time
    python3 scripts/h200-host-probe.py --vcpu-map OUT.png LABEL=PROBE.json|LEDGER.json ...
                                                                  here: each vCPU's loop time, moment by moment
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specledger.measure.fingerprint import host_slice_ms  # noqa: E402


def proc_stat() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def steal_share(before: list[int], after: list[int]) -> float:
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return d[7] / total if total > 0 else 0.0


def spread(values: list[float]) -> dict[str, float]:
    mean = statistics.fmean(values)
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "cv": statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0}


def python_slice_s() -> float:
    """Seconds for one run of fingerprint's loop, the interpreter work of a scheduler step (the loop every window
    and every run records, so the probe's figures and the ledgers' compare)."""
    return host_slice_ms(1) / 1e3


def smi() -> str:
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True)
    return (r.stdout or r.stderr).strip()


def plot(probe_path: str, png_path: str) -> None:
    """Each slice's pure-Python time, launch latency and steal over the probe's run, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(probe_path) as f:
        slices = json.load(f)["slices"]
    t = [0.0]
    for s in slices[:-1]:
        t.append(t[-1] + s["python_s"] + s["launch_2000_s"] + s["matmul_10_s"])
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    panels = (("python_s", 1e3, "pure-Python slice (ms)"), ("launch_2000_s", 1e6 / 2000, "launch latency (us/kernel)"),
              ("steal_share", 100, "CPU steal (% of all CPUs)"))
    for ax, (key, scale, label) in zip(axes, panels, strict=True):
        ax.plot(t, [s[key] * scale for s in slices], lw=0.7)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds into the probe")
    fig.suptitle(f"lent H200 host, {len(slices)} slices: the same CPU work, timed back to back")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def vcpu_columns(label: str, path: str) -> list[tuple[str, dict[str, float]]]:
    """Per-vCPU loop times (ms) at each moment a file saw them: a probe's two passes, or the host state a ledger's
    latest run recorded (``provenance.machine.host_loop_ms_by_cpu``, only the vCPUs that run was allowed)."""
    with open(path) as f:
        data = json.load(f)
    if "summary" in data:
        per_cpu = data["summary"]["per_cpu_python_ms"]
        return [(f"{label} pass {i + 1}", {c: v[i] for c, v in per_cpu.items()}) for i in range(2)]
    by_cpu = ((data.get("provenance") or {}).get("machine") or {}).get("host_loop_ms_by_cpu")
    if not by_cpu:
        raise SystemExit(f"{path}: neither a probe (summary.per_cpu_python_ms) nor a ledger with "
                         "provenance.machine.host_loop_ms_by_cpu")
    return [(label, by_cpu)]


def vcpu_map(png_path: str, sources: list[str]) -> None:
    """One column a moment, one row a vCPU, coloured by the loop's time: does a vCPU keep its speed?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    columns = [col for src in sources for col in vcpu_columns(*src.split("=", 1))]
    cpus = sorted({c for _, times in columns for c in times}, key=int)
    grid = np.array([[times.get(c, np.nan) for _, times in columns] for c in cpus], dtype=float)
    fig, ax = plt.subplots(figsize=(1.1 * len(columns) + 2.5, 0.32 * len(cpus) + 1.8))
    image = ax.imshow(grid, aspect="auto", cmap="RdYlGn_r", vmin=np.nanmin(grid), vmax=np.nanmax(grid))
    for (row, col), ms in np.ndenumerate(grid):
        if not np.isnan(ms):
            ax.text(col, row, f"{ms:.1f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(columns)), [label for label, _ in columns], rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(cpus)), [f"vCPU {c}" for c in cpus], fontsize=8)
    fig.colorbar(image, ax=ax, label="pure-Python loop (ms), pinned to the vCPU")
    ax.set_title("each vCPU's speed at each moment (blank: not allowed in that run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


def main() -> int:
    if sys.argv[1:2] == ["--plot"]:
        plot(sys.argv[2], sys.argv[3])
        return 0
    if sys.argv[1:2] == ["--vcpu-map"]:
        vcpu_map(sys.argv[2], sys.argv[3:])
        return 0
    import torch

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    out = os.environ.get("OUT", "/tmp")
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    tiny = torch.zeros(64, device=dev)
    torch.cuda.synchronize()
    result: dict = {"nvidia_smi_start": smi(), "slices": []}
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        s0 = proc_stat()
        py_s = python_slice_s()
        t0 = time.perf_counter()
        for _ in range(2000):  # launch-bound: 2,000 tiny kernels, the shape of a small model's decode step
            tiny.add_(1.0)
        torch.cuda.synchronize()
        launch_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        mm_s = time.perf_counter() - t0
        result["slices"].append({"python_s": py_s, "launch_2000_s": launch_s, "matmul_10_s": mm_s,
                                 "steal_share": steal_share(s0, proc_stat())})
    result["nvidia_smi_end"] = smi()
    # Is the slow speed a property of some vCPUs (a hyperthread sibling busy with another guest) or of the whole VM?
    # Pin to each vCPU in turn, twice over: a vCPU slow in both sweeps is slow by placement, not by moment.
    cpus = sorted(os.sched_getaffinity(0))
    result["per_cpu"] = {str(c): [] for c in cpus}
    for _ in range(2):
        for c in cpus:
            os.sched_setaffinity(0, {c})
            result["per_cpu"][str(c)] += [python_slice_s() for _ in range(15)]
    os.sched_setaffinity(0, set(cpus))
    sl = result["slices"]
    result["summary"] = {
        "python_s": spread([s["python_s"] for s in sl]),
        "launch_us_per_kernel": spread([s["launch_2000_s"] / 2000 * 1e6 for s in sl]),
        "matmul_tflops": spread([10 * 2 * 8192**3 / s["matmul_10_s"] / 1e12 for s in sl]),
        "steal_share": spread([s["steal_share"] for s in sl]),
        "per_cpu_python_ms": {c: [round(statistics.median(v[:15]) * 1e3, 2), round(statistics.median(v[15:]) * 1e3, 2)]
                              for c, v in result["per_cpu"].items()},
    }
    result["cpu"] = {"logical": os.cpu_count(), "loadavg": os.getloadavg()}
    with open(os.path.join(out, "host-probe.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("nvidia_smi_start", "nvidia_smi_end", "summary", "cpu")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
