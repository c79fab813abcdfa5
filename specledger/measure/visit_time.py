"""How long a record or verification of a ledger's points will take, from the ledger's own earlier runs.

Why: GPU time comes in fixed leases (30 minutes a session here; a nightly job has its own timeout), and a run
that overruns loses the point it was measuring. Each run keeps what it spent in ``provenance.runs[].time_s``
(model build, engine starts, each point's wall time), so the next run's ``--ledger-budget-s`` and the timeout
around it can come from measured seconds instead of memory. Each estimate takes the slowest start and the slowest
recorded time of each point (a point never measured: the ledger's slowest point). A point's time depends on how many
repeats settled it (on the H200, fp8 copy c=8 took 77 s at 6 windows, c=4 124 s at 10), so the upper figure gives
every point the slowest point's time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specledger.ledger import Ledger
from specledger.ledger.selection import PointSelector, mode_skip_reason, point_label, points
from specledger.measure.recording import recorded_point_seconds

__all__ = ["BudgetPlan", "LedgerRunTime", "PointTime", "estimate_run"]


@dataclass(frozen=True)
class PointTime:
    """One point's expected wall seconds (all arms, warm-up and added repeats), and where the figure comes from."""

    label: str
    seconds: float | None
    source: str
    up_to_s: float | None
    """The ledger's slowest point when that is longer: the point may need as many repeats in this run."""


@dataclass(frozen=True)
class LedgerRunTime:
    """A run of one ledger's selected points: model build, engine starts, points, and their sum (None: unknown;
    a model build no run timed counts as none, since only the first run of a visit builds the model)."""

    ledger_id: str
    model_build_s: float | None
    engine_starts_s: float | None
    points: tuple[PointTime, ...]

    def _sum(self, point_seconds: list[float | None]) -> float | None:
        """Seconds from the session's start to its last point: what ``--ledger-budget-s`` counts. No points, no
        engines: a run with nothing to measure starts none."""
        if not self.points:
            return 0.0
        parts = [self.model_build_s or 0.0, self.engine_starts_s, *point_seconds]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)

    @property
    def total_s(self) -> float | None:
        return self._sum([p.seconds for p in self.points])

    @property
    def up_to_s(self) -> float | None:
        """The total when every point takes as long as the ledger's slowest."""
        return self._sum([p.up_to_s for p in self.points])

    def within_budget(self, budget_s: float, *, slowest: bool = False) -> BudgetPlan | None:
        """Which points a run with ``--ledger-budget-s budget_s`` measures and which it leaves out, by the session's
        own rule (``SuiteSession.over_budget``): a point starts only if it would end within the budget, expected to
        take as long as the slowest point so far or its own earlier time, whichever is longer; a point left out does
        not stop a later, shorter one. The engines count before the first point. ``slowest``: every point as slow as
        the ledger's slowest (``up_to_s``). None when a time is unknown.

        Why: on 2026-12-07 a budget of 440 s was given for three points that `estimate` put at 489-552 s, and the
        third point was left out by two runs in a row; this says so before the device time is spent."""
        seconds = [p.up_to_s if slowest else p.seconds for p in self.points]
        if self.engine_starts_s is None or any(s is None for s in seconds):
            return None
        elapsed = (self.model_build_s or 0.0) + self.engine_starts_s if self.points else 0.0
        slowest_so_far = 0.0
        measured: list[str] = []
        left_out: list[str] = []
        for point, took in zip(self.points, seconds, strict=True):
            assert took is not None
            if elapsed + max(slowest_so_far, took) <= budget_s:
                measured.append(point.label)
                elapsed += took
                slowest_so_far = max(slowest_so_far, took)
            else:
                left_out.append(point.label)
        return BudgetPlan(tuple(measured), tuple(left_out), elapsed)


@dataclass(frozen=True)
class BudgetPlan:
    """The points a time budget lets a run measure, those it leaves out, and when the last one ends (s from the
    run's start, model build and engine starts included)."""

    measured: tuple[str, ...]
    left_out: tuple[str, ...]
    ends_s: float


