"""Which GPUs and CPU cores each pytest-xdist worker gets when GPU ledgers run one per worker.

Why: ``pytest -m gpu -n N --dist loadgroup`` sends each ledger (one ``xdist_group``) to one worker. Two
ledgers measured at once must not share a GPU (vLLM sizes its KV cache from the memory that is free when
the engine starts, and two engines on one GPU slow each other down) nor CPU cores (the small models
measured here are CPU-bound: the scheduler, the sampler and the drafts run on the host). So worker ``gwI``
gets GPUs ``I*g .. I*g+g-1`` (``g`` = the most GPUs one selected ledger needs, its tensor-parallel world)
and the I-th equal, contiguous slice of the CPU cores, and a run with more workers than GPU slots is refused
unless sharing is asked for. This replaces the hand-made ``scripts/gpu-split`` (ledger i on GPU i, taskset
cores ``i*per..``).

Pure logic, except :func:`detect_gpus` (environment, ``nvidia-smi``) and :func:`pin_worker` (environment,
affinity), both with their side effects injectable so tests run on any machine.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from specledger.errors import SpecledgerError


class AssignmentError(SpecledgerError, ValueError):
    """The workers cannot each get their own GPUs and cores (the message says why and what to change)."""


@dataclass(frozen=True)
class Assignment:
    """One worker's share: the devices it may see (CUDA_VISIBLE_DEVICES) and the cores it may run on."""

    index: int
    gpus: tuple[str, ...]
    cpus: frozenset[int]

    @property
    def visible_devices(self) -> str:
        """The CUDA_VISIBLE_DEVICES value: the parent's device names (indices or UUIDs), comma-separated."""
        return ",".join(self.gpus)

    def describe(self) -> str:
        return f"GPU {self.visible_devices or '-'}, CPUs {cpu_ranges(self.cpus)}"


def worker_index(worker_id: str | None) -> int | None:
    """``"gw3"`` -> 3; the controller (``"master"``), no xdist (None) or anything else -> None."""
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match.group(1)) if match else None


