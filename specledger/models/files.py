"""The build cache's file plumbing: where it lives, a cross-process lock, file hashes, progress on stderr.

Why its own module: finding wheels, assembling split GGUFs and building folders all write into one cache
that several processes (pytest-xdist workers, a CLI beside a test run) may share.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specledger.models.registry import EmbeddedModelError

LOCK_TIMEOUT_S = 1800.0


def progress(msg: str, since: float | None = None) -> None:
    """Builds take tens of seconds; say what is happening on stderr (never stdout: CLIs print data there)."""
    suffix = f" in {time.monotonic() - since:.1f}s" if since is not None else ""
    print(f"specledger: {msg}{suffix}", file=sys.stderr, flush=True)


def cache_root(cache_dir: Path | None = None) -> Path:
    """`cache_dir`, else $SPECLEDGER_CACHE, else $XDG_CACHE_HOME/specledger, else ~/.cache/specledger."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser().resolve()
    if os.environ.get("SPECLEDGER_CACHE"):
        return Path(os.environ["SPECLEDGER_CACHE"]).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "specledger").resolve()


@contextmanager
def locked(path: Path, what: str) -> Iterator[None]:
    """Serialise builders across processes; say so when we have to wait for another one."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(f"waiting for another process {what} (lock {path}) ...")
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            raise EmbeddedModelError(
                f"gave up after {LOCK_TIMEOUT_S:.0f}s waiting for lock {path}; "
                "if no other specledger process is running, delete the lock file"
            ) from None
    try:
        yield
    finally:
        lock.release()


SHA_MEMO: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, memoised per (path, size, mtime) because a 98 MB hash costs ~0.3 s."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in SHA_MEMO:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        SHA_MEMO[key] = h.hexdigest()
    return SHA_MEMO[key]


def record_sha256(record_hash: str) -> str | None:
    """Hex digest from a wheel RECORD hash (`sha256=<urlsafe b64, unpadded>`), None for other algorithms."""
    algo, _, value = record_hash.partition("=")
    if algo != "sha256" or not value:
        return None
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def release_freed_memory() -> None:
    """Hand the heap that a build freed back to the OS (glibc's `malloc_trim`; a no-op elsewhere).

    Why: dequantizing keeps hundreds of MB of freed float32 buffers in glibc's arenas, more with one arena per
    thread: 0.5-0.9 GB of resident memory after the Qwen 0.5B build in a long-lived process such as pytest,
    where the CPU engines that start next size their KV cache from the memory still available.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
