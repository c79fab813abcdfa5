"""What one arm-point test comes to: measure it (once per point), then record it or verify it.

The decision lives here, not in the pytest plugin, the way pytest-regressions' fixtures hand their work to a class:
`check` returns a `PointOutcome` and the plugin only turns it into pytest's skip, fail or pass. Recording stores the
point and holds a policy arm to its bars (analysis.policy_bar); verifying compares it with the committed figures
(analysis.verdict). Importing this module imports scipy (through the verdict), so the plugin imports it only once a
ledger point runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from specledger.analysis import verdict
from specledger.analysis.policy_bar import policy_checks
from specledger.ledger.model import LedgerError
from specledger.ledger.selection import LedgerPoint, skip_reason
from specledger.ledger.trust import UntrustedLedger
from specledger.measure.http.server_metrics import EndpointError
from specledger.measure.replication import StartMismatch
from specledger.measure.session import PointNotMeasured, StoreRefused

__all__ = ["PointOutcome", "check"]


@dataclass(frozen=True)
class PointOutcome:
    """One arm-point's result. `status` is what pytest shows (skipped, failed, passed); `verdict` is the verification's
    outcome (holds, changed, inconclusive, not comparable; None when recording or never compared); `message` says
    why it skipped or failed, or, for a passing verdict other than holds, what to look at."""

    status: Literal["skipped", "failed", "passed"]
    message: str = ""
    verdict: str | None = None


def check(session: Any, point: LedgerPoint, *, strict: bool = False) -> PointOutcome:
    """Measure `point` through the session and record or verify it; `strict` fails an inconclusive verdict."""
    reason = skip_reason(session, point)
    if reason:
        return PointOutcome("skipped", reason)
    try:
        measured = session.measure(point.ledger, point.key)
    except (UntrustedLedger, EndpointError, StoreRefused, PointNotMeasured) as exc:  # the message says what failed,
        # where (file, URL); an arm that did not start says so first (no arm up: the point was never measured)
        return _start_failure(session, point) or PointOutcome("failed", f"{point.test_id}: {exc}")
    failure = _start_failure(session, point)
    if failure is not None:
        return failure
    if session.record:
        return _record(session, point, measured)
    result = verdict.compare_point(point.ledger, point.arm, point.ledger.find_point(*point.key), measured.point,
                                   not_comparable=session.not_comparable(point.ledger, point.key))
    host = session.host_note(point.ledger, point.key)
    if host is not None:
        result.notes.append(host)
    session.results.append((point.test_id, result))
    if not result.ok or (strict and result.outcome == "inconclusive"):
        return PointOutcome("failed", result.message(point.test_id), result.outcome)
    return PointOutcome("passed", "" if result.outcome == "holds" else result.message(point.test_id), result.outcome)


def _start_failure(session: Any, point: LedgerPoint) -> PointOutcome | None:
    failure = session.arm_failure(point.ledger, point.arm)
    if failure is None:
        return None
    return PointOutcome("failed", f"{point.test_id}: arm {point.arm} did not start:\n{failure}")


def _record(session: Any, point: LedgerPoint, measured: Any) -> PointOutcome:
    """Store the measured point; a policy arm's point is stored as measured and then held to its bars."""
    try:
        session.store(point.ledger, measured)
    except (FileExistsError, StartMismatch, LedgerError) as exc:  # two ledgers, one file name; a start that
        # cannot join; a point the ledger's rules refuse (the session then measures no later point of it)
        return PointOutcome("failed", f"{point.test_id}: not recorded: {exc}")
    bars = policy_checks(point.ledger, point.arm, measured.point) \
        if point.ledger.arm(point.arm)["role"] == "policy" else []
    missed = [bar.line() for bar in bars if not bar.ok]
    if missed:  # recorded as measured, but the schedule does not hold up
        return PointOutcome("failed", f"{point.test_id}: recorded; the policy arm misses its bar\n  "
                            + "\n  ".join(missed))
    return PointOutcome("passed")
