"""Reading input files safely: `read_text_safely` (regular files only, size-bounded, UTF-8) and
`load_json_safely`, over `decode_json`, the bounded JSON decoding (depth, integer digits; for ledgers also no
NaN/Infinity and no duplicate keys) that raises LedgerError with JSON paths instead of ValueError or RecursionError.

Its own module because it is not about ledgers only: reports (`analysis.claims`) and `vllm bench serve` results
(`importers.vllm_bench`) are read through it too, and `validate.parse_ledger` decodes with it. It needs only
`model` (Problem, LedgerError, json_path), so it sits between `model` and `validate`.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from typing import Any

from specledger.ledger.model import LedgerError, Problem, json_path

__all__ = [
    "MAX_INPUT_BYTES",
    "MAX_JSON_DEPTH",
    "decode_json",
    "load_json_safely",
    "read_text_safely",
]

#: The largest input file read (ledger, report, bench result), in bytes. Real ones are well under 1 MiB;
#: anything bigger is a mistake (or a symlink to /dev/zero) and is refused before it is read.
MAX_INPUT_BYTES = 64 * 1024 * 1024
#: The deepest nesting of objects and arrays read (real ledgers are 7 deep); deeper input is refused
#: with its JSON path instead of exhausting the stack in the checks that walk it.
MAX_JSON_DEPTH = 64


class _NonFinite:
    """Stands in for a NaN/Infinity literal (or an overflowing number) until its path is known."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


class _Object(dict):
    """A JSON object that remembers keys it saw twice (plain `json` keeps the last silently)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.duplicates: list[str] = []
        for key, value in pairs:
            if key in self:
                self.duplicates.append(key)
            self[key] = value


class _TooLong:
    """Stands in for an integer with more digits than Python converts (int() would raise mid-parse)."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _plain(value: Any, parts: list[str | int], file: str, problems: list[Problem], strict: bool) -> Any:
    """Plain JSON values from the hooked parse; reports overlong integers and too deep nesting, and
    when `strict` also non-finite numbers and duplicate keys."""
    if isinstance(value, _TooLong):
        digits = len(value.literal.lstrip("-"))
        limit = sys.get_int_max_str_digits()
        problems.append(
            Problem(file, json_path(parts), f"an integer of {digits:,} digits; at most {limit:,} are read")
        )
        return None
    if isinstance(value, _NonFinite):
        if not strict:
            return float(value.literal)
        problems.append(
            Problem(file, json_path(parts), f"{value.literal} is not a finite number; ledgers allow none")
        )
        return None
    if isinstance(value, dict | list) and len(parts) >= MAX_JSON_DEPTH:
        where = json_path(parts[:8]) + "..."  # the full path is MAX_JSON_DEPTH steps long
        problems.append(Problem(file, where, f"nested deeper than {MAX_JSON_DEPTH} levels"))
        return None
    if isinstance(value, dict):
        for key in getattr(value, "duplicates", ()) if strict else ():
            problems.append(
                Problem(
                    file, json_path([*parts, key]), f"duplicate key {key!r} (JSON would keep only the last)"
                )
            )
        return {k: _plain(v, [*parts, k], file, problems, strict) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, [*parts, i], file, problems, strict) for i, v in enumerate(value)]
    return value


