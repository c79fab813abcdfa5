"""Acceptance-drift watch: a live server's acceptance over a sliding window, against its ledger.

The failure it catches: an endpoint validated on copy-heavy traffic keeps running while the
traffic changes, and the drafter goes quiet (acceptance falls, the speculative server now
burns compute for nothing). Speculation is fixed at server start, so the only place to see it
is the server's own counters. Every `interval_s` the watch reads `/metrics`; the window is the
difference between the newest snapshot and the oldest one at most `window_s` old. Once the
window holds `min_drafts` drafts, acceptance length (1 + accepted/drafts) and rate
(accepted/draft tokens) are compared with the ledger's figures for the arm and workload.

Tolerances: the ledger's `acceptance_length_abs` for the length; for the rate the same
tolerance per drafted token (`acceptance_length_abs / k`), unless given explicitly.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

from specledger.errors import SpecledgerError
from specledger.ledger import Ledger
from specledger.measure import counters
from specledger.measure.http import server_metrics
from specledger.measure.http.server_metrics import EndpointError

__all__ = ["Drift", "Expected", "SlidingWindow", "Verdict", "expected_acceptance", "judge", "watch"]


class Drift(SpecledgerError):
    """Acceptance left the ledger's tolerance; the message says what, by how much, over which window."""


@dataclass(frozen=True)
class Expected:
    """What the ledger says the arm's acceptance is for one workload, and how far it may move."""

    arm: str
    workload: str
    acceptance_length: float
    acceptance_rate: float
    length_tolerance: float
    rate_tolerance: float
    points: int


@dataclass(frozen=True)
class Verdict:
    ok: bool
    acceptance_length: float
    acceptance_rate: float
    drafts: int
    window_s: float
    message: str


def expected_acceptance(ledger: Ledger, *, arm: str | None = None, workload: str | None = None,
                        temperature: float | None = None, length_tolerance: float | None = None,
                        rate_tolerance: float | None = None) -> Expected:
    """The ledger's acceptance for (arm, workload): the median over its measured points.

    ValueError (naming the choices) when the arm or workload is ambiguous or has no figures.
    """
    spec_arms = [a["name"] for a in ledger.speculative_arms() if a.get("speculative_config")]
    if arm is None:
        if len(spec_arms) != 1:
            raise ValueError(f"{ledger.path}: choose the served arm with --arm ({', '.join(spec_arms) or 'none'})")
        arm = spec_arms[0]
    elif arm not in spec_arms:
        raise ValueError(f"{ledger.path}: no speculative arm {arm!r} (arms: {', '.join(spec_arms) or 'none'})")
    figures: dict[str, list[tuple[float, float]]] = {}
    for point in ledger.points:
        if temperature is not None and point.get("temperature") is not None \
                and float(point["temperature"]) != float(temperature):
            continue
        acc = (point.get("arms", {}).get(arm) or {}).get("acceptance") or {}
        if acc.get("acceptance_length") is not None and acc.get("acceptance_rate") is not None:
            figures.setdefault(point["workload"], []).append((float(acc["acceptance_length"]),
                                                              float(acc["acceptance_rate"])))
    if workload is None:
        if len(figures) != 1:
            raise ValueError(f"{ledger.path}: choose the workload this endpoint was validated on with --workload "
                             f"({', '.join(sorted(figures)) or 'the ledger has no acceptance figures'})")
        workload = next(iter(figures))
    if workload not in figures:
        raise ValueError(f"{ledger.path}: no acceptance figures for arm {arm!r} on workload {workload!r} "
                         f"(workloads with figures: {', '.join(sorted(figures)) or 'none'})")
    k = int((ledger.arm(arm).get("speculative_config") or {}).get("num_speculative_tokens") or 1)
    len_tol = float(ledger.tolerances["acceptance_length_abs"]) if length_tolerance is None else length_tolerance
    rows = figures[workload]
    return Expected(arm, workload, median(r[0] for r in rows), median(r[1] for r in rows), len_tol,
                    len_tol / k if rate_tolerance is None else rate_tolerance, len(rows))


