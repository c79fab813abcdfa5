"""The pytest plugin end to end, in an inner pytest run (pytester, in this process; no engine starts).

The engine measurement is replaced by a plugin object handed to the inner run: it patches
`SuiteSession.measure` in `pytest_configure` and undoes it in `pytest_unconfigure`, so nothing leaks into this
session (each test checks that). Only `test_loading_the_plugin_imports_nothing_heavy` needs a fresh interpreter,
and the pytest-xdist runs of `test_gpu_assignment` need worker processes: those stay subprocesses.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from repo_paths import CPU_LEDGER, ROOT

from specledger.ledger.migrate import replan_data
from specledger.measure import procedure, session

TEST_LEDGERS = str(ROOT / "tests" / "engine" / "test_ledgers.py")
INNER = ("-p", "no:cacheprovider", "-m", "not gpu", "-o", "addopts=")


class FakeMeasure:
    """Test-only plugin: each point is the committed one, ngram's repeats rescaled by `factors` in turn, taking
    `wall_s` seconds of pretend measuring (the time budget reads it). `seen` lists the points measured, and
    `on_measure` sees the session at each one."""

    #: changed: ngram 10x faster in every repeat; noisy: ngram's repeats scattered +-40% around the committed ones;
    #: drift: ngram 30% faster in every repeat, what a new engine start alone can do on a lent GPU
    MODES = {"changed": [10.0], "noisy": [0.6, 1.4, 0.8, 1.2, 1.0, 0.7, 1.3], "same": [1.0], "drift": [1.3]}

    def __init__(self, mode: str = "same", wall_s: float = 0.1,
                 on_measure: Callable[[Any], None] | None = None) -> None:
        self.factors, self.wall_s, self.on_measure = self.MODES[mode], wall_s, on_measure
        self.seen: list[tuple[str, tuple[str, float, int]]] = []

    def _measure(self, suite: Any, ledger: Any, key: tuple[str, float, int]) -> procedure.PointMeasurement:
        if (ledger.id, key) in suite._cache:  # one measurement per point, for all of its arms
            return suite._cache[(ledger.id, key)]
        if self.on_measure is not None:
            self.on_measure(suite)
        self.seen.append((ledger.id, key))
        point = copy.deepcopy(ledger.find_point(*key))
        tps = point["arms"]["ngram"]["output_tokens_per_s"]
        tps["repeats"] = [v * self.factors[i % len(self.factors)] for i, v in enumerate(tps["repeats"])]
        timings = {name: [{"window_s": 5.0, "output_tokens": int(v * 5), "output_tokens_per_s": v}
                          for v in res["output_tokens_per_s"]["repeats"]] for name, res in point["arms"].items()}
        suite._cache[(ledger.id, key)] = procedure.PointMeasurement(key, point, timings, self.wall_s)
        return suite._cache[(ledger.id, key)]

    def pytest_configure(self, config: pytest.Config) -> None:
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(session.SuiteSession, "measure",
                            lambda suite, ledger, key: self._measure(suite, ledger, key))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._patch.undo()


def run_ledgers(inner_pytest: pytest.Pytester, *args: str, plugins: Sequence[object] = ()) -> pytest.RunResult:
    """`pytest tests/engine/test_ledgers.py ARGS` in this process; the measurement is restored afterwards."""
    measure = session.SuiteSession.measure
    result = inner_pytest.runpytest_inprocess(TEST_LEDGERS, *INNER, *args, plugins=list(plugins))
    assert session.SuiteSession.measure is measure, "the fake measurement leaked out of the inner run"
    return result


@pytest.mark.filterwarnings("ignore:Not saving anything, no benchmarks have been run")
def test_skipped_points_leave_pytest_benchmark_json_intact(inner_pytest: pytest.Pytester, tmp_path: Path) -> None:
    """Verify mode skips unrecorded points; pytest-benchmark must still write its JSON report.

    A skip raised inside `benchmark.pedantic` left a benchmark without data, and
    pytest-benchmark then crashed writing the JSON (seen on the H200 in a resume run).
    """
    planned = replan_data(json.loads((ROOT / "ledgers" / "cpu-smollm2-policy.json").read_text()))
    assert planned["provenance"]["accelerator"]["kind"] == "cpu"  # a CPU ledger: selected by -m "not gpu"
    ledger = tmp_path / "planned.json"
    ledger.write_text(json.dumps(planned))
    report = tmp_path / "bench.json"
    result = run_ledgers(inner_pytest, "-q", "--ledger", str(ledger), "--benchmark-json", str(report))
    assert result.ret == 0, result.stdout.str()[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) > 0 and "passed" not in outcomes and "failed" not in outcomes, outcomes
    assert "Traceback" not in result.stdout.str()
    if report.exists():  # pytest-benchmark writes no file when nothing was benchmarked
        assert json.loads(report.read_text())["benchmarks"] == []


def _fake_run(inner_pytest: pytest.Pytester, tmp_path: Path, mode: str, *extra: str
              ) -> tuple[pytest.RunResult, Path]:
    """The CPU ledger's copy:0:1 (baseline and ngram) with the fake measurement in `mode`, and its benchmark JSON."""
    report = tmp_path / f"bench-{mode}-{len(list(tmp_path.glob('bench-*')))}.json"
    result = run_ledgers(inner_pytest, "-q", "--ledger", str(CPU_LEDGER), "--ledger-points", "copy:0:1",
                         "--benchmark-json", str(report), *extra, plugins=[FakeMeasure(mode)])
    return result, report


