"""Hardware fingerprint and machine load: when speed figures may be compared, and when not to record.

Why: a committed ledger once named its processor only as ``x86_64``, so a fresh 2.45x against a committed 2.08x
could not be told apart from a different machine. Verification compares multipliers and throughput only where
``differences(recorded, machine_fingerprint(...))`` is empty; otherwise the figures are shown as "not comparable".
Recording refuses a machine where other processes use a noticeable share of the CPU (``is_busy``), because their
load moves throughput in ways the repeats cannot tell from the engine's own noise.

Plain functions on /proc, ``os`` and psutil: no vLLM or torch import, so this works on a plain CPU install.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

COMPARABLE_KEYS: tuple[str, ...] = (
    "cpu_model", "cpu_vendor", "cpu_family", "cpu_model_number", "cpu_flags_sha256", "logical_cpus",
    "accelerator", "accelerator_count", "gpu_driver", "engine", "torch",
)
"""Keys that must agree for throughput and multipliers to be comparable.

cpu_model, cpu_vendor, cpu_family, cpu_model_number: the core design sets per-core speed (a VM's model name can be
as vague as "AMD EPYC"; family and model number pin the generation). cpu_flags_sha256: the ISA extensions (AVX-512,
bf16, AMX) pick different kernels in the CPU engine, and one model name can expose different flags in different VMs.
logical_cpus: the CPUs this process may use set the engine's threads and its contention. accelerator,
accelerator_count, gpu_driver: on a GPU the GPU does the work, and the driver changes kernels and clocks. engine,
torch: the software picks the kernels and the scheduler.
Not compared: memory_gib (VMs of one shape differ by a few hundred MiB, and memory does not set speed while the model
fits), cpu_stepping (a silicon revision of one design; clouds mix steppings within one instance type, so comparing it
would call equal machines different), hypervisor (a cpu flag, so a change already shows in cpu_flags_sha256). A
kernel that names new flags changes the hash too: that errs towards "not comparable", the safe side.
"""

HOST_KEYS: tuple[str, ...] = (
    "cpu_model", "cpu_vendor", "cpu_family", "cpu_model_number", "cpu_flags_sha256", "logical_cpus",
)
"""The comparable keys the host tells without an engine (the CPU's design and flags, the CPUs this process may use):
a difference in them is known before any engine starts. The GPU, driver, engine and torch come from the engines."""


VECTOR_FLAGS: frozenset[str] = frozenset({
    "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",  # x86
    "asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm",  # ARM
})
"""The CPU flags that pick the CPU engine's kernels. Recorded in the clear as ``cpu_vector_flags`` (not compared:
``cpu_flags_sha256`` covers every flag) so that "not comparable" can say what differs: one CI machine without
AVX-512 ran the CPU engine five times slower than the one that recorded the CPU ledgers."""


def _cpuinfo_first_block(text: str) -> dict[str, str]:
    """Fields of the first processor block of /proc/cpuinfo (all logical CPUs of one machine report the same)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _logical_cpus() -> int:
    """CPUs this process may run on (a container or taskset can allow fewer than the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _installed_version(dist: str) -> str | None:
    """Version from package metadata, so the fingerprint never imports torch (seconds, and gigabytes)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_fingerprint(*, accelerator: Mapping[str, Any] | None = None, engine: Mapping[str, Any] | None = None,
                        torch_version: str | None = None, cpuinfo_text: str | None = None) -> dict[str, Any]:
    """The ledger's ``provenance.machine`` object. ``accelerator`` is the dict engines.accelerator() reports,
    ``engine`` is {"name", "version"}; ``torch_version`` defaults to the installed torch's metadata;
    ``cpuinfo_text`` replaces /proc/cpuinfo (tests)."""
    text = cpuinfo_text
    if text is None:
        with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    info = _cpuinfo_first_block(text) if text else {}
    flags_text = info.get("flags", info.get("Features"))  # x86 names them flags, ARM Features
    flags = sorted(set(flags_text.split())) if flags_text is not None else None
    acc = dict(accelerator or {})
    kind = acc.get("kind")
    return {
        "cpu_model": info.get("model name") or platform.processor() or platform.machine() or None,
        "cpu_vendor": info.get("vendor_id") or info.get("CPU implementer"),
        "cpu_family": info.get("cpu family"),
        "cpu_model_number": info.get("model"),
        "cpu_stepping": info.get("stepping"),
        "cpu_flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16] if flags is not None else None,
        "cpu_vector_flags": " ".join(f for f in flags if f in VECTOR_FLAGS) if flags is not None else None,
        "logical_cpus": _logical_cpus(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "hypervisor": ("hypervisor" in flags) if flags is not None else None,
        "accelerator": None if kind is None else "cpu" if kind == "cpu" else acc.get("name"),
        "accelerator_count": acc.get("count", 1) if kind is not None else None,
        "gpu_driver": acc.get("driver") if kind not in (None, "cpu") else None,
        "engine": f"{engine['name']} {engine['version']}" if engine else None,
        "torch": torch_version if torch_version is not None else _installed_version("torch"),
    }


def differences(recorded: Mapping[str, Any] | None, current: Mapping[str, Any],
                keys: tuple[str, ...] = COMPARABLE_KEYS) -> dict[str, tuple[Any, Any]]:
    """Comparable key -> (recorded, current) where they differ (``keys``: `HOST_KEYS` before the engines are up).
    A ledger without a fingerprint, or without a key, counts as different for it: a machine nobody recorded is not
    known to be this one."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in keys:
        if recorded is None or key not in recorded or recorded[key] != current.get(key):
            out[key] = (None if recorded is None else recorded.get(key), current.get(key))
    return out


def describe_differences(diff: Mapping[str, tuple[Any, Any]], recorded: Mapping[str, Any] | None = None,
                         current: Mapping[str, Any] | None = None) -> str:
    """One line: ``cpu_model 'Intel Xeon' here vs 'AMD EPYC' recorded; logical_cpus 8 vs 2``. Given both
    fingerprints, a flags difference also names the vector flags (``cpu_vector_flags``, where recorded)."""
    if not diff:
        return "same machine"
    parts = [f"{key} {cur!r} vs {rec!r}" for key, (rec, cur) in diff.items()]
    key, (rec, cur) = next(iter(diff.items()))
    parts[0] = f"{key} {cur!r} here vs {rec!r} recorded"
    if "cpu_flags_sha256" in diff and current is not None and current.get("cpu_vector_flags") is not None:
        there = (recorded or {}).get("cpu_vector_flags")
        parts.append(f"vector flags {current['cpu_vector_flags']!r} here vs "
                     + (f"{there!r}" if there is not None else "not recorded there"))
    return "; ".join(parts)


def another_machine(recorded: Mapping[str, Any] | None, current: Mapping[str, Any],
                    keys: tuple[str, ...] = COMPARABLE_KEYS) -> str | None:
    """Why ``current`` is another machine than ``recorded`` over ``keys`` (None: the same), as a verdict's or a
    refused start's reason says it."""
    diff = differences(recorded, current, keys=keys)
    return f"another machine: {describe_differences(diff, recorded, current)}" if diff else None


@dataclass(frozen=True)
class LoadSample:
    """Machine load around a recording: the 1-minute load average, and the share of all CPU capacity (all logical
    CPUs = 1.0) that processes outside the recording's own process tree used."""

    loadavg_1m: float
    others_cpu_share: float

    def as_json(self) -> dict[str, float]:
        return {"loadavg_1m": round(self.loadavg_1m, 3), "others_cpu_share": round(self.others_cpu_share, 3)}


def run_root() -> psutil.Process:
    """The process whose tree is this run: this process, or under pytest-xdist the controller that started the
    workers. Its other workers are this run, each on its own cores (``gpu_assignment``), not a neighbour's load:
    counted as others, a sibling worker's tests made the busy share flip between runs on a 2-core machine
    (2026-12-07, `-n 2`: 0.50 against a 0.40 bound)."""
    me = psutil.Process()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        with contextlib.suppress(psutil.NoSuchProcess):
            parent = me.parent()
            if parent is not None:
                return parent
    return me


def _own_tree(own_pids: Iterable[int] | None) -> set[psutil.Process]:
    """This run (``run_root``), the given pids, and all their descendants (Process identity includes its start
    time, so a reused pid is a different process)."""
    roots = [run_root()]
    for pid in own_pids or ():
        with contextlib.suppress(psutil.NoSuchProcess):
            roots.append(psutil.Process(pid))
    tree = set(roots)
    for root in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            tree.update(root.children(recursive=True))
    return tree


def _tree_cpu_s(tree: Iterable[psutil.Process]) -> dict[psutil.Process, tuple[float, int | None]]:
    """CPU seconds (user + system, reaped children included) and parent pid of each live process."""
    out: dict[psutil.Process, tuple[float, int | None]] = {}
    for proc in tree:
        try:
            t = proc.cpu_times()
            out[proc] = (t.user + t.system + t.children_user + t.children_system, proc.ppid())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def _total_cpu_s(t: Any) -> float:
    """All CPU seconds in psutil.cpu_times() `t`, each once: guest time is already inside user and nice (Linux counts
    it twice in /proc/stat), so it is left out."""
    return sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _busy_cpu_s() -> float:
    """System-wide busy CPU seconds: all but idle and iowait."""
    t = psutil.cpu_times()
    return _total_cpu_s(t) - t.idle - getattr(t, "iowait", 0.0)


def sample_load(interval_s: float = 1.0, *, own_pids: Iterable[int] | None = None) -> LoadSample:
    """Load average, and the CPU share that processes outside our tree used during ``interval_s``."""
    before = _tree_cpu_s(_own_tree(own_pids))
    busy0, start = _busy_cpu_s(), time.monotonic()
    time.sleep(interval_s)
    busy1, elapsed_s = _busy_cpu_s(), time.monotonic() - start
    after = _tree_cpu_s(_own_tree(own_pids))
    own_s = sum(cpu_s - before.get(proc, (0.0, None))[0] for proc, (cpu_s, _) in after.items())
    live_pids = {proc.pid for proc in after}
    for proc, (cpu_s, ppid) in before.items():
        if proc not in after and ppid in live_pids:
            own_s -= cpu_s  # its whole life is now in its parent's children times; count only the interval
    capacity_s = elapsed_s * (psutil.cpu_count(logical=True) or 1)
    share = min(1.0, max(0.0, (busy1 - busy0 - own_s) / capacity_s))
    return LoadSample(loadavg_1m=os.getloadavg()[0], others_cpu_share=share)


@dataclass(frozen=True)
class CpuShares:
    """Where all logical CPUs' time went during one measurement window, as shares of it (0..1).

    `steal`: time the hypervisor ran other guests on this VM's CPUs, invisible to every process here; on a lent
    VM it is the neighbour load that the repeats otherwise cannot tell from the engine's own noise.
    `busy`: all time but idle, iowait and steal (the engine's own work included)."""

    steal: float
    busy: float


def cpu_snapshot() -> Any:
    """System-wide cumulative CPU times (psutil.cpu_times()); two of them around a window give its CpuShares."""
    return psutil.cpu_times()


def cpu_shares(before: Any, after: Any) -> CpuShares | None:
    """The CpuShares between two cpu_snapshot()s; None where the platform reports no steal time, or no time passed."""
    if not hasattr(before, "steal") or not hasattr(after, "steal"):
        return None
    span = _total_cpu_s(after) - _total_cpu_s(before)
    if span <= 0:
        return None
    steal = after.steal - before.steal
    idle = (after.idle - before.idle) + (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    clamp = lambda x: min(1.0, max(0.0, x))  # noqa: E731 - counters read a few microseconds apart can jitter
    return CpuShares(steal=clamp(steal / span), busy=clamp((span - idle - steal) / span))


#: Iterations of the host-speed slice: about 12 ms on an idle lent H200 VM, about 22 ms in its slow stretches
#: (reports/evidence/2026-12-03-h200-host-probe); scripts/gpu-telemetry and scripts/h200-host-probe.py time the
#: same loop.
HOST_SLICE_ITERATIONS = 300_000


def host_slice_ms(repeats: int = 3) -> float:
    """Median milliseconds of a fixed pure-Python loop: the host's speed as a serving step's interpreter work feels it.

    Why: a lent VM's CPU ran this loop at two speeds in stretches of seconds with zero steal, and a 1.5B model's
    serving step is host-bound, so a window's throughput can move with the host while steal shows nothing. Timed
    around each window (not inside it, where it would take the event loop from the requests)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x = 0
        for i in range(HOST_SLICE_ITERATIONS):
            x += i & 7
        times.append(time.perf_counter() - t0)
    return statistics.median_high(times) * 1e3


def host_state(repeats: int = 3) -> dict[str, Any]:
    """The host's speed as this run found it: the loop timed on each CPU this process may use, pinned to it in turn
    (``host_loop_ms_by_cpu``), and their median (``host_loop_ms``). Recorded beside the fingerprint, not in it: two
    VMs of one shape share every fingerprint key and still run this loop 1.8x apart. Empty where the platform cannot
    pin a thread (macOS, Windows)."""
    if not hasattr(os, "sched_setaffinity"):
        return {}
    allowed = os.sched_getaffinity(0)
    by_cpu: dict[str, float] = {}
    try:
        for cpu in sorted(allowed):
            os.sched_setaffinity(0, {cpu})
            by_cpu[str(cpu)] = round(host_slice_ms(repeats), 2)
    finally:
        os.sched_setaffinity(0, allowed)
    return {"host_loop_ms": statistics.median_high(by_cpu.values()), "host_loop_ms_by_cpu": by_cpu}


def host_state_note(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> str | None:
    """Both runs' host loop times, shown beside a GPU verdict (None where either run did not record it, as every
    ledger before 2026-12-03, or on a CPU engine).

    A note, not a refusal: on one lent H200 VM the median over its vCPUs moved from 12.5 to 20.8 ms in 17 minutes,
    and no vCPU kept its speed (reports/evidence/2026-12-03-h200-affinity-ab), so one reading names a moment, not a
    host; a tolerance on it would have refused a verification on the machine that recorded the ledger. On a CPU
    engine the loop shares the CPUs with the engine's own threads (a 2-vCPU CI VM timed it at 12 and 25 ms while an
    engine ran), so it says nothing there."""
    if current.get("accelerator") in (None, "cpu"):
        return None
    rec, cur = (recorded or {}).get("host_loop_ms"), current.get("host_loop_ms")
    if not rec or not cur:
        return None
    return (f"host state: a fixed Python loop took {cur:.1f} ms here and {rec:.1f} ms when recorded "
            f"({cur / rec:.2f}x); a host-bound engine's tokens/s and multipliers move with it")


def is_busy(sample: LoadSample, threshold: float) -> bool:
    return sample.others_cpu_share > threshold


def top_other_processes(n: int = 3, *, interval_s: float = 0.2) -> list[str]:
    """``"name pid cpu%"`` of the busiest processes outside our tree (cpu% of one CPU, over ``interval_s``)."""
    own = {proc.pid for proc in _own_tree(None)}
    procs = [p for p in psutil.process_iter(["name"]) if p.pid not in own]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.cpu_percent(None)
    time.sleep(interval_s)
    usage = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            usage.append((proc.cpu_percent(None), proc.info["name"], proc.pid))
    usage.sort(reverse=True)
    return [f"{name} {pid} {pct:.0f}%" for pct, name, pid in usage[:n] if pct > 0]


def busy_message(sample: LoadSample, threshold: float, *, top: Iterable[str] | None = None) -> str:
    """Why recording refused: how busy, who (``top`` defaults to top_other_processes()), and how to force."""
    who = list(top_other_processes() if top is None else top)
    return (f"machine busy: other processes used {sample.others_cpu_share:.0%} of CPU capacity (threshold "
            f"{threshold:.0%}, loadavg_1m {sample.loadavg_1m:.2f})" + (f"; busiest: {', '.join(who)}" if who else "")
            + "; wait for them, or record anyway with --ledger-force-busy (the points are then marked busy)")