def _slowest(runs: Iterable[Mapping[str, Any]], field: str) -> float | None:
    """The longest ``time_s.<field>`` of the runs; a 0 is work another run of the same visit did (the model it had
    built, the engines it shared), not a time this ledger's run can count on."""
    values = [float(v) for run in runs if isinstance(v := (run.get("time_s") or {}).get(field), (int, float)) and v > 0]
    return max(values, default=None)


def estimate_run(ledger: Ledger, selectors: list[PointSelector] | None = None, *,
                 only_missing: bool = False, verify: bool = False, times_from: Ledger | None = None) -> LedgerRunTime:
    """The expected seconds of a run over ``ledger``'s points chosen by ``selectors`` (the ``--ledger-points``
    grammar), in the order the run takes them; ``only_missing``: only those the ledger has not recorded, as
    ``--ledger-record --ledger-only-missing`` does; ``verify``: only those it has (a verification skips the rest).

    ``times_from``: a ledger whose runs stand in where this one's kept no times (a planned ledger never run, such
    as a policy ledger replanned from a measured one): its model build, and its engine starts and point times scaled
    by the ratio of arm counts, since the arms start one after another and a point's windows go round every arm."""
    if only_missing and verify:
        raise ValueError("only_missing and verify select disjoint points: give one")
    keys = list(dict.fromkeys(p.key for p in points(ledger, selectors)))
    keys = [k for k in keys if mode_skip_reason(ledger, k, record=not verify, only_missing=only_missing) is None]
    own = _LedgerTimes(ledger)
    other = _LedgerTimes(times_from, arms_of=ledger) if times_from is not None else None
    chosen = []
    for key in keys:
        label = point_label(key)
        time = own.point_time(label)
        if time is None and other is not None:
            time = other.point_time(label)
        chosen.append(time or PointTime(label, None, "no run of this ledger kept its times", None))
    model_build, engine_starts = own.model_build_s, own.engine_starts_s
    if other is not None:
        model_build = model_build if model_build is not None else other.model_build_s
        engine_starts = engine_starts if engine_starts is not None else other.engine_starts_s
    return LedgerRunTime(ledger.id, model_build, engine_starts, tuple(chosen))


class _LedgerTimes:
    """What a ledger's runs kept (model build, engine starts, each recorded point's slowest time), scaled by the
    ratio of arm counts when it stands in for another ledger (``--times-from``: the arms start one after another
    and a point's windows go round every arm); scale 1 for the ledger's own runs."""

    def __init__(self, source: Ledger, arms_of: Ledger | None = None) -> None:
        self.source = source
        self.arms = None if arms_of is None else (len(arms_of.data.get("arms") or []),
                                                  len(source.data.get("arms") or []))
        self.scale = self.arms[0] / self.arms[1] if self.arms and self.arms[1] else 1.0
        prov = source.data.get("provenance") or {}
        runs = prov.get("runs") or []
        self.model_build_s = _slowest(runs, "model_build")
        starts = _slowest(runs, "engine_starts")
        self.engine_starts_s = None if starts is None else starts * self.scale
        labels = (point_label(Ledger.point_key(p)) for p in source.points)
        self.recorded = {label: recorded_point_seconds(prov, label) for label in labels}
        self.slowest = max((s for s in self.recorded.values() if s is not None), default=None)

    def point_time(self, label: str) -> PointTime | None:
        """The point's own time, else the slowest point's (as long as this point may need), scaled; None when the
        runs kept none."""
        own = self.recorded.get(label)
        base = own if own is not None else self.slowest
        if base is None or self.slowest is None:
            return None
        if self.arms is None:
            source = "recorded" if own is not None else "the ledger's slowest point"
        else:
            where = label if own is not None else "slowest point"
            source = f"{self.source.id}'s {where} x {self.arms[0]}/{self.arms[1]} arms"
        return PointTime(label, base * self.scale, source, max(base, self.slowest) * self.scale)