def test_a_changed_point_fails_and_every_arm_keeps_its_benchmark_row(inner_pytest: pytest.Pytester,
                                                                     tmp_path: Path) -> None:
    """ngram 10x faster: its test fails as changed (up) with both CIs; pytest-benchmark still writes JSON,
    one row per arm, timed in seconds per output token per window (so OPS is tokens/s).

    Only the plugin glue is under test here, so the engine measurement is replaced by a fake.
    """
    result, report = _fake_run(inner_pytest, tmp_path, "changed")
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    result.assert_outcomes(passed=1, failed=1)
    assert "changed (up)" in out and "95% CI" in out and "Traceback" not in out
    assert "specledger verdicts" in out and "1 changed, 1 holds" in out, out[-3000:]
    rows = {b["extra_info"]["arm"]: b for b in json.loads(report.read_text())["benchmarks"]}
    assert sorted(rows) == ["baseline", "ngram"]
    ngram = rows["ngram"]
    assert ngram["param"] == "cpu-smollm2-ngram-copy:0:1"  # the point grammar's test id
    assert ngram["extra_info"]["unit"].startswith("seconds per output token") and "multiplier" in ngram["extra_info"]
    repeats = json.loads(CPU_LEDGER.read_text())["points"][0]["arms"]["ngram"]
    assert ngram["stats"]["rounds"] == len(repeats["output_tokens_per_s"]["repeats"])
    fresh_mean = sum(v * 10 for v in repeats["output_tokens_per_s"]["repeats"]) / ngram["stats"]["rounds"]
    assert 0.8 * fresh_mean < ngram["stats"]["ops"] <= 1.01 * fresh_mean  # harmonic mean of tok/s


def test_a_borrowed_between_start_spread_judges_a_one_start_ledger_over_engine_starts(inner_pytest: pytest.Pytester,
                                                                                      tmp_path: Path) -> None:
    """--ledger-start-spread-from: ngram 30% faster fails as changed between one start's windows on each side; with
    the spread a ledger of this machine kind pools (log SD 0.11, 7 df), the same run is inconclusive, says whose
    spread it used, and passes; a ledger of another accelerator lends nothing. A recording refuses the option: the
    spread would be written into the ledger."""
    source = json.loads(CPU_LEDGER.read_text())
    source["id"] = "cpu-smollm2-starts"
    spread = {"log_sd": 0.11, "df": 7, "points": 3}
    source["start_spread"] = {"ngram": {"multiplier": dict(spread), "output_tokens_per_s": dict(spread)},
                              "baseline": {"output_tokens_per_s": dict(spread)}}
    source_path = tmp_path / "cpu-smollm2-starts.json"
    source_path.write_text(json.dumps(source))
    windows, _ = _fake_run(inner_pytest, tmp_path, "drift")
    assert windows.ret == 1 and "changed (up)" in windows.stdout.str(), windows.stdout.str()[-3000:]
    borrowed, _ = _fake_run(inner_pytest, tmp_path, "drift", "--ledger-start-spread-from", str(source_path))
    out = borrowed.stdout.str()
    assert borrowed.ret == 0, out[-3000:]
    assert "changed" not in out.split("specledger verdicts")[-1] and "inconclusive" in out, out[-3000:]
    assert "between-start spread of cpu-smollm2-starts" in out and json.loads(CPU_LEDGER.read_text()).get(
        "start_spread") is None  # borrowed in memory only
    source["provenance"]["machine"]["accelerator"] = "NVIDIA H200"  # another kind of machine: not borrowed
    other_kind = tmp_path / "h200-starts.json"
    other_kind.write_text(json.dumps(source))
    unborrowed, _ = _fake_run(inner_pytest, tmp_path, "drift", "--ledger-start-spread-from", str(other_kind))
    assert unborrowed.ret == 1 and "between-start spread of" not in unborrowed.stdout.str()
    recording = run_ledgers(inner_pytest, "-q", "--ledger", str(CPU_LEDGER), "--ledger-record", "--ledger-out",
                            str(tmp_path / "out"), "--ledger-start-spread-from", str(source_path))
    assert recording.ret == pytest.ExitCode.USAGE_ERROR
    assert "--ledger-start-spread-from verifies only" in recording.stderr.str()


