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
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_ledgers.py", "-p", "no:cacheprovider", "-q",
         "-m", "not gpu", "-o", "addopts=", "--ledger", "ledgers/cpu-smollm2-policy.json",
         "--benchmark-json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    if report.exists():  # pytest-benchmark writes no file when nothing was benchmarked
        assert json.loads(report.read_text())["benchmarks"] == []
