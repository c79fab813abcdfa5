"""Ledger files: `load_ledger` (read safely, then validate), `dump_ledger` (the committed text), `write_ledger`
(validate, then write atomically; never replaces a committed ledger unless asked), the temporaries a killed write
leaves behind, and `iter_ledger_paths` (files and directories as given on a command line).

The top of the `ledger` layer: it builds on `safe_read` for reading and `validate.parse_ledger` for checking, so
nothing it does is needed by the modules below it and there is no import cycle.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specledger.ledger.model import Ledger
from specledger.ledger.safe_read import read_text_safely
from specledger.ledger.validate import parse_ledger

__all__ = [
    "dump_ledger",
    "iter_ledger_paths",
    "load_ledger",
    "remove_stale_temporaries",
    "stale_temporaries",
    "write_ledger",
    "write_text_atomically",
]

def load_ledger(path: str | os.PathLike[str]) -> Ledger:
    """Read and validate the ledger at `path` (problems name the path as given)."""
    file = str(path)
    ledger = parse_ledger(read_text_safely(path, "ledger"), file)
    ledger.path = Path(path)
    return ledger


def dump_ledger(data: Mapping[str, Any]) -> str:
    """Ledger JSON as committed: indent 2, key order kept, no NaN/Infinity, trailing newline."""
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_ledger(path: str | os.PathLike[str], data: Mapping[str, Any], *, overwrite: bool) -> None:
    """Validate `data`, then write it to `path` atomically (mode 0o644).

    Never writes an invalid ledger (LedgerError) and never replaces an existing file unless
    `overwrite` is true (FileExistsError): committed figures change only on purpose. The text
    goes to a temporary file in the same directory, is fsynced, then renamed over `path`, so a
    crash leaves either the old file or the new one, never a partial one.
    """
    target = Path(path)
    text = dump_ledger(data)
    parse_ledger(text, str(target))
    if not overwrite and target.exists():
        raise FileExistsError(
            f"{target} already exists; refusing to replace a committed ledger "
            "(re-record with --ledger-record, i.e. overwrite=True, to replace it on purpose)"
        )
    write_text_atomically(target, text)


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` through a fsynced temporary file in the same folder, renamed over it (mode 0o644):
    a crash leaves the old file or the new one, never a partial one. The caller decides whether replacing is
    allowed; ledgers go through `write_ledger`, which validates first."""
    target = Path(path)
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Temporary files `write_ledger` left beside `path` when its process was killed mid-write.

    A SIGKILL between the temporary file's creation and the rename leaves `.<name>.<random>.tmp`
    behind (the ledger itself is intact: the rename never happened). The next recording of that
    ledger removes them (`remove_stale_temporaries`).
    """
    target = Path(path)
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Delete what `stale_temporaries` finds; returns the files removed."""
    removed = []
    for tmp in stale_temporaries(path):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; best effort where directories cannot be opened (e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def iter_ledger_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, directories expanded to their `*.json` (sorted); FileNotFoundError if missing."""
    found: list[Path] = []
    for entry in paths:
        path = Path(entry)
        if path.is_dir():
            found.extend(sorted(p for p in path.glob("*.json") if p.is_file()))
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {entry}")
    return found
