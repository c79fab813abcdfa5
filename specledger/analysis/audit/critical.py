"""Stated critical concurrencies against the crossing the points give (theory.critical_concurrency)."""

from __future__ import annotations

import math
from typing import Any

from specledger.analysis import theory
from specledger.analysis.audit.base import Auditor, Parts, num
from specledger.ledger import figures

#: How far (in log2 of concurrency) a stated critical concurrency may sit from the recomputed one.
CRITICAL_LOG2_TOLERANCE = 0.05
#: "Any temperature": a stated crossing that names none.
_ANY = object()


def curve(a: Auditor, arm: str, workload: str, temperature: Any) -> tuple[list[int], list[float]]:
    """(concurrencies, multipliers) for one arm/workload/temperature; concurrency null skipped."""
    points = [p for p in a.ledger.points if p["workload"] == workload and p["concurrency"] is not None]
    if temperature is not _ANY:
        points = [p for p in points if p["temperature"] == temperature]
    pairs = []
    for p in points:
        m = figures.multiplier(a.ledger, p, arm)
        if m is not None:
            pairs.append((p["concurrency"], m))
    pairs.sort()
    return [c for c, _ in pairs], [m for _, m in pairs]


def check_critical(a: Auditor) -> None:
    """Every stated crossing (crosses, between, value) against the one its points give."""
    for j, stated in enumerate(a.ledger.data.get("critical_concurrency", [])):
        parts: Parts = ["critical_concurrency", j]
        temperature = stated.get("temperature", _ANY)
        if temperature is _ANY:
            temps = {p["temperature"] for p in a.ledger.points if p["workload"] == stated["workload"]}
            if len(temps) > 1:
                a.add(
                    parts,
                    "critical",
                    f"no temperature given, but the points have several: {sorted(temps, key=str)}",
                )
                continue
        concurrencies, multipliers = curve(a, stated["arm"], stated["workload"], temperature)
        if not concurrencies:
            a.add(
                parts, "critical", "no points with a concurrency and a multiplier to check it against"
            )
            continue
        crossing = theory.critical_concurrency(concurrencies, multipliers)
        computed_crosses = crossing.kind == "crosses"
        ok = True
        if stated["crosses"] != computed_crosses:
            ok = False
            a.add(
                [*parts, "crosses"],
                "critical",
                f"stated crosses={str(stated['crosses']).lower()}, the points say: {crossing.describe()}",
            )
        between = stated.get("between")
        if between is not None and (crossing.between is None or tuple(between) != crossing.between):
            ok = False
            a.add(
                [*parts, "between"],
                "critical",
                f"stated between {between}, the points say: {crossing.describe()}",
            )
        value = stated.get("value")
        if value is not None:
            if crossing.value is None:
                ok = False
                a.add(
                    [*parts, "value"],
                    "critical",
                    f"stated value {num(value)}, the points say: {crossing.describe()}",
                )
            elif abs(math.log2(value) - math.log2(crossing.value)) > CRITICAL_LOG2_TOLERANCE:
                ok = False
                a.add(
                    [*parts, "value"],
                    "critical",
                    f"stated {num(value)}, the points say {crossing.describe()}: "
                    f"more than {CRITICAL_LOG2_TOLERANCE} apart in log2 concurrency",
                )
        if ok and a.reference:
            a.add(parts, "critical", f"holds: {crossing.describe()}", "info")
