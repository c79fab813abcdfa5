"""Prompt workloads: the committed JSONL prompt sets a benchmark run draws requests from.

Speculative-decoding gains depend on the traffic: prompt-lookup (ngram) drafting shines when
the answer is already in the prompt and does little for open-ended text. Keeping the prompt
sets as small, validated, committed files makes a ledger's "workload" a checkable fact
rather than a description.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from specledger.errors import SpecledgerError

T = TypeVar("T")

__all__ = [
    "WORKLOAD_DIR",
    "Prompt",
    "WorkloadError",
    "cycle_prompts",
    "load_workload",
    "resolve_fixture",
]

# The checkout root is this file's parent's parent; fixtures live beside the package so a
# PYTHONPATH run (no install) finds them the same way an editable install does.
WORKLOAD_DIR: Path = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"

_FIELDS: frozenset[str] = frozenset({"id", "kind", "prompt"})


class WorkloadError(SpecledgerError, ValueError):
    """A workload file is malformed; the message names the file and line so it can be fixed."""


@dataclass(frozen=True)
class Prompt:
    """One request's user message; frozen so a loaded workload cannot drift mid-run."""

    id: str
    kind: str
    prompt: str


def _parse_line(where: str, raw: str) -> Prompt:
    """Validate one JSONL line strictly: a typo'd field silently dropped would change the workload."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        raise WorkloadError(f"{where}: unknown field(s) {names}; allowed: 'id', 'kind', 'prompt'")
    for field in ("id", "kind", "prompt"):
        if field not in obj:
            raise WorkloadError(f"{where}: missing field {field!r}")
        value = obj[field]
        if not isinstance(value, str):
            raise WorkloadError(f"{where}: field {field!r} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise WorkloadError(f"{where}: field {field!r} is empty")
    return Prompt(id=obj["id"], kind=obj["kind"], prompt=obj["prompt"])


def load_workload(path: str | Path) -> list[Prompt]:
    """Load and validate a JSONL prompt set; every error names ``file:line`` (and the field)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not valid UTF-8: {exc.reason}") from None
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        prompt = _parse_line(where, raw)
        if prompt.id in first_line:
            raise WorkloadError(
                f"{where}: duplicate id {prompt.id!r} (first defined at {path}:{first_line[prompt.id]})"
            )
        first_line[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"{path}:1: empty workload (no prompts)")
    return prompts


def cycle_prompts(prompts: Sequence[T], n: int, offset: int = 0) -> list[T]:
    """Take ``n`` prompts round-robin from ``offset``.

    A closed-loop run sends more requests than there are prompts. Works on `Prompt` records
    and on plain prompt texts alike.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n and not prompts:
        raise ValueError("cannot cycle an empty prompt list")
    size = len(prompts)
    return [prompts[(offset + i) % size] for i in range(n)]


def resolve_fixture(path: str | Path, base: Path | None = None) -> Path:
    """Resolve a fixture path against the checkout root so ledgers can store repo-relative paths."""
    candidate = Path(path)
    if not candidate.is_absolute():
        root = base if base is not None else WORKLOAD_DIR.parent.parent
        candidate = root / candidate
    if not candidate.exists():
        raise FileNotFoundError(f"fixture not found: {path} (looked at {candidate})")
    return candidate
