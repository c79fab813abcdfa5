"""The pytest plugin end to end, in a child pytest run (no engine starts: every point here is skipped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_skipped_points_leave_pytest_benchmark_json_intact(tmp_path: Path) -> None:
    """Verify mode skips unrecorded points; pytest-benchmark must still write its JSON report.

    A skip raised inside `benchmark.pedantic` left a benchmark without data, and
    pytest-benchmark then crashed writing the JSON (seen on the H200 in a resume run).
    """
    planned = json.loads((ROOT / "ledgers" / "cpu-smollm2-policy.json").read_text())
    planned.update(status="planned", points=[], provenance={"accelerator": {"kind": "cpu"}})
    for arm in planned["arms"]:
        for measured_only in ("effective_config", "kv_cache", "sessions"):
            arm.pop(measured_only, None)
    ledger = tmp_path / "planned.json"
    ledger.write_text(json.dumps(planned))
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_ledgers.py", "-p", "no:cacheprovider", "-q",
         "-m", "not gpu", "-o", "addopts=", "--ledger", str(ledger),
         "--benchmark-json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    if report.exists():  # pytest-benchmark writes no file when nothing was benchmarked
        assert json.loads(report.read_text())["benchmarks"] == []


FAKE_MEASURE = '''
"""Test-only plugin: replaces the engine measurement with the committed point, ngram made 10x faster."""
import copy

from specledger import measure, session


def fake_measure(self, ledger, key):
    point = copy.deepcopy(ledger.find_point(*key))
    point["arms"]["ngram"]["multiplier"] *= 10
    return self._cache.setdefault((ledger.id, key), measure.PointMeasurement(key, point, {}, 0.1))


session.SuiteSession.measure = fake_measure
'''


def test_a_failing_point_keeps_its_report_and_the_benchmark_json(tmp_path: Path) -> None:
    """Out of tolerance: pytest reports measured vs committed, and pytest-benchmark still writes JSON.

    Only the plugin glue is under test here, so the engine measurement is replaced by a fake
    (a child process, so nothing leaks into this session).
    """
    (tmp_path / "fake_measure.py").write_text(FAKE_MEASURE)
    report = tmp_path / "bench.json"
    env = dict(__import__("os").environ, PYTHONPATH=f"{tmp_path}:{ROOT}")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_ledgers.py", "-p", "no:cacheprovider", "-p", "fake_measure",
         "-q", "-m", "not gpu", "-o", "addopts=", "--ledger", "ledgers/cpu-smollm2.json", "-k", "copy-T0-c1",
         "--benchmark-json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "outside the ledger's tolerance" in out and "OUT OF TOLERANCE" in out
    assert "Traceback" not in out
    benchmarks = json.loads(report.read_text())["benchmarks"]
    assert [b["extra_info"]["arm"] for b in benchmarks] == ["ngram"]
