"""specledger.measure.visit_time and `specledger estimate`: a run's expected seconds from the ledger's earlier runs."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from repo_paths import SMALL

from specledger.cli import main
from specledger.ledger import Ledger
from specledger.ledger.selection import parse_point_selection
from specledger.measure.visit_time import estimate_run


def _runs_ledger(runs: list[dict[str, Any]], concurrencies: tuple[int, ...] = (1, 4, 8, 16)) -> dict[str, Any]:
    """The small measured ledger (copy c=1, 4, 16) with c=8 planned but not recorded, and these runs kept."""
    data = copy.deepcopy(json.loads(SMALL.read_text()))
    data["sweep"]["concurrencies"] = list(concurrencies)
    data["provenance"]["runs"] = runs
    return data


def _run(points: dict[str, float], model_build: float, engine_starts: float) -> dict[str, Any]:
    return {"started": "2026-12-06T20:00:00+00:00", "date": "2026-12-06T20:10:00+00:00", "points": list(points),
            "time_s": {"model_build": model_build, "engine_starts": engine_starts, "point_wall_s": points}}


RUNS = [_run({"copy:0:1": 70.0, "copy:0:4": 120.0}, model_build=34.0, engine_starts=118.0),
        # the same visit's second run: the model was built already, the engines started faster
        _run({"copy:0:16": 90.0, "copy:0:1": 80.0}, model_build=0.0, engine_starts=81.0)]


def test_recorded_points_take_their_slowest_time_and_the_slowest_start() -> None:
    run = estimate_run(Ledger(None, _runs_ledger(RUNS)), parse_point_selection("copy:0:1,copy:0:16"))
    assert [(p.label, p.seconds, p.source) for p in run.points] == [("copy:0:1", 80.0, "recorded"),
                                                                    ("copy:0:16", 90.0, "recorded")]
    assert (run.model_build_s, run.engine_starts_s) == (34.0, 118.0)  # the 0 of the second run is not a build time
    assert run.total_s == pytest.approx(34.0 + 118.0 + 80.0 + 90.0)
    # every point as slow as the slowest (copy:0:4, 120 s): it may need as many repeats this time
    assert run.up_to_s == pytest.approx(34.0 + 118.0 + 120.0 + 120.0)


def test_only_missing_and_verify_split_the_grid() -> None:
    ledger = Ledger(None, _runs_ledger(RUNS))
    missing = estimate_run(ledger, only_missing=True)
    assert [(p.label, p.seconds, p.source) for p in missing.points] == [("copy:0:8", 120.0,
                                                                         "the ledger's slowest point")]
    assert [p.label for p in estimate_run(ledger, verify=True).points] == ["copy:0:1", "copy:0:4", "copy:0:16"]
    with pytest.raises(ValueError):
        estimate_run(ledger, only_missing=True, verify=True)


def test_a_ledger_without_kept_times_is_unknown_and_nothing_to_measure_is_zero() -> None:
    unknown = estimate_run(Ledger(None, _runs_ledger([])))
    assert unknown.total_s is None and all(p.seconds is None for p in unknown.points)
    nothing = estimate_run(Ledger(None, _runs_ledger(RUNS, concurrencies=(1, 4, 16))), only_missing=True)
    assert nothing.points == () and nothing.total_s == 0.0


def test_a_planned_ledger_borrows_times_scaled_by_its_arms() -> None:
    """A ledger never run (a policy ledger replanned from a measured one) takes the source's times: the model build
    as it is, the engine starts and each point's time scaled by the arm counts (here 2 arms of the source's 4), the
    source's slowest point where it never measured this one. The ledger's own times, where it has any, come first."""
    planned = _runs_ledger([])
    source = _runs_ledger(RUNS)
    extra = 4 - len(source["arms"])
    source["arms"] = source["arms"] + [dict(source["arms"][-1], name=f"extra-{i}") for i in range(extra)]
    planned["arms"] = planned["arms"][:2]
    run = estimate_run(Ledger(None, planned), parse_point_selection("copy:0:1,copy:0:8"),
                       times_from=Ledger(None, source))
    assert (run.model_build_s, run.engine_starts_s) == (34.0, pytest.approx(118.0 / 2))
    assert [(p.label, p.seconds, p.up_to_s) for p in run.points] == [("copy:0:1", 40.0, 60.0),
                                                                    ("copy:0:8", 60.0, 60.0)]
    assert run.points[0].source == "test-small's copy:0:1 x 2/4 arms"
    assert run.points[1].source == "test-small's slowest point x 2/4 arms"
    assert run.total_s == pytest.approx(34.0 + 59.0 + 40.0 + 60.0)
    own = estimate_run(Ledger(None, _runs_ledger(RUNS)), parse_point_selection("copy:0:1"),
                       times_from=Ledger(None, planned))  # a source without times changes nothing
    assert [(p.seconds, p.source) for p in own.points] == [(80.0, "recorded")] and own.engine_starts_s == 118.0
    still_unknown = estimate_run(Ledger(None, planned), times_from=Ledger(None, _runs_ledger([])))
    assert still_unknown.total_s is None


def test_cli_prints_each_point_and_the_sum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.json"
    path.write_text(json.dumps(_runs_ledger(RUNS)))
    assert main(["estimate", str(path), "--only-missing"]) == 0
    out = capsys.readouterr().out
    assert "test-small: 272 s (1 point(s); engine starts 118 s; model build 34 s)" in out
    assert "copy:0:8: 120 s (the ledger's slowest point)" in out
    assert main(["estimate", str(path), "--points", "copy:x:1"]) == 2
    assert "--ledger-points 'copy:x:1'" in capsys.readouterr().err
    planned = tmp_path / "planned.json"
    planned.write_text(json.dumps(_runs_ledger([])))
    assert main(["estimate", str(planned), "--points", "copy:0:4", "--times-from", str(path)]) == 0
    assert "copy:0:4: 120 s (test-small's copy:0:4 x 3/3 arms)" in capsys.readouterr().out
    assert main(["estimate", str(planned), "--times-from", str(tmp_path / "missing.json")]) != 0


def test_a_budget_plan_follows_the_sessions_rule_point_by_point() -> None:
    """The session starts a point only if it would end within the budget, taking the longer of the slowest point so
    far and its own earlier time; one left out does not stop a later, shorter one. Model 34 s + engines 118 s."""
    run = estimate_run(Ledger(None, _runs_ledger(RUNS)), parse_point_selection("copy:0:1,copy:0:4,copy:0:16"))
    wide = run.within_budget(400)
    assert wide is not None and (wide.measured, wide.left_out) == (("copy:0:1", "copy:0:4"), ("copy:0:16",))
    assert wide.ends_s == pytest.approx(152 + 80 + 120)  # c=16 would need max(120, 90) s more: 472 > 400
    tight = run.within_budget(330)  # c=4 (120 s) would end at 352; c=16 (90 s) still ends at 322
    assert tight is not None and (tight.measured, tight.left_out) == (("copy:0:1", "copy:0:16"), ("copy:0:4",))
    slow = run.within_budget(330, slowest=True)  # every point 120 s: only c=1 fits
    assert slow is not None and (slow.measured, slow.ends_s) == (("copy:0:1",), pytest.approx(152 + 120))
    assert run.within_budget(100) == type(wide)((), ("copy:0:1", "copy:0:4", "copy:0:16"), 152.0)
    assert estimate_run(Ledger(None, _runs_ledger([]))).within_budget(1000) is None  # times unknown


def test_cli_says_what_a_budget_leaves_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.json"
    path.write_text(json.dumps(_runs_ledger(RUNS)))
    assert main(["estimate", str(path), "--points", "copy:0:1,copy:0:4,copy:0:16", "--budget-s", "330"]) == 0
    out = capsys.readouterr().out
    assert ("--ledger-budget-s 330 at these times: measures copy:0:1, copy:0:16 (ends about 322 s); leaves out "
            "copy:0:4") in out
    assert "--ledger-budget-s 330 if every point is as slow as the slowest: measures copy:0:1 (ends about 272 s)" in out
