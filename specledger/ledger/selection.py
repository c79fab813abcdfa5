"""Which ledger points become tests, in which order, and the grammar that selects them.

A test case is one arm of one ledger at one grid point (`LedgerPoint`); `points` lists a ledger's,
ordered by the `--ledger-points` selection (``copy:0:1,free-form:*:2``: workload:temperature:
concurrency, ``*`` for any), so a time-boxed run measures the points it names first. Plain logic:
the pytest plugin turns `SelectionError` into a usage error and the points into parametrized tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.errors import SpecledgerError
from specledger.ledger.io import iter_ledger_paths
from specledger.ledger.model import Ledger

__all__ = ["LedgerPoint", "PointSelector", "SelectionError", "ledger_paths", "mode_skip_reason", "parse_endpoints",
           "parse_point_selection", "point_label", "point_selected", "point_test_id", "points", "selector_rank",
           "skip_reason"]

PointSelector = tuple[str, float | None, int | None]


class SelectionError(SpecledgerError, ValueError):
    """A `--ledger-points` or `--ledger-endpoint` value that does not parse; the message quotes it."""


@dataclass(frozen=True)
class LedgerPoint:
    """One test case: one arm of a ledger at one grid point (speed verdicts for every arm, and the
    multiplier and acceptance for speculative and policy arms)."""

    ledger: Ledger
    arm: str
    workload: str
    temperature: float
    concurrency: int

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.workload, float(self.temperature), int(self.concurrency))

    @property
    def test_id(self) -> str:
        return point_test_id(self.ledger.id, self.arm, self.key)

    def __repr__(self) -> str:
        """The test id, not the whole ledger: pytest-benchmark writes a param it cannot serialize as its
        repr, once per benchmark row (a GPU run's benchmark JSON was 538 kB of repeated ledgers)."""
        return f"LedgerPoint({self.test_id})"


def parse_point_selection(text: str | None) -> list[PointSelector] | None:
    """'copy:0:1,free-form:*:2' -> selectors; None selects every point."""
    if not text:
        return None
    selectors: list[PointSelector] = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not parts[0]:
            raise SelectionError(f"--ledger-points {item!r}: expected workload:temperature:concurrency")
        try:
            temp = None if parts[1] == "*" else float(parts[1])
            conc = None if parts[2] == "*" else int(parts[2])
        except ValueError:
            raise SelectionError(f"--ledger-points {item!r}: temperature and concurrency are numbers or *") from None
        selectors.append((parts[0], temp, conc))
    return selectors


def point_label(key: tuple[str, float | None, int | None]) -> str:
    """``copy:0:64``: a point written in this grammar (``-`` for a null temperature or concurrency)."""
    workload, temperature, concurrency = key
    t = "-" if temperature is None else f"{temperature:g}"
    return f"{workload}:{t}:{'-' if concurrency is None else concurrency}"


def point_test_id(ledger_id: str, arm: str, key: tuple[str, float | None, int | None]) -> str:
    """``cpu-smollm2-ngram-copy:0:1``: the id of one arm-point, as pytest, verdict messages and the demo name it."""
    return f"{ledger_id}-{arm}-{point_label(key)}"


def selector_rank(key: tuple[str, float, int], selectors: list[PointSelector] | None) -> int | None:
    """Index of the first selector that matches `key` (its place in the run order), or None."""
    if selectors is None:
        return 0
    for rank, (w, t, c) in enumerate(selectors):
        if w in ("*", key[0]) and (t is None or t == key[1]) and (c is None or c == key[2]):
            return rank
    return None


def point_selected(key: tuple[str, float, int], selectors: list[PointSelector] | None) -> bool:
    return selector_rank(key, selectors) is not None


def parse_endpoints(values: Sequence[str]) -> dict[str, str]:
    """['baseline=http://h:8000', ...] -> {'baseline': 'http://h:8000'}; SelectionError on a bad entry."""
    out: dict[str, str] = {}
    for value in values:
        arm, sep, url = value.partition("=")
        if not sep or not arm or not url.startswith(("http://", "https://")):
            raise SelectionError(f"--ledger-endpoint {value!r}: expected ARM=http://host:port")
        if arm in out:
            raise SelectionError(f"--ledger-endpoint: arm {arm!r} given twice")
        out[arm] = url.rstrip("/")
    return out


def ledger_paths(chosen: Sequence[str], directory: str | Path | None, rootpath: Path) -> list[Path]:
    """The ledger files of a run: those named (`--ledger`), else every one in `--ledger-dir` (default
    <rootdir>/ledgers)."""
    if chosen:
        return [Path(p) for p in chosen]
    folder = Path(directory) if directory else rootpath / "ledgers"
    return iter_ledger_paths([folder]) if folder.is_dir() else []


def points(ledger: Ledger, selectors: list[PointSelector] | None = None) -> Iterator[LedgerPoint]:
    """Every selected arm-point of a ledger (its points and its grid), in the selection's order."""
    keys: list[tuple[str, float, int]] = []
    for point in ledger.points:
        if point.get("temperature") is not None and point.get("concurrency") is not None:
            keys.append((point["workload"], float(point["temperature"]), int(point["concurrency"])))
    if ledger.data.get("sweep"):
        keys += [(w, float(t), int(c)) for (w, t, c) in ledger.grid()]
    ranked = {k: selector_rank(k, selectors) for k in set(keys)}
    for key in sorted((k for k, rank in ranked.items() if rank is not None), key=lambda k: (ranked[k], k)):
        for arm in ledger.arms:
            yield LedgerPoint(ledger, arm["name"], *key)


def mode_skip_reason(ledger: Ledger, key: tuple[str, float, int], *, record: bool, only_missing: bool) -> str | None:
    """Why a run in this mode has nothing to measure at ``key``, from the ledger alone: what `skip_reason` decides
    before its session's budget, and what `specledger estimate` selects by without a session."""
    committed = ledger.find_point(*key)
    if record and only_missing and committed is not None:
        return "already recorded (--ledger-only-missing)"
    if not record and committed is None:
        return "no committed figures for this point; run with --ledger-record"
    return None


def skip_reason(session: Any, point: LedgerPoint) -> str | None:
    """Why this point has nothing to measure in this mode (decided before any engine or timer starts)."""
    reason = mode_skip_reason(point.ledger, point.key, record=session.record, only_missing=session.only_missing)
    if reason is not None:
        return f"{point.test_id}: {reason}"
    if session.cached(point.ledger, point.key) is None:
        return session.over_budget(point.ledger, point.key)
    return None
