"""scripts/gpu-cache keep: a compile cache that came back with a part left out must not replace the one that works.

Why: a device call brings back at most 64 MiB. On 2026-12-06 a 76 MiB cache came back as parts .00-.05 without .04,
and keeping it would have replaced the good cache with one that cannot be unpacked on the next visit.
"""
from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

from repo_paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu-cache"


def _keep(src: Path, work: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "keep", str(src)], cwd=work, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "SPECLEDGER_GPU_CACHE_HOME": str(home)},
                          check=False)


def _parts(folder: Path, numbers: list[int], content: str) -> None:
    """Stand-in parts whose bytes are not a gzip stream: for the checks that come before unpacking."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in numbers:
        (folder / f"compile-cache.tgz.{n:02d}").write_text(f"{content}{n}")


def _gzip_parts(folder: Path, count: int) -> list[bytes]:
    """A real gzip stream (incompressible, so it spans every part) cut into `count` parts, as gpu-visit packs one."""
    folder.mkdir(parents=True, exist_ok=True)
    stream = gzip.compress(os.urandom(64 * 1024))
    size = -(-len(stream) // count)
    chunks = [stream[i * size:(i + 1) * size] for i in range(count)]
    for n, chunk in enumerate(chunks):
        (folder / f"compile-cache.tgz.{n:02d}").write_bytes(chunk)
    return chunks


def test_parts_with_a_gap_leave_the_kept_cache_alone(tmp_path: Path) -> None:
    work, home, returned = tmp_path / "work", tmp_path / "home", tmp_path / "returned"
    _parts(work / ".compile-cache", [0, 1, 2], "good")
    _parts(returned, [0, 1, 2, 3, 5], "new")  # .04 left out on the way back
    result = _keep(returned, work, home)
    assert result.returncode == 1
    assert "compile-cache.tgz.04" in result.stderr
    kept = sorted(p.name for p in (work / ".compile-cache").iterdir())
    assert kept == ["compile-cache.tgz.00", "compile-cache.tgz.01", "compile-cache.tgz.02"]
    assert (work / ".compile-cache" / "compile-cache.tgz.00").read_text() == "good0"


def test_a_last_part_left_out_leaves_the_kept_cache_alone(tmp_path: Path) -> None:
    """Parts .00-.02 of .00-.03 have no gap, yet do not unpack: the joined stream is tested, not only the names."""
    work, home, returned = tmp_path / "work", tmp_path / "home", tmp_path / "returned"
    _parts(work / ".compile-cache", [0, 1, 2], "good")
    _gzip_parts(returned, 4)
    (returned / "compile-cache.tgz.03").unlink()
    result = _keep(returned, work, home)
    assert result.returncode == 1
    assert "whole gzip stream" in result.stderr
    assert (work / ".compile-cache" / "compile-cache.tgz.00").read_text() == "good0"
    assert not home.exists() or not any(home.iterdir())


def test_whole_parts_replace_the_kept_cache(tmp_path: Path) -> None:
    work, home, returned = tmp_path / "work", tmp_path / "home", tmp_path / "returned"
    _parts(work / ".compile-cache", [0, 1, 2], "old")
    chunks = _gzip_parts(returned, 2)
    result = _keep(returned, work, home)
    assert result.returncode == 0, result.stderr
    for folder in (work / ".compile-cache", home):
        assert [p.read_bytes() for p in sorted(folder.iterdir())] == chunks


def test_gpu_run_and_gpu_visit_share_one_compile_cache_environment() -> None:
    """A gpu-run outside gpu-visit's job must find the cache gpu-visit restored (2026-12-06 23:18: one that did not
    built its arms in 274 s, against 70-93 s). Both source scripts/gpu-cache-env; a value already set is kept."""
    for script in ("gpu-run", "gpu-visit"):
        assert 'source "$(dirname "$0")"/gpu-cache-env' in (ROOT / "scripts" / script).read_text()
    shown = subprocess.run(
        ["bash", "-c", f'source {ROOT / "scripts" / "gpu-cache-env"}; '
                       'echo "$VLLM_CACHE_ROOT $TORCHINDUCTOR_CACHE_DIR $TRITON_CACHE_DIR $FLASHINFER_WORKSPACE_BASE"'],
        env={"PATH": "/usr/bin:/bin", "TRITON_CACHE_DIR": "/elsewhere"}, capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["/tmp/compile-cache/vllm", "/tmp/compile-cache/inductor", "/elsewhere",
                                    "/tmp/compile-cache/flashinfer-base"]