def parse_visible_devices(text: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of device names; None when unset (CUDA would see every GPU), [] when
    set but empty (CUDA sees none). Names are kept as written: indices, ``GPU-<uuid>`` or ``MIG-<uuid>``."""
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def _positive_int(value: Any) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def gpus_needed(ledger_data: Mapping[str, Any]) -> int:
    """GPUs one engine of this ledger spans: tensor_parallel_size x pipeline_parallel_size, the largest over
    the shared ``engine_args`` and every arm's own (an arm's value replaces the shared one). A tensor-parallel
    ledger stays one xdist group, so its worker needs all of them."""
    shared = ledger_data.get("engine_args") or {}
    needed = 1
    for arm in [{}, *(ledger_data.get("arms") or [])]:
        args = {**shared, **(arm.get("engine_args") or {})}
        tp, pp = args.get("tensor_parallel_size", 1), args.get("pipeline_parallel_size", 1)
        needed = max(needed, _positive_int(tp) * _positive_int(pp))
    return needed


def assignment(index: int, n_workers: int, gpus: Sequence[str], cpus: Iterable[int], gpus_per_worker: int = 1,
               *, share_gpus: bool = False) -> Assignment:
    """Worker ``index`` of ``n_workers``: GPUs ``gpus[index*g : index*g+g]`` and the index-th of
    ``n_workers`` equal, contiguous slices of the sorted ``cpus`` (a remainder of fewer than ``n_workers``
    cores stays unused, so every ledger is measured on as many cores as the others).

    Refuses (AssignmentError) more workers than GPU slots unless ``share_gpus``, which wraps around the GPUs
    instead; a ledger that needs more GPUs than there are is refused either way.
    """
    if n_workers < 1 or not 0 <= index < n_workers:
        raise AssignmentError(f"worker index {index} is not one of {n_workers} workers")
    if gpus_per_worker < 1:
        raise AssignmentError(f"gpus_per_worker must be at least 1, not {gpus_per_worker}")
    gpus = list(gpus)
    if gpus_per_worker > len(gpus):
        raise AssignmentError(f"a selected ledger needs {gpus_per_worker} GPUs (tensor_parallel_size x "
                              f"pipeline_parallel_size) but {len(gpus)} are visible")
    needed = n_workers * gpus_per_worker
    if needed > len(gpus) and not share_gpus:
        per = f" x {gpus_per_worker} GPUs each" if gpus_per_worker > 1 else ""
        raise AssignmentError(
            f"{n_workers} xdist workers{per} need {needed} GPUs but {len(gpus)} are visible "
            f"({','.join(gpus)}): workers never share a GPU; use -n {len(gpus) // gpus_per_worker} "
            f"(or --ledger-share-gpus to let them share)")
    start = index * gpus_per_worker
    mine = tuple(gpus[(start + k) % len(gpus)] for k in range(gpus_per_worker))
    cores = sorted(set(cpus))
    per_worker = len(cores) // n_workers
    if per_worker == 0:
        raise AssignmentError(f"{n_workers} xdist workers but only {len(cores)} CPU cores: every worker needs "
                              f"its own core")
    return Assignment(index, mine, frozenset(cores[index * per_worker:(index + 1) * per_worker]))


def group_of(nodeid: str, groups: Mapping[str, str]) -> str | None:
    """The xdist group of a test from its parameter id: ``...::test_point[cpu-smollm2-ngram-copy:0:1]`` ->
    ``groups["cpu-smollm2-ngram-copy:0:1"]``; None for a test without a known id.

    Why: pytest 9.2 builds node ids from a structured id, so xdist 3.8 can no longer append ``@<group>`` to
    them and ``--dist loadgroup`` silently stops grouping (pytest-dev/pytest-xdist#1386); the controller then
    groups ledger points by the ids it can compute from the ledgers itself.
    """
    if not nodeid.endswith("]") or "[" not in nodeid:
        return None
    return groups.get(nodeid[nodeid.index("[", nodeid.rfind("::")) + 1:-1])


def cpu_ranges(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (taskset's notation)."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


Runner = Callable[..., subprocess.CompletedProcess]


def detect_gpus(environ: Mapping[str, str] | None = None, run: Runner = subprocess.run) -> list[str]:
    """The GPUs this process may hand out: the parent's CUDA_VISIBLE_DEVICES if set, else one index per
    ``nvidia-smi -L`` GPU line, else ``torch.cuda.device_count()`` if torch is installed, else none.

    torch is asked in a child process: in this one its device count would be cached before
    CUDA_VISIBLE_DEVICES is narrowed, and vLLM would then see the wrong count.
    """
    env = os.environ if environ is None else environ
    visible = parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return visible
    try:
        res = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        if res.returncode == 0:
            count = sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))
            if count:
                return [str(i) for i in range(count)]
    except (OSError, subprocess.SubprocessError):
        pass
    if importlib.util.find_spec("torch") is None:
        return []
    try:
        res = run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                  capture_output=True, text=True, timeout=300)
        count = int(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 and res.stdout.strip() else 0
    except (OSError, subprocess.SubprocessError, ValueError):
        count = 0
    return [str(i) for i in range(count)]


def available_cpus() -> list[int]:
    """The cores this process may use (a container or taskset may allow fewer than the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _set_affinity_all_threads(cpus: frozenset[int]) -> None:
    """sched_setaffinity for every thread of this process (pid 0 is only the calling thread); the engine
    processes started later inherit it."""
    tids = [0]
    if os.path.isdir("/proc/self/task"):
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            if tid in (0, os.getpid()):
                raise


def pin_worker(environ: MutableMapping[str, str] | None = None, *, gpus_per_worker: int = 1,
               share_gpus: bool = False, gpus: Sequence[str] | None = None, cpus: Iterable[int] | None = None,
               setaffinity: Callable[[frozenset[int]], None] | None = None) -> Assignment | None:
    """Pin this xdist worker (PYTEST_XDIST_WORKER / PYTEST_XDIST_WORKER_COUNT in ``environ``) to its GPUs and
    cores: sets CUDA_VISIBLE_DEVICES (and, where nvidia-smi counted the GPUs, CUDA_DEVICE_ORDER=PCI_BUS_ID unless
    set, so CUDA numbers them as nvidia-smi does) and the CPU affinity. Must run before anything initialises CUDA.

    Returns None, changing nothing, outside an xdist worker or where no GPU is found. ``gpus`` (default
    :func:`detect_gpus`), ``cpus`` (default :func:`available_cpus`) and ``setaffinity`` are for tests.
    """
    env = os.environ if environ is None else environ
    index = worker_index(env.get("PYTEST_XDIST_WORKER"))
    if index is None:
        return None
    n_workers = _positive_int(env.get("PYTEST_XDIST_WORKER_COUNT", index + 1))
    found = list(detect_gpus(env) if gpus is None else gpus)
    if not found:
        return None
    mine = assignment(index, n_workers, found, available_cpus() if cpus is None else cpus, gpus_per_worker,
                      share_gpus=share_gpus)
    if gpus is None and "CUDA_VISIBLE_DEVICES" not in env:
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # the indices came from nvidia-smi's numbering
    env["CUDA_VISIBLE_DEVICES"] = mine.visible_devices
    if setaffinity is not None:
        setaffinity(mine.cpus)
    elif hasattr(os, "sched_setaffinity"):
        _set_affinity_all_threads(mine.cpus)
    return mine
