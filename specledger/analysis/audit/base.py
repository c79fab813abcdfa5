"""The audit's common ground: a finding, its severities, and the walker every check reports to.

Each check (points, kv, critical, stated, noise) is a function of an `Auditor`, so a check reads the
ledger and reports findings and nothing else; `specledger.analysis.audit` runs them in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specledger.ledger import Ledger
from specledger.ledger.model import json_path
from specledger.ledger.selection import point_label

Severity = Literal["error", "warning", "info"]
#: Severities from least to most serious (index = rank).
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")

Parts = list[str | int]


@dataclass(frozen=True)
class Finding:
    """One audit observation, located like a load Problem (file + JSON path of the value)."""

    severity: Severity
    file: str
    json_path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.json_path}: {self.severity}: {self.message} [{self.code}]"


def num(x: float) -> str:
    """A figure as the ledger writes it: 2306 for an int, 3.0 and 88.7 for floats (shortest repr)."""
    return str(x) if isinstance(x, int) else repr(float(x))


def where(point: Mapping[str, Any]) -> str:
    """A point's conditions for a message, in the one point grammar: copy:0:16."""
    return point_label((point["workload"], point.get("temperature"), point.get("concurrency")))


class Auditor:
    """Walks one ledger and collects findings; `bad` is the severity of an inconsistency here."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.reference = ledger.status == "reference"
        self.bad: Severity = "warning" if self.reference else "error"
        self.findings: list[Finding] = []

    def add(self, parts: Parts, code: str, message: str, severity: Severity | None = None) -> None:
        self.findings.append(Finding(severity or self.bad, self.ledger.file, json_path(parts), code, message))

    def verdict(self, parts: Parts, code: str, holds: bool, message: str, *, info: bool) -> None:
        """Report a rounding check: a failure always, a success as info when asked."""
        if not holds:
            self.add(parts, code, message)
        elif info:
            self.add(parts, code, message, "info")

    def k_of(self, arm_name: str) -> int | None:
        """Draft length k from the arm's speculative_config, when known."""
        try:
            config = self.ledger.arm(arm_name).get("speculative_config") or {}
        except KeyError:
            return None
        k = config.get("num_speculative_tokens")
        return k if isinstance(k, int) else None