def decode_json(text: str, file: str, *, strict: bool = True) -> Any:
    """Parse JSON text, raising LedgerError (never ValueError or RecursionError) for what cannot be read.

    `strict` (ledgers) also refuses NaN/Infinity and duplicate keys; other JSON (bench results,
    which vLLM writes with NaN allowed) is read as `json` reads it, but still bounded.
    """
    if not text.strip():
        raise LedgerError([Problem(file, "$", "empty file: expected a JSON object")])
    odd: list[object] = []  # markers made while parsing; none (the usual case) lets the tree be used as parsed

    def constant(literal: str) -> _NonFinite:
        odd.append(marker := _NonFinite(literal))
        return marker

    def number(literal: str) -> float | _NonFinite:
        value = float(literal)
        return value if math.isfinite(value) else constant(literal)

    def integer(literal: str) -> int | _TooLong:
        try:
            return int(literal)
        except ValueError:  # over sys.get_int_max_str_digits(): reported with its JSON path
            odd.append(marker := _TooLong(literal))
            return marker

    def obj(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        plain = dict(pairs)
        if len(plain) == len(pairs):
            return plain
        odd.append(marker := _Object(pairs))
        return marker

    try:
        raw = json.loads(text, parse_constant=constant, parse_float=number, parse_int=integer, object_pairs_hook=obj)
    except json.JSONDecodeError as e:
        truncated = e.pos >= len(text.rstrip())
        what = "JSON ends early (truncated file?)" if truncated else "invalid JSON"
        raise LedgerError(
            [Problem(file, "$", f"{what} at line {e.lineno}, column {e.colno}: {e.msg}")]
        ) from None
    except RecursionError:
        raise LedgerError([Problem(file, "$", f"nested deeper than {MAX_JSON_DEPTH} levels")]) from None
    if not odd and _depth(raw) <= MAX_JSON_DEPTH:
        return raw
    problems: list[Problem] = []
    data = _plain(raw, [], file, problems, strict)
    if problems:
        raise LedgerError(problems)
    return data


def _depth(value: Any) -> int:
    """Levels of nested objects and arrays (a scalar: 0), counted breadth-first and without recursion,
    stopping once past MAX_JSON_DEPTH."""
    depth, level = 0, [value]
    while depth <= MAX_JSON_DEPTH:
        level = [v for v in level if isinstance(v, dict | list)]
        if not level:
            return depth
        depth += 1
        level = [child for v in level for child in (v.values() if isinstance(v, dict) else v)]
    return depth


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is not read (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


def read_text_safely(path: str | os.PathLike[str], what: str, *, where: str = "$") -> str:
    """The UTF-8 text of the regular file at `path`, else LedgerError naming the file (at `where`).

    Every input reader goes through here so that no input can hang or crash a run: a FIFO
    would block an open, a device (a symlink to /dev/zero) would read forever, a huge file
    would take minutes, and bytes that are not UTF-8 would raise. `what` names the kind of
    file in messages ("ledger", "report", "result file"); `where` is "$" for JSON inputs and
    "" for text ones.
    """
    file = str(path)

    def refuse(message: str) -> LedgerError:
        return LedgerError([Problem(file, where, message)])

    try:
        reason = _not_regular(os.stat(path).st_mode)  # before opening: opening a device can act
        if reason is not None:
            raise refuse(f"{reason}; a {what} must be a plain file")
        # O_NONBLOCK: should the path become a FIFO after the check, the open returns at once
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            reason = _not_regular(info.st_mode)
            if reason is not None:
                raise refuse(f"{reason}; a {what} must be a plain file")
            data = b"" if info.st_size > MAX_INPUT_BYTES else handle.read(MAX_INPUT_BYTES + 1)
            size = max(info.st_size, len(data))
    except OSError as e:
        raise refuse(f"cannot read: {e.strerror or e}") from None
    if size > MAX_INPUT_BYTES:
        raise refuse(
            f"too large: {size:,} bytes; a {what} may be at most {MAX_INPUT_BYTES // 2**20} MiB "
            "(specledger.ledger.safe_read.MAX_INPUT_BYTES)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise refuse(f"not UTF-8 text: {e.reason} at byte {e.start} (line {line})") from None


def load_json_safely(path: str | os.PathLike[str], what: str, *, strict: bool = True) -> Any:
    """The JSON value in the file at `path` (read with read_text_safely), else LedgerError.

    `strict` is for ledgers (no NaN/Infinity, no duplicate keys); any JSON input gets the
    bounds: integers Python can convert, at most MAX_JSON_DEPTH levels of nesting.
    """
    return decode_json(read_text_safely(path, what), str(path), strict=strict)
