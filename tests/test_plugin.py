"""The pytest plugin end to end, in a child pytest run (no engine starts: every point here is skipped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from repo_paths import ROOT

from specledger.ledger.migrate import replan_data


def test_skipped_points_leave_pytest_benchmark_json_intact(tmp_path: Path) -> None:
    """Verify mode skips unrecorded points; pytest-benchmark must still write its JSON report.

    A skip raised inside `benchmark.pedantic` left a benchmark without data, and
    pytest-benchmark then crashed writing the JSON (seen on the H200 in a resume run).
    """
    planned = replan_data(json.loads((ROOT / "ledgers" / "cpu-smollm2-policy.json").read_text()))
    assert planned["provenance"]["accelerator"]["kind"] == "cpu"  # a CPU ledger: selected by -m "not gpu"
    ledger = tmp_path / "planned.json"
    ledger.write_text(json.dumps(planned))
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/engine/test_ledgers.py", "-p", "no:cacheprovider", "-q",
         "-m", "not gpu", "-o", "addopts=", "--ledger", str(ledger),
         "--benchmark-json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    if report.exists():  # pytest-benchmark writes no file when nothing was benchmarked
        assert json.loads(report.read_text())["benchmarks"] == []


FAKE_MEASURE = '''
"""Test-only plugin: replaces the engine measurement with the committed point, ngram's repeats rescaled."""
import copy
import os

from specledger.measure import procedure, session

#: changed: ngram 10x faster in every repeat; noisy: ngram's repeats scattered +-40% around the committed ones
FACTORS = {"changed": [10.0], "noisy": [0.6, 1.4, 0.8, 1.2, 1.0, 0.7, 1.3], "same": [1.0]}[os.environ["FAKE_MODE"]]
WALL_S = float(os.environ.get("FAKE_WALL_S", "0.1"))


def fake_measure(self, ledger, key):
    point = copy.deepcopy(ledger.find_point(*key))
    tps = point["arms"]["ngram"]["output_tokens_per_s"]
    tps["repeats"] = [v * FACTORS[i % len(FACTORS)] for i, v in enumerate(tps["repeats"])]
    timings = {name: [{"window_s": 5.0, "output_tokens": int(v * 5), "output_tokens_per_s": v}
                      for v in res["output_tokens_per_s"]["repeats"]] for name, res in point["arms"].items()}
    return self._cache.setdefault((ledger.id, key), procedure.PointMeasurement(key, point, timings, WALL_S))


