"""scripts/gpu-land: a GPU visit's results land in the tree and are committed, nothing a call wrote is dropped.

Why: the device tool's folders go with the session (four measured points were lost so on 2026-12-04), and on
2026-12-06 a verification run on the warm machine wrote its files outside results.tgz, which gpu-land had dropped.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from repo_paths import ROOT

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org"}


def _repo(tmp_path: Path) -> Path:
    """A throwaway git work tree holding the two scripts gpu-land runs."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "reports" / "evidence").mkdir(parents=True)
    for name in ("gpu-land", "gpu-cache"):
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "add", "."], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "scripts"], cwd=repo, check=True, env=env)
    return repo


def _results_tgz(path: Path, files: dict[str, str]) -> None:
    """A results.tgz as gpu-visit packs one: results/<file> (as in a real visit's pack)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"results/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _land(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(repo / "scripts" / "gpu-land"), *args], cwd=repo.parent, capture_output=True,
                          text=True, env={**os.environ, **GIT_ENV}, check=False)


def test_the_newest_pack_tails_and_every_other_file_land_in_one_commit(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    first, second, third = (tmp_path / f"call{i}" for i in (1, 2, 3))
    for folder in (first, second, third):
        folder.mkdir()
    _results_tgz(first / "results.tgz", {"ledgers/x.json": "{}", "job.log": "old"})
    (first / "tail.txt").write_text("job started")
    _results_tgz(second / "results.tgz", {"ledgers/x.json": '{"points": []}', "job.log": "new"})
    (second / "tail.txt").write_text("job ended")
    (third / "run3").mkdir()  # a run outside gpu-visit's job: no results.tgz, no tail.txt
    (third / "run3" / "summary-verify.txt").write_text("verified 3 arm-points")
    result = _land(repo, "visit-a", str(first), str(second), str(third))
    assert result.returncode == 0, result.stderr
    dest = repo / "reports" / "evidence" / "incoming" / "visit-a"
    assert (dest / "results" / "job.log").read_text() == "new"  # the newest pack, unpacked one level up
    assert (dest / "results" / "ledgers" / "x.json").read_text() == '{"points": []}'
    assert [(dest / f"tail-0{i}.txt").read_text() for i in (1, 2)] == ["job started", "job ended"]
    assert (dest / "call-03" / "run3" / "summary-verify.txt").read_text() == "verified 3 arm-points"
    assert not (dest / "call-01").exists() and not (dest / "call-02").exists()  # nothing else in those calls
    committed = subprocess.run(["git", "show", "--name-only", "--format=%s", "HEAD"], cwd=repo, capture_output=True,
                               text=True, check=True).stdout
    assert committed.startswith("incoming: GPU visit visit-a")
    assert "reports/evidence/incoming/visit-a/call-03/run3/summary-verify.txt" in committed
    assert not list((repo / "reports" / "evidence").glob(".landing.*"))  # no half-landed folder left behind


def test_a_name_already_landed_is_never_written_over(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    call = tmp_path / "call"
    call.mkdir()
    _results_tgz(call / "results.tgz", {"job.log": "first"})
    assert _land(repo, "visit-b", str(call)).returncode == 0
    _results_tgz(call / "results.tgz", {"job.log": "second"})
    again = _land(repo, "visit-b", str(call))
    assert again.returncode == 1 and "exists" in again.stderr
    assert (repo / "reports" / "evidence" / "incoming" / "visit-b" / "results" / "job.log").read_text() == "first"


def test_the_landing_is_slimmed_for_the_checkout_that_travels_with_every_call(tmp_path: Path) -> None:
    """Logs and JUnit XML over 32 KiB land gzipped and a ledger written twice lands once, the other a link to it:
    the checkout travels with every device call (64 MiB with the staged parts), and on 2026-12-07 the day's parts no
    longer fit beside the grown evidence. Every byte is still there; small files stay as they are."""
    import gzip

    repo = _repo(tmp_path)
    call = tmp_path / "call"
    call.mkdir()
    log = "".join(f"[specledger] copy:0:{i} ngram window {i}: 123.4 tok/s\n" for i in range(2000))
    ledger = '{"points": [' + ",".join(f'{{"c": {i}}}' for i in range(1000)) + "]}"
    _results_tgz(call / "results.tgz", {"run/pytest-record.log": log, "run/junit-record.xml": "<x/>" * 10_000,
                                        "run/x.json": ledger, "ledgers/x.json": ledger, "job.log": "short"})
    result = _land(repo, "visit-c", str(call))
    assert result.returncode == 0, result.stderr
    dest = repo / "reports" / "evidence" / "incoming" / "visit-c" / "results"
    assert not (dest / "run" / "pytest-record.log").exists()
    assert gzip.decompress((dest / "run" / "pytest-record.log.gz").read_bytes()).decode() == log
    assert gzip.decompress((dest / "run" / "junit-record.xml.gz").read_bytes()).decode() == "<x/>" * 10_000
    assert (dest / "job.log").read_text() == "short"  # under 32 KiB: as it came
    assert not (dest / "ledgers" / "x.json").is_symlink() and (dest / "run" / "x.json").is_symlink()
    assert os.readlink(dest / "run" / "x.json") == "../ledgers/x.json"
    assert (dest / "run" / "x.json").read_text() == ledger
    assert "ledgers/x.json" in result.stdout