def judge(window: Mapping[str, Any], expected: Expected, window_s: float) -> Verdict | None:
    """Compare one window's counter deltas with the ledger; None when nothing was drafted in it."""
    acc = counters.acceptance(window)
    if acc is None:
        return None
    length, rate = acc["acceptance_length"], acc["acceptance_rate"]
    d_len, d_rate = length - expected.acceptance_length, rate - expected.acceptance_rate
    ok = abs(d_len) <= expected.length_tolerance and abs(d_rate) <= expected.rate_tolerance
    message = (f"acceptance length {length:.3f} (ledger {expected.acceptance_length:.3f} "
               f"± {expected.length_tolerance:g}, {d_len:+.3f}), acceptance rate {rate:.4f} "
               f"(ledger {expected.acceptance_rate:.4f} ± {expected.rate_tolerance:.4g}, {d_rate:+.4f}) over "
               f"{acc['drafts']} drafts in the last {window_s:.0f} s; arm {expected.arm}, "
               f"workload {expected.workload}")
    return Verdict(ok, length, rate, acc["drafts"], window_s, message)


class SlidingWindow:
    """Timed snapshots of cumulative counters; `delta()` is newest minus the oldest within `window_s`."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.snapshots: deque[tuple[float, dict[str, Any]]] = deque()

    def add(self, t: float, snapshot: Mapping[str, Any]) -> None:
        if self.snapshots:
            try:
                counters.delta(self.snapshots[-1][1], snapshot)
            except ValueError:
                self.snapshots.clear()  # counters went down: the server restarted; start over
        self.snapshots.append((t, dict(snapshot)))
        while len(self.snapshots) > 1 and self.snapshots[1][0] <= t - self.window_s:
            self.snapshots.popleft()

    def delta(self) -> tuple[dict[str, Any], float]:
        """(counter deltas, seconds covered); empty deltas until two snapshots exist."""
        if len(self.snapshots) < 2:
            return counters.delta({}, {}), 0.0
        (t0, first), (t1, last) = self.snapshots[0], self.snapshots[-1]
        return counters.delta(first, last), t1 - t0


def check_model(metrics: server_metrics.SpecMetrics, url: str, expected_models: list[str]) -> None:
    """EndpointError naming both models when the server's model_name labels do not match the ledger's."""
    if metrics.model_names and not server_metrics.model_matches(metrics.model_names, expected_models):
        raise EndpointError(f"{url}: the server runs model {metrics.model_names[0]!r}, "
                            f"but the ledger's model is {expected_models[0]!r}")


def watch(url: str, expected: Expected, expected_models: list[str], *, window_s: float = 60.0,
          interval_s: float = 5.0, min_drafts: int = 50, duration_s: float | None = None,
          progress: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> Verdict | None:
    """Poll until drift (raises Drift) or `duration_s` passes (returns the last verdict, None if none).

    EndpointError before the first window if the server is unreachable, exports no spec-decode
    counters or runs another model.
    """
    target = server_metrics.metrics_url(url)
    first = server_metrics.read_spec_metrics(target)
    server_metrics.require_spec(first, target)
    check_model(first, target, expected_models)
    progress(f"watching {target}: arm {expected.arm}, workload {expected.workload}, ledger acceptance length "
             f"{expected.acceptance_length:.3f} ± {expected.length_tolerance:g}, rate "
             f"{expected.acceptance_rate:.4f} ± {expected.rate_tolerance:.4g}; window {window_s:g} s, "
             f"at least {min_drafts} drafts")
    window = SlidingWindow(window_s)
    start = clock()
    window.add(start, first.counters)
    last: Verdict | None = None
    while duration_s is None or clock() - start < duration_s:
        sleep(interval_s)
        now = clock()
        window.add(now, server_metrics.read_spec_metrics(target).counters)
        delta, covered = window.delta()
        verdict = judge(delta, expected, covered) if delta["drafts"] >= min_drafts else None
        if verdict is None:
            progress(f"{time.strftime('%H:%M:%S')} window {covered:.0f} s: {delta['drafts']} drafts "
                     f"(< {min_drafts}): waiting for traffic")
            continue
        last = verdict
        progress(f"{time.strftime('%H:%M:%S')} {'ok' if verdict.ok else 'DRIFT'}: {verdict.message}")
        if not verdict.ok:
            raise Drift(f"acceptance drifted past the ledger's tolerance at {target}: {verdict.message}")
    return last