def test_an_inconclusive_point_is_its_own_outcome_and_fails_only_when_strict(inner_pytest: pytest.Pytester,
                                                                            tmp_path: Path) -> None:
    result, _ = _fake_run(inner_pytest, tmp_path, "noisy")
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    assert result.parseoutcomes().get("inconclusive") == 1 and "repeats needed" in out, out[-3000:]
    strict, _ = _fake_run(inner_pytest, tmp_path, "noisy", "--ledger-strict")
    assert strict.ret == 1 and "inconclusive" in strict.stdout.str(), strict.stdout.str()[-3000:]


def test_points_run_in_the_selections_order_and_stop_at_the_time_budget(inner_pytest: pytest.Pytester,
                                                                       tmp_path: Path) -> None:
    """A time-boxed GPU slot: `--ledger-points` is the run order, and once the next point (as slow as the
    slowest so far, here a fake 100 s) would end past `--ledger-budget-s`, the rest are skipped."""
    fake = FakeMeasure("same", wall_s=100.0)
    result = run_ledgers(inner_pytest, "-rs", "--ledger", str(CPU_LEDGER), "--ledger-points", "free-form:0:2,copy:0:1",
                         "--ledger-budget-s", "50", "-p", "no:benchmark", plugins=[fake])
    out = result.stdout.str()
    assert result.ret == 0, out[-3000:]
    assert fake.seen == [("cpu-smollm2", ("free-form", 0.0, 2))], "a point past the budget was measured"
    reports = result.reprec.getreports("pytest_runtest_logreport")  # type: ignore[attr-defined]
    calls = [(r.nodeid.split("[", 1)[1][:-1], r.outcome) for r in reports
             if r.when == "call" or (r.when == "setup" and r.skipped)]
    assert calls[:2] == [("cpu-smollm2-baseline-free-form:0:2", "passed"),
                         ("cpu-smollm2-ngram-free-form:0:2", "passed")], calls
    assert calls[2:] and all(outcome == "skipped" and "copy:0:1" in tid for tid, outcome in calls[2:]), calls
    # a verification left out by the budget is measured by naming the point, not by a recording of missing points
    assert "time budget" in out and "(measure it with --ledger-points copy:0:1)" in out
    assert "--ledger-only-missing" not in out


def test_the_cuda_skip_touches_only_ledger_points(inner_pytest: pytest.Pytester) -> None:
    """Installed through its entry point, the plugin is active in every project: another project's own
    `gpu` test must run (and here fail on purpose) rather than be skipped for want of CUDA."""
    inner_pytest.makepyfile(
        test_other="import pytest\n\n@pytest.mark.gpu\ndef test_theirs():\n    assert False, 'ran'\n")
    inner_pytest.makeini("[pytest]\nmarkers =\n    gpu: theirs\n")
    result = inner_pytest.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: ran*"])


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    """Once installed, the plugin loads in every pytest session of every project (the `pytest11` entry point):
    it must not pull jsonschema, pandas, matplotlib, torch or vLLM in before a ledger is in play."""
    heavy = ("jsonschema", "pandas", "matplotlib", "scipy", "torch", "vllm")
    code = ("import sys, specledger.plugin; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_several_engine_starts_plan_every_selected_point_before_the_first_is_measured(
        inner_pytest: pytest.Pytester) -> None:
    """--ledger-starts 2: the session knows every selected point of the ledger, in the selection's order, when the
    first one is measured (each start measures them all); with one start it plans nothing."""
    for starts in (2, 1):
        seen: list[dict[str, Any]] = []

        def spy(suite: Any, seen: list[dict[str, Any]] = seen) -> None:
            if not seen:
                seen.append({"starts": suite.starts,
                             "planned": {lid: list(keys) for lid, keys in suite._planned.items()}})

        result = run_ledgers(inner_pytest, "-q", "--ledger", str(CPU_LEDGER), "--ledger-points",
                             "free-form:0:2,copy:0:1", "--ledger-starts", str(starts), "-p", "no:benchmark",
                             plugins=[FakeMeasure("same", on_measure=spy)])
        assert result.ret == 0, result.stdout.str()[-3000:]
        assert seen[0]["starts"] == starts
        expected = {"cpu-smollm2": [("free-form", 0.0, 2), ("copy", 0.0, 1)]} if starts == 2 else {}
        assert seen[0]["planned"] == expected


