"""scripts/gpu-cache keep: a compile cache that came back with a part left out must not replace the one that works.

Why: a device call brings back at most 64 MiB. On 2026-12-06 a 76 MiB cache came back as parts .00-.05 without .04,
and keeping it would have replaced the good cache with one that cannot be unpacked on the next visit.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from repo_paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu-cache"


def _keep(src: Path, work: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "keep", str(src)], cwd=work, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "SPECLEDGER_GPU_CACHE_HOME": str(home)},
                          check=False)


def _parts(folder: Path, numbers: list[int], content: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in numbers:
        (folder / f"compile-cache.tgz.{n:02d}").write_text(f"{content}{n}")


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


def test_whole_parts_replace_the_kept_cache(tmp_path: Path) -> None:
    work, home, returned = tmp_path / "work", tmp_path / "home", tmp_path / "returned"
    _parts(work / ".compile-cache", [0, 1, 2], "old")
    _parts(returned, [0, 1], "new")
    result = _keep(returned, work, home)
    assert result.returncode == 0, result.stderr
    for folder in (work / ".compile-cache", home):
        assert sorted(p.read_text() for p in folder.iterdir()) == ["new0", "new1"]
