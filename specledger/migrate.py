"""Rewrite schema version 1 ledgers as version 2 without inventing a figure.

Why: version 2 marks which measurement protocol produced each point, so that figures measured
before protocol v3 (one closed-loop burst per repeat) are never read as v3 figures. The rewrite
only sets `schema_version` to 2 and marks every point that holds figures `"protocol_version": 1`
(placed after its conditions); nothing else changes, key order included, so the diff of a
migrated ledger is those lines alone. A version 2 ledger is left as it is. Every result is
validated against version 2 before it is printed or written (`schema.write_ledger`, atomic).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.schema import SCHEMA_VERSION, Ledger, dump_ledger, load_ledger, parse_ledger

__all__ = ["Migration", "has_figures", "migrate_data", "migrate_file"]

#: Keys a point's protocol_version goes after (the point's conditions), in this order of preference.
_CONDITION_KEYS = ("concurrency", "temperature", "workload")


def has_figures(point: Mapping[str, Any]) -> bool:
    """Whether a point holds any measured (or published) figure: some arm result is not empty."""
    arms = point.get("arms")
    return isinstance(arms, Mapping) and any(isinstance(r, Mapping) and r for r in arms.values())


def _with_protocol_version(point: Mapping[str, Any]) -> dict[str, Any]:
    """The point with `"protocol_version": 1` after its conditions (workload, temperature, concurrency)."""
    anchor = next((k for k in _CONDITION_KEYS if k in point), None)
    out: dict[str, Any] = {}
    if anchor is None:
        out["protocol_version"] = 1
    for key, value in point.items():
        out[key] = value
        if key == anchor:
            out["protocol_version"] = 1
    return out


def migrate_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 ledger's data as version 2: a new dict, the input untouched.

    ValueError for anything but version 1 (a version 2 ledger needs no migration; callers check).
    """
    version = data.get("schema_version")
    if version != 1:
        raise ValueError(f"migrate_data migrates schema_version 1 ledgers, not {version!r}")
    out = copy.deepcopy(dict(data))
    out["schema_version"] = SCHEMA_VERSION
    out["points"] = [
        _with_protocol_version(p) if isinstance(p, Mapping) and has_figures(p) and "protocol_version" not in p else p
        for p in out.get("points", [])
    ]
    return out


@dataclass(frozen=True)
class Migration:
    """One ledger file and what migrating it gives: `data` is None when it is already version 2."""

    path: Path
    ledger: Ledger
    data: dict[str, Any] | None

    @property
    def already_current(self) -> bool:
        return self.data is None

    @property
    def points_marked(self) -> int:
        """How many points the migration marked protocol_version 1."""
        if self.data is None:
            return 0
        before = sum(1 for p in self.ledger.points if "protocol_version" in p)
        return sum(1 for p in self.data["points"] if "protocol_version" in p) - before

    def text(self) -> str:
        """The migrated ledger as committed (the original's text again when it was already version 2)."""
        return dump_ledger(self.ledger.data if self.data is None else self.data)


def migrate_file(path: str | os.PathLike[str]) -> Migration:
    """Load the ledger at `path` (LedgerError if it does not load) and migrate it in memory.

    The result is validated as version 2 here too, so that nothing invalid is ever printed.
    """
    ledger = load_ledger(path)
    if ledger.schema_version == SCHEMA_VERSION:
        return Migration(Path(path), ledger, None)
    data = migrate_data(ledger.data)
    parse_ledger(dump_ledger(data), str(path))
    return Migration(Path(path), ledger, data)
