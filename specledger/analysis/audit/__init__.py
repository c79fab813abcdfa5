"""Consistency findings for a ledger: do its figures agree with each other at the rounding it states?

A ledger carries both raw figures (medians, counters, KV tokens) and figures derived from them
(multipliers, acceptance length and rate, sessions, crossings, prose claims such as "0.3x").
The audit recomputes each derived figure from the raw ones and checks that rounding the exact
value to the stated decimals gives the stated value. Where the raw figures are themselves
rounded, it works with the interval they stand for (value +- half a unit), so a published
rounding is only called wrong when no value consistent with the inputs could produce it.

A protocol v3 point (`protocol_version: 3`) states its multiplier as a ratio of *means* of paired
repeats (specledger.stats), so its multipliers are checked against the means; earlier points keep
the ratio of medians. The `resolution` finding says which multiplier tolerance the committed v3
intervals can resolve at all with the protocol's most repeats.

Severity: in measured (and planned) ledgers an inconsistency is an `error`, since this suite
wrote the figures; in reference ledgers it is a `warning`, since the ledger faithfully encodes
a publication that disagrees with itself. "This rounding holds" is `info`. No vLLM here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

from specledger.analysis.audit.base import SEVERITIES, Auditor, Finding, Severity
from specledger.analysis.audit.critical import check_critical
from specledger.analysis.audit.host import check_host_sensitivity
from specledger.analysis.audit.kv import check_kv_cache
from specledger.analysis.audit.noise import check_noise, check_resolution
from specledger.analysis.audit.points import check_points
from specledger.analysis.audit.spread import check_start_spread
from specledger.analysis.audit.stated import check_claims, check_mix
from specledger.ledger import Ledger, LedgerError, iter_ledger_paths, load_ledger
from specledger.ledger.model import Problem

__all__ = [
    "CHECKS",
    "SEVERITIES",
    "Finding",
    "at_least",
    "audit_ledger",
    "audit_paths",
]

#: The checks, in the order their findings are reported (one module each, beside this one).
CHECKS: tuple[Callable[[Auditor], None], ...] = (
    check_points,
    check_start_spread,
    check_host_sensitivity,
    check_kv_cache,
    check_critical,
    check_claims,
    check_mix,
    check_noise,
    check_resolution,
)


def audit_ledger(ledger: Ledger) -> list[Finding]:
    """Every consistency finding for one loaded ledger, in ledger order."""
    auditor = Auditor(ledger)
    for check in CHECKS:
        check(auditor)
    return auditor.findings


def audit_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Finding], list[Problem]]:
    """Load and audit every ledger under `paths` (directories expand to *.json).

    A ledger that fails to load contributes its problems instead of findings; the rest are
    still audited. A path that does not exist raises FileNotFoundError.
    """
    findings: list[Finding] = []
    problems: list[Problem] = []
    for path in iter_ledger_paths(paths):
        try:
            ledger = load_ledger(path)
        except LedgerError as e:
            problems.extend(e.problems)
            continue
        findings.extend(audit_ledger(ledger))
    return findings, problems


def at_least(findings: Sequence[Finding], severity: Severity) -> list[Finding]:
    """The findings at or above `severity`."""
    rank = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= rank]
