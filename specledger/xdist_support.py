"""pytest-xdist for GPU ledgers: one ledger per worker, each worker on its own GPUs and cores.

The plugin's xdist hooks hand their work here (the assignment itself is `specledger.gpu_assignment`).
A worker is pinned in `pytest_configure`, before any engine or torch touches CUDA; the controller
refuses, before any worker starts, a run the workers could not be given. xdist 3.8 with pytest 9
drops the `@group` suffix of `--dist loadgroup` (pytest-dev/pytest-xdist#1386), so the scheduler
here groups ledger points by their test ids; every other test is scheduled as xdist would.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from specledger import gpu_assignment
from specledger.ledger import Ledger, LedgerError, load_ledger
from specledger.ledger.selection import PointSelector, points

__all__ = ["auto_num_workers", "ledger_groups", "make_scheduler", "pin_xdist_worker", "selected_gpu_ledgers",
           "selects_gpu"]


def selects_gpu(markexpr: str) -> bool:
    """Whether `-m markexpr` keeps a point marked gpu (no expression keeps everything)."""
    if not markexpr.strip():
        return True
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m parser (not public API)

        return Expression.compile(markexpr).evaluate(lambda name, **kwargs: name in ("gpu", "xdist_group"))
    except Exception:  # an older or newer pytest: a plain reading of the expression
        return "gpu" in markexpr and "not gpu" not in markexpr


def _loaded(paths: Sequence[Path]) -> list[Ledger]:
    out = []
    for path in paths:
        try:
            ledger = load_ledger(path)
        except LedgerError:
            continue  # pytest_generate_tests reports it
        if ledger.status != "reference":
            out.append(ledger)
    return out


def selected_gpu_ledgers(paths: Sequence[Path], markexpr: str) -> list[Ledger]:
    """The GPU ledgers whose points this run keeps (before collection: known from the options alone)."""
    return [ledger for ledger in _loaded(paths) if ledger.is_gpu()] if selects_gpu(markexpr) else []


def _xdist_workers(config: pytest.Config) -> int:
    """How many xdist workers this controller starts (0 without xdist or with -n 0)."""
    if config.getoption("dist", default="no") in (None, "no"):
        return 0
    return len(config.getoption("tx", default=None) or [])


def pin_xdist_worker(config: pytest.Config, ledgers: Sequence[Ledger]) -> gpu_assignment.Assignment | None:
    """An xdist worker of a run with GPU ledger points (`ledgers`) gets its own GPUs and cores; the
    controller checks that every worker can get them. A machine without GPUs pins nothing."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    is_worker = gpu_assignment.worker_index(worker) is not None
    n_workers = 0 if is_worker else _xdist_workers(config)
    if (not is_worker and n_workers == 0) or not ledgers:
        return None
    per_worker = max(gpu_assignment.gpus_needed(ledger.data) for ledger in ledgers)
    share = bool(config.getoption("--ledger-share-gpus", default=False))
    try:
        if is_worker:
            pinned = gpu_assignment.pin_worker(gpus_per_worker=per_worker, share_gpus=share)
            if pinned is not None:
                print(f"[specledger] xdist worker {worker}: {pinned.describe()}", file=sys.stderr, flush=True)
            return pinned
        gpus = gpu_assignment.detect_gpus()
        if not gpus:
            return None
        if config.getoption("dist") != "loadgroup":
            raise pytest.UsageError(f"GPU ledgers under pytest-xdist need --dist loadgroup (one ledger per worker, "
                                    f"on its own GPU), not --dist {config.getoption('dist')}")
        for index in range(n_workers):  # the controller's check: a clear error instead of crashed workers
            gpu_assignment.assignment(index, n_workers, gpus, gpu_assignment.available_cpus(), per_worker,
                                      share_gpus=share)
    except gpu_assignment.AssignmentError as exc:
        raise pytest.UsageError(f"specledger: {exc}") from None
    return None


def auto_num_workers(ledgers: Sequence[Ledger]) -> int | None:
    """`-n auto` on a run with GPU ledgers: one worker per GPU slot (GPUs // the largest tensor-parallel
    world), at most one per ledger; PYTEST_XDIST_AUTO_NUM_WORKERS still wins (None: xdist decides)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    gpus = gpu_assignment.detect_gpus() if ledgers else []
    if not gpus:
        return None
    per_worker = max(gpu_assignment.gpus_needed(ledger.data) for ledger in ledgers)
    return max(1, min(len(ledgers), len(gpus) // per_worker))


def ledger_groups(paths: Sequence[Path], selectors: list[PointSelector] | None) -> dict[str, str]:
    """Test id of every ledger point this run may collect -> its ledger id (its xdist group)."""
    return {p.test_id: ledger.id for ledger in _loaded(paths) for p in points(ledger, selectors)}


def make_scheduler(config: pytest.Config, log: Any, groups: dict[str, str]) -> Any:
    """`--dist loadgroup` that keeps a ledger's points on one worker also where xdist's own grouping is lost
    (see gpu_assignment.group_of); every other test is scheduled as xdist's LoadGroupScheduling does."""
    if not groups:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class LedgerGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return scope if scope != nodeid else gpu_assignment.group_of(nodeid, groups) or nodeid

    return LedgerGroupScheduling(config, log)