def test_a_point_that_took_longer_in_an_earlier_run_is_not_begun_past_the_time_budget(
        inner_pytest: pytest.Pytester, tmp_path: Path) -> None:
    """The budget expects a point to take as long as it took in the ledger's earlier runs when that is longer than
    the slowest point so far (`provenance.runs[].time_s.point_wall_s`): a visit's job was killed by its timeout
    in a point that had taken 412 s before, after points of at most 211 s."""
    data = json.loads(CPU_LEDGER.read_text())
    labels = sorted(f"{p['workload']}:{p['temperature']:g}:{p['concurrency']}" for p in data["points"])
    data["provenance"]["runs"] = [{"started": "2026-12-01T00:00:00+00:00", "points": labels,
                                   "time_s": {"point_wall_s": {"copy:0:1": 100.0}, "per_point": 1.0}}]
    ledger = tmp_path / "cpu-smollm2.json"
    ledger.write_text(json.dumps(data))
    # (points measured, arm-points passed, skipped) for each budget; assert_outcomes leaves warnings out of it, since
    # an inner run under tox warns that specledger was imported before it could be rewritten (CI rehearsal 2026-12-05)
    expected = {"50": ([("free-form", 0.0, 2)], 2, 2), "500": ([("free-form", 0.0, 2), ("copy", 0.0, 1)], 4, 0)}
    for budget, (measured, passed, skipped) in expected.items():
        fake = FakeMeasure("same", wall_s=0.1)
        result = run_ledgers(inner_pytest, "-rs", "--ledger", str(ledger), "--ledger-points", "free-form:0:2,copy:0:1",
                             "--ledger-budget-s", budget, "-p", "no:benchmark", plugins=[fake])
        assert result.ret == 0, result.stdout.str()[-3000:]
        assert [key for _, key in fake.seen] == measured, budget
        result.assert_outcomes(passed=passed, skipped=skipped)
        if budget == "50":
            result.stdout.fnmatch_lines(
                ["*time budget: 0 s spent, copy:0:1 took 100 s in an earlier run of cpu-smollm2, the budget is 50 s "
                 "(measure it with --ledger-points copy:0:1)*"])


def test_a_point_is_expected_to_take_its_longest_earlier_run_or_that_runs_mean_point():
    from specledger.measure.recording import recorded_point_seconds

    runs = [{"started": "a", "points": ["copy:0:1", "copy:0:2"], "time_s": {"per_point": 40.0}},
            {"started": "b", "points": ["copy:0:1"], "time_s": {"point_wall_s": {"copy:0:1": 90.0}, "per_point": 90.0}},
            {"started": "c", "points": ["copy:0:8"], "time_s": {"point_wall_s": {"copy:0:8": 500.0}}}]
    assert recorded_point_seconds({"runs": runs}, "copy:0:1") == 90.0  # the longer of its two runs
    assert recorded_point_seconds({"runs": runs}, "copy:0:2") == 40.0  # a run from before point times were kept
    assert recorded_point_seconds({"runs": runs}, "copy:0:64") is None
    assert recorded_point_seconds({"runs": [{"started": "a", "points": None, "time_s": {"per_point": 7.0}}]},
                                  "copy:0:64") == 7.0  # a run of before runs named their points holds every point
    legacy_and_named = [{"started": "a", "points": None, "time_s": {"per_point": 300.0}}, *runs]
    assert recorded_point_seconds({"runs": legacy_and_named}, "copy:0:1") == 90.0  # a later run took it over
    assert recorded_point_seconds({"runs": legacy_and_named}, "copy:0:64") == 300.0  # the legacy run still holds it
    assert recorded_point_seconds(None, "copy:0:1") is None