session.SuiteSession.measure = fake_measure
'''


def _fake_run(tmp_path: Path, mode: str, *extra: str, select: tuple[str, ...] = ("-k", "copy-T0-c1"),
              wall_s: float = 0.1) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "fake_measure.py").write_text(FAKE_MEASURE)
    report = tmp_path / "bench.json"
    env = dict(__import__("os").environ, PYTHONPATH=f"{tmp_path}:{ROOT}", FAKE_MODE=mode, FAKE_WALL_S=str(wall_s))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/engine/test_ledgers.py", "-p", "no:cacheprovider", "-p", "fake_measure",
         "-q", "-m", "not gpu", "-o", "addopts=", "--ledger", "ledgers/cpu-smollm2.json", *select,
         "--benchmark-json", str(report), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return proc, report


def test_a_changed_point_fails_and_every_arm_keeps_its_benchmark_row(tmp_path: Path) -> None:
    """ngram 10x faster: its test fails as changed (up) with both CIs; pytest-benchmark still writes JSON,
    one row per arm, timed in seconds per output token per window (so OPS is tokens/s).

    Only the plugin glue is under test here, so the engine measurement is replaced by a fake
    (a child process, so nothing leaks into this session).
    """
    proc, report = _fake_run(tmp_path, "changed")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "changed (up)" in out and "95% CI" in out and "Traceback" not in out
    assert "specledger verdicts" in out and "1 changed, 1 holds" in out, out[-3000:]
    rows = {b["extra_info"]["arm"]: b for b in json.loads(report.read_text())["benchmarks"]}
    assert sorted(rows) == ["baseline", "ngram"]
    ngram = rows["ngram"]
    assert ngram["extra_info"]["unit"].startswith("seconds per output token") and "multiplier" in ngram["extra_info"]
    repeats = json.loads((ROOT / "ledgers" / "cpu-smollm2.json").read_text())["points"][0]["arms"]["ngram"]
    assert ngram["stats"]["rounds"] == len(repeats["output_tokens_per_s"]["repeats"])
    fresh_mean = sum(v * 10 for v in repeats["output_tokens_per_s"]["repeats"]) / ngram["stats"]["rounds"]
    assert 0.8 * fresh_mean < ngram["stats"]["ops"] <= 1.01 * fresh_mean  # harmonic mean of tok/s


def test_an_inconclusive_point_is_its_own_outcome_and_fails_only_when_strict(tmp_path: Path) -> None:
    proc, _ = _fake_run(tmp_path, "noisy")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    summary = next(line for line in out.splitlines() if " passed" in line and " in " in line)
    assert "1 inconclusive" in summary and "repeats needed" in out, out[-3000:]
    strict, _ = _fake_run(tmp_path, "noisy", "--ledger-strict")
    assert strict.returncode == 1 and "inconclusive" in strict.stdout, strict.stdout[-3000:]


def test_points_run_in_the_selections_order_and_stop_at_the_time_budget(tmp_path: Path) -> None:
    """A time-boxed GPU slot: `--ledger-points` is the run order, and once the next point (as slow as the
    slowest so far, here a fake 100 s) would end past `--ledger-budget-s`, the rest are skipped."""
    proc, _ = _fake_run(tmp_path, "same", "-v", "-v", "-rs", "--ledger-budget-s", "50",
                        select=("--ledger-points", "free-form:0:2,copy:0:1"), wall_s=100.0)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    ran = [line.split("[", 1)[1].split("]")[0] for line in out.splitlines()
           if line.startswith("tests/engine/test_ledgers.py::")]
    assert ran[:2] == ["cpu-smollm2-baseline-free-form-T0-c2", "cpu-smollm2-ngram-free-form-T0-c2"], out[-3000:]
    assert all("PASSED" in line for line in out.splitlines() if "free-form-T0-c2" in line and "::" in line)
    skipped = [line for line in out.splitlines() if "copy-T0-c1" in line and "::" in line]
    assert skipped and all("SKIPPED" in line for line in skipped), out[-3000:]
    assert "time budget" in out and "--ledger-only-missing" in out


def test_the_cuda_skip_touches_only_ledger_points(tmp_path: Path) -> None:
    """Installed through its entry point, the plugin is active in every project: another project's own
    `gpu` test must run (and here fail on purpose) rather than be skipped for want of CUDA."""
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\n@pytest.mark.gpu\ndef test_theirs():\n    assert False, 'ran'\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: theirs\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-q", str(tmp_path / "test_other.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert "1 failed" in out and "ran" in out, out[-2000:]


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    """Once installed, the plugin loads in every pytest session of every project (the `pytest11` entry point):
    it must not pull jsonschema, pandas, matplotlib, torch or vLLM in before a ledger is in play."""
    heavy = ("jsonschema", "pandas", "matplotlib", "scipy", "torch", "vllm")
    code = ("import sys, specledger.plugin; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


PLAN_SPY = '''
"""Test-only plugin: writes what the session planned when the first point is measured, then measures as the fake."""
import json
import os

from specledger.measure import session

measure = session.SuiteSession.measure


def spy(self, ledger, key):
    path = os.environ["PLAN_OUT"]
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({"starts": self.starts, "planned": {lid: [list(k) for k in keys]
                                                          for lid, keys in self._planned.items()}}, f)
    return measure(self, ledger, key)


session.SuiteSession.measure = spy
'''


def test_several_engine_starts_plan_every_selected_point_before_the_first_is_measured(tmp_path: Path) -> None:
    """--ledger-starts 2: the session knows every selected point of the ledger, in the selection's order, when the
    first one is measured (each start measures them all); with one start it plans nothing."""
    (tmp_path / "plan_spy.py").write_text(PLAN_SPY)
    for starts in ("2", "1"):
        plan = tmp_path / f"plan-{starts}.json"
        env = {"PLAN_OUT": str(plan), "PYTHONPATH": f"{tmp_path}:{ROOT}"}
        (tmp_path / "fake_measure.py").write_text(FAKE_MEASURE)
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/engine/test_ledgers.py", "-p", "no:cacheprovider", "-p",
             "fake_measure", "-p", "plan_spy", "-q", "-m", "not gpu", "-o", "addopts=", "--ledger",
             "ledgers/cpu-smollm2.json", "--ledger-points", "free-form:0:2,copy:0:1", "--ledger-starts", starts],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=dict(__import__("os").environ, FAKE_MODE="same", **env))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        seen = json.loads(plan.read_text())
        assert seen["starts"] == int(starts)
        expected = {"cpu-smollm2": [["free-form", 0.0, 2], ["copy", 0.0, 1]]} if starts == "2" else {}
        assert seen["planned"] == expected
