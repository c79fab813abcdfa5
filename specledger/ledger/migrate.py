"""Rewrite schema version 1 ledgers as version 2 without inventing a figure; plan a re-recording.

Why: version 2 marks which measurement protocol produced each point, so that figures measured
before protocol v3 (one closed-loop burst per repeat) are never read as v3 figures. The rewrite
only sets `schema_version` to 2 and marks every point that holds figures `"protocol_version": 1`
(placed after its conditions); nothing else changes, key order included, so the diff of a
migrated ledger is those lines alone. A version 2 ledger is left as it is. Every result is
validated against version 2 before it is printed or written (`io.write_ledger`, atomic).

`replan_data` is the other way to a current ledger: a ledger whose figures came from an older
protocol is not edited into a newer one, it is measured again. It keeps the conditions (target,
arms, workloads, sampling, sweep grid, tolerances, rounding) and the accelerator the ledger is meant
for, so `-m gpu` still selects a planned GPU ledger, and drops every figure and every measured fact.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.ledger.io import dump_ledger, load_ledger
from specledger.ledger.model import DEFAULT_PROTOCOL, SCHEMA_VERSION, Ledger, has_figures, protocol_with_overrides
from specledger.ledger.validate import parse_ledger

__all__ = ["Migration", "migrate_data", "migrate_file", "replan_data"]

#: What a recording writes into an arm (its engine's facts): a planned ledger states none of them.
_MEASURED_ARM_KEYS = ("effective_config", "kv_cache", "sessions")
#: Protocol v1/v2 sweep keys that protocol v3 replaces with `protocol` (repeats, window, warm-up).
_V1_SWEEP_KEYS = ("repeats", "requests_per_repeat", "warmup_requests")
#: Top-level keys that hold measured or derived figures.
_FIGURE_KEYS = ("provenance", "critical_concurrency", "claims", "start_spread")

#: Keys a point's protocol_version goes after (the point's conditions), in this order of preference.
_CONDITION_KEYS = ("concurrency", "temperature", "workload")


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


def replan_data(data: Mapping[str, Any], protocol: Mapping[str, Any] | None = None,
                note: str | None = None) -> dict[str, Any]:
    """A planned ledger with `data`'s conditions, for recording again under protocol v3.

    `protocol` overrides, per section (``{"window": {"min_s": 2.5}}`` keeps the other window keys), the protocol of
    a v3 source, else the defaults: a replan for another card keeps the windows and repeats its source's curve was
    measured with (on 2026-12-05 a replan without --protocol took the defaults, 10 s windows against the source's
    2.5 s, and its first visit ran them). The accelerator kind, name, count and memory survive, so a GPU ledger
    stays one and is still checked against its card (specledger.ledger.gpu_memory). The old notes describe the old
    figures and are dropped; `note` (or a line naming the source) replaces them.
    """
    out = copy.deepcopy(dict(data))
    accelerator = (out.get("provenance") or {}).get("accelerator")
    for key in _FIGURE_KEYS:
        out.pop(key, None)
    if accelerator:
        out["provenance"] = {"accelerator": {k: v for k, v in accelerator.items()
                                             if k in ("kind", "name", "count", "memory_gib")}}  # the card, not a run
    out["schema_version"] = SCHEMA_VERSION
    out["status"] = "planned"
    out["points"] = []
    for arm in out.get("arms", []):
        for key in _MEASURED_ARM_KEYS:
            arm.pop(key, None)
    out["sweep"] = {k: v for k, v in (out.get("sweep") or {}).items() if k not in _V1_SWEEP_KEYS}
    unknown = [key for key in protocol or {} if key not in DEFAULT_PROTOCOL]
    if unknown:
        raise ValueError(f"protocol has no setting {unknown[0]!r} (known: {', '.join(DEFAULT_PROTOCOL)})")
    source = data.get("protocol")
    base = protocol_with_overrides(source) if isinstance(source, Mapping) and source.get("version") == 3 \
        else DEFAULT_PROTOCOL  # the source's sections over the defaults, so a newer default key is not lost
    out["protocol"] = protocol_with_overrides(protocol, base)
    out["notes"] = [note or f"Planned from {data.get('id')!r} ({data.get('status')}) to be recorded with protocol v3: "
                    "its figures, if any, stay wherever that ledger was kept."]
    return out
