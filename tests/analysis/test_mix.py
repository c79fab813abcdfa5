"""Fleet mix: time-weighted multipliers per concurrency, dropped concurrencies said out loud, bad weights refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import ROOT

from specledger.analysis import theory
from specledger.analysis.mix import (
    MixError,
    check_weights,
    fleet_crossing,
    fleet_curve,
    mix_temperatures,
    parse_weights,
    render_fleet,
)
from specledger.cli import main
from specledger.ledger import Ledger, load_ledger, parse_ledger

H200_PATH = ROOT / "tests" / "data" / "h200-smollm2.json"
H200 = load_ledger(H200_PATH)
WORKLOADS_PATH = ROOT / "ledgers" / "reference-b200-workloads.json"


def synthetic(curves: dict[str, list[tuple[int, float, float]]], temperature: float = 0.0) -> Ledger:
    """A validated ledger: per workload, (concurrency, multiplier, baseline tokens/s) points."""
    points = [
        {
            "workload": workload,
            "temperature": temperature,
            "concurrency": c,
            "arms": {
                "baseline": {"output_tokens_per_s": {"median": base, "repeats": [base]}},
                "spec": {"output_tokens_per_s": {"median": m * base, "repeats": [m * base]}, "multiplier": m},
            },
        }
        for workload, curve in curves.items()
        for c, m, base in curve
    ]
    data = {
        "schema_version": 1,
        "id": "synthetic-mix",
        "title": "synthetic",
        "status": "measured",
        "provenance": {
            "engine": {"name": "vllm", "version": "0.26.0"},
            "accelerator": {"kind": "cpu"},
            "date": "2025-01-01",
        },
        "target": {"name": "tiny", "model": "embedded:smollm2"},
        "arms": [
            {"name": "baseline", "role": "baseline"},
            {"name": "spec", "role": "speculative", "speculative_config": {"method": "ngram"}},
        ],
        "workloads": [{"name": w, "kind": "other"} for w in curves],
        "points": points,
    }
    return parse_ledger(json.dumps(data), "synthetic-mix.json")


def test_parse_weights():
    assert parse_weights("free-form=0.935,copy=0.065") == {"free-form": 0.935, "copy": 0.065}
    assert parse_weights(" a = 0.5 , b=0.5 ") == {"a": 0.5, "b": 0.5}


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "malformed weights"),
        ("a=0.5,", "malformed weights"),
        ("a:0.5", "malformed weight 'a:0.5'"),
        ("=0.5", "malformed weight"),
        ("a=0.5=1", "malformed weight"),
        ("a=half", "'half' is not a number"),
        ("a=nan", "finite number >= 0"),
        ("a=-0.5,b=1.5", "finite number >= 0"),
        ("a=0.5,a=0.5", "weighted twice"),
    ],
)
def test_parse_weights_rejects(text, message):
    with pytest.raises(MixError, match=message):
        parse_weights(text)


def test_check_weights():
    check_weights(H200, {"free-form": 0.935, "copy": 0.065})
    check_weights(H200, {"free-form": 1 - 1e-7})  # within 1e-6
    with pytest.raises(MixError, match=r"weights sum to 0\.965, not 1"):
        check_weights(H200, {"free-form": 0.9, "copy": 0.065})
    with pytest.raises(MixError, match=r"unknown workload\(s\) math \(ledger has: copy, free-form\)"):
        check_weights(H200, {"free-form": 0.9, "math": 0.1})


def test_worked_example_h200_ngram_t0():
    curve = fleet_curve(H200, {"free-form": 0.935, "copy": 0.065}, "ngram", 0.0)
    assert curve["concurrency"].tolist() == [1, 2, 4, 8, 16, 64]
    assert set(curve["weighting"]) == {"time"}
    assert curve.attrs["dropped"] == {}
    row = curve[curve["concurrency"] == 4].iloc[0]
    # c=4: copy 911.5/786.5 stated 1.159, free-form 413.4/1437.7 stated 0.288 (tests/data/h200-smollm2.json)
    assert (row["multiplier:copy"], row["baseline_tokens_per_s:copy"]) == (1.159, 786.5)
    assert (row["multiplier:free-form"], row["baseline_tokens_per_s:free-form"]) == (0.288, 1437.7)
    by_hand = (0.935 / 1437.7 + 0.065 / 786.5) / (0.935 / (0.288 * 1437.7) + 0.065 / (1.159 * 786.5))
    assert row["fleet_multiplier"] == pytest.approx(by_hand, rel=1e-12)
    assert row["fleet_multiplier"] == theory.mix_multiplier(
        {"free-form": 0.935, "copy": 0.065}, {"free-form": 0.288, "copy": 1.159}, {"free-form": 1437.7, "copy": 786.5}
    )
    # time weighting is not the average of ratios, which would claim far more
    assert row["fleet_multiplier"] < 0.935 * 0.288 + 0.065 * 1.159
    crossing = fleet_crossing(curve)
    assert crossing is not None and crossing.kind == "starts-below"


def test_equal_weights_on_a_workload_pair():
    ledger = synthetic({"a": [(1, 2.0, 100.0), (4, 1.5, 100.0)], "b": [(1, 0.5, 300.0), (4, 0.5, 100.0)]})
    curve = fleet_curve(ledger, {"a": 0.5, "b": 0.5}, "spec", 0.0)
    # c=1: base time 0.5/100 + 0.5/300, spec time 0.5/200 + 0.5/150 -> 8/7
    assert curve["fleet_multiplier"].tolist()[0] == pytest.approx(8 / 7, rel=1e-12)
    # c=4, equal baselines: the share-weighted harmonic mean 1 / (0.5/1.5 + 0.5/0.5) = 0.75
    assert curve["fleet_multiplier"].tolist()[1] == pytest.approx(0.75, rel=1e-12)
    crossing = fleet_crossing(curve)
    assert crossing.kind == "crosses" and crossing.between == (1, 4)
    assert crossing.value == theory.critical_concurrency([1, 4], curve["fleet_multiplier"].tolist()).value


def test_only_concurrencies_measured_for_every_weighted_workload():
    curve = fleet_curve(H200, {"free-form": 0.935, "copy": 0.065}, "ngram", 1.0)
    assert curve["concurrency"].tolist() == [1, 2, 4, 8]
    assert curve.attrs["dropped"] == {16: ["free-form"], 64: ["free-form"]}
    assert "dropped: c=16 (free-form not measured); c=64 (free-form not measured)" in render_fleet(curve)
    # a zero weight takes no part, so copy alone keeps every concurrency
    alone = fleet_curve(H200, {"free-form": 0.0, "copy": 1.0}, "ngram", 1.0)
    assert alone["concurrency"].tolist() == [1, 2, 4, 8, 16, 64]
    assert alone["fleet_multiplier"].tolist() == pytest.approx([0.36, 0.264, 0.309, 0.311, 0.389, 0.358])


def test_reference_without_baselines_is_flagged_equal_baseline():
    ledger = load_ledger(WORKLOADS_PATH)
    curve = fleet_curve(ledger, {"free-form": 0.935, "copy": 0.065}, "dflash2", None)
    assert curve["concurrency"].tolist() == [8]
    assert curve["weighting"].tolist() == ["equal-baseline"]
    assert curve["fleet_multiplier"].iloc[0] == pytest.approx(1 / (0.935 / 0.8 + 0.065 / 1.1))
    assert mix_temperatures(ledger, "dflash2") == [None]


def test_arm_must_be_speculative():
    with pytest.raises(MixError, match="has role 'baseline'"):
        fleet_curve(H200, {"copy": 1.0}, "baseline", 0.0)


def test_cli_mix(capsys):
    assert main(["mix", str(H200_PATH), "--weights", "free-form=0.935,copy=0.065", "--arm", "ngram"]) == 0
    out = capsys.readouterr().out
    assert "h200-smollm2 ngram T=0: mix free-form=0.935, copy=0.065" in out
    assert "fleet critical concurrency: below 1.0 from c=1 (no crossing within c=1..64)" in out
    assert "dropped: c=16 (free-form not measured)" in out
    assert "draft-self" not in out
    assert main(["mix", str(WORKLOADS_PATH)]) == 0  # weights default to the ledger's workload_mix
    assert "equal-baseline" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--weights", "free-form=0.9,copy=0.065"], "weights sum to 0.965, not 1"),
        (["--weights", "free-form=0.9,math=0.1"], "unknown workload(s) math"),
        (["--weights", "free-form:0.9"], "malformed weight"),
        (["--weights", "copy=1", "--arm", "nope"], "no speculative arm 'nope'"),
        (["--weights", "copy=1", "--temperature", "0.5"], "no multiplier at T=0.5 (measured: 0, 1)"),
        ([], "--weights is needed"),
    ],
)
def test_cli_mix_usage_errors_exit_2(argv, message, capsys):
    assert main(["mix", str(H200_PATH), *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_mix_planned_ledger_exits_1(tmp_path, capsys):
    data = json.loads(H200_PATH.read_text())
    data.update(status="planned", points=[])
    path = tmp_path / "planned.json"
    path.write_text(json.dumps(data))
    assert main(["mix", str(path), "--weights", "copy=1"]) == 1
    assert "no measured points (status planned)" in capsys.readouterr().err


multipliers = st.floats(min_value=0.05, max_value=5.0, allow_nan=False)
baselines = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(
    data=st.lists(
        st.tuples(
            st.floats(min_value=0.01, max_value=1.0),
            st.lists(st.tuples(multipliers, baselines), min_size=3, max_size=3),
        ),
        min_size=2,
        max_size=3,
    )
)
def test_fleet_multiplier_lies_between_the_workloads(data):
    total = sum(weight for weight, _ in data)
    weights = {f"w{i}": weight / total for i, (weight, _) in enumerate(data)}
    curves = {
        f"w{i}": [(c, m, b) for c, (m, b) in zip((1, 4, 16), points, strict=True)] for i, (_, points) in enumerate(data)
    }
    curve = fleet_curve(synthetic(curves), weights, "spec", 0.0)
    assert curve["concurrency"].tolist() == [1, 4, 16]
    for _, row in curve.iterrows():
        per_workload = [row[f"multiplier:{name}"] for name in weights]
        assert min(per_workload) * (1 - 1e-12) <= row["fleet_multiplier"] <= max(per_workload) * (1 + 1e-12)
