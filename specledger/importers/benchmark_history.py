"""pytest-benchmark history saved under the old test ids, renamed to the one point grammar.

Why: `pytest-benchmark compare` lines runs up by test name, and on 2026-12-05 ledger-point test ids went from
``cpu-smollm2-ngram-copy-T0-c1`` to ``cpu-smollm2-ngram-copy:0:1`` (the grammar of `--ledger-points` and claims).
Runs saved before then would no longer meet the new ones. The old id put the point last as ``-T<t>-c<n>``, with
the temperature written ``{:g}`` as the new one is, so the rename is exact. Only the id fields of each benchmark
row change (``name``, ``fullname``, ``param`` and string ``params``); the figures are never touched.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.errors import SpecledgerError
from specledger.ledger.io import write_text_atomically
from specledger.ledger.safe_read import load_json_safely

__all__ = ["BenchmarkHistoryError", "Renamed", "rename_history", "renamed_id"]

#: The old id's point suffix: ``-T0-c1`` before the end of the id (``]`` of a node id, ``)`` of a param repr).
_OLD_POINT = re.compile(r"-T(?P<t>\d+(?:\.\d+)?(?:e-?\d+)?)-c(?P<c>\d+)(?=$|\]|\))")
_ID_FIELDS = ("name", "fullname", "param")


class BenchmarkHistoryError(SpecledgerError, ValueError):
    """A file that is not a pytest-benchmark run; the message names the file and the JSON path."""


@dataclass(frozen=True)
class Renamed:
    """One saved run: how many of its id fields the rename changed, and whether the file was rewritten."""

    path: Path
    fields: int
    written: bool


def renamed_id(text: str) -> str:
    """``test_point[cpu-smollm2-ngram-copy-T0-c1]`` -> ``test_point[cpu-smollm2-ngram-copy:0:1]``; a text
    without the old suffix comes back unchanged."""
    return _OLD_POINT.sub(lambda m: f":{m['t']}:{m['c']}", text)


def _rename_run(data: Any, path: Path) -> int:
    """Rename the id fields of every benchmark row of one saved run in place; the number changed."""
    rows = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise BenchmarkHistoryError(f"{path}: $.benchmarks: expected the list of a pytest-benchmark run")
    changed = 0
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BenchmarkHistoryError(f"{path}: $.benchmarks[{i}]: expected an object")
        params = row.get("params") if isinstance(row.get("params"), dict) else {}
        for holder, key in [*((row, f) for f in _ID_FIELDS), *((params, k) for k in params)]:
            value = holder.get(key)
            if isinstance(value, str) and (new := renamed_id(value)) != value:
                holder[key] = new
                changed += 1
    return changed


def _saved_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The JSON files named, and every *.json under a folder named (pytest-benchmark's storage is nested by
    machine)."""
    found: list[Path] = []
    for p in map(Path, paths):
        found += sorted(p.rglob("*.json")) if p.is_dir() else [p]
    return found


def rename_history(paths: Iterable[str | os.PathLike[str]], *, write: bool) -> list[Renamed]:
    """Every saved run under `paths`, renamed; written back (atomically) only with `write`, so the default is a
    dry run that says what would change. Every file is read and checked before any is written."""
    runs = []
    for path in _saved_runs(paths):
        data = load_json_safely(path, "pytest-benchmark run", strict=False)
        runs.append((path, data, _rename_run(data, path)))
    out = []
    for path, data, fields in runs:
        if write and fields:
            write_text_atomically(path, json.dumps(data, indent=4) + "\n")
        out.append(Renamed(path, fields, write and bool(fields)))
    return out
