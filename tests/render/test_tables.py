"""Tables over ledgers: one row per figure, missing figures missing (NaN/None), never invented."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from repo_paths import ROOT
from repo_paths import SMALL as SMALL_PATH

from specledger.ledger import load_ledger, parse_ledger
from specledger.render.tables import (
    CRITICAL_COLUMNS,
    POINTS_COLUMNS,
    STARTS_COLUMNS,
    critical_table,
    format_table,
    points_table,
    starts_table,
)

SMALL = load_ledger(SMALL_PATH)
REFERENCE = [load_ledger(p) for p in sorted((ROOT / "ledgers").glob("reference-*.json"))]


def test_points_table_columns_and_values():
    df = points_table([SMALL])
    assert list(df.columns) == POINTS_COLUMNS
    assert POINTS_COLUMNS[:14] == [
        "ledger",
        "target",
        "arm",
        "baseline_arm",
        "workload",
        "temperature",
        "concurrency",
        "baseline_tokens_per_s",
        "spec_tokens_per_s",
        "multiplier",
        "multiplier_vs_matched",
        "acceptance_length",
        "acceptance_rate",
        "spread",
    ]
    assert len(df) == 3
    first = df.iloc[0]
    assert (first["ledger"], first["target"], first["arm"], first["baseline_arm"]) == (
        "test-small",
        "tiny",
        "eagle",
        "baseline",
    )
    assert (first["temperature"], first["concurrency"]) == (0.0, 1)
    assert (first["baseline_tokens_per_s"], first["spec_tokens_per_s"], first["multiplier"]) == (
        100.0,
        180.0,
        1.8,
    )
    assert first["multiplier_vs_matched"] == 1.895
    assert (first["acceptance_length"], first["acceptance_rate"]) == (2.5, 0.375)
    assert first["spread"] == pytest.approx((183.0 - 178.0) / 180.0)
    assert list(df["concurrency"]) == [1, 4, 16]


def test_points_table_missing_values():
    df = points_table(REFERENCE)
    nvfp4 = df[df["ledger"] == "reference-b200-nvfp4-gptq"]
    assert list(nvfp4["multiplier"]) == [1.34, 1.22, 1.05, 0.26]
    assert math.isnan(nvfp4.iloc[0]["baseline_tokens_per_s"]) and math.isnan(nvfp4.iloc[0]["spread"])
    assert nvfp4.iloc[3]["baseline_tokens_per_s"] == 2306
    assert nvfp4["temperature"].isna().all()
    bf16 = df[df["ledger"] == "reference-b200-bf16"].iloc[0]
    assert bf16["concurrency"] is pd.NA
    lookup = df[df["ledger"] == "reference-b200-lookup-math"]
    assert list(lookup["multiplier_range"]) == [(1.3, 4.2), (0.3, 1.0)]
    assert lookup["multiplier"].isna().all()


def test_points_table_empty():
    df = points_table([])
    assert list(df.columns) == POINTS_COLUMNS and df.empty
    assert format_table(df) == "(no rows)"


def test_critical_table():
    df = critical_table([SMALL, *REFERENCE])
    assert list(df.columns) == CRITICAL_COLUMNS
    small = df[df["ledger"] == "test-small"].iloc[0]
    assert (small["kind"], small["between"], small["concurrencies"]) == ("crosses", (4, 16), (1, 4, 16))
    assert small["value"] == pytest.approx(9.18958683997628)
    assert small["critical_concurrency"] == "9.19 (between 4 and 16)"
    by_ledger = {row["ledger"]: row for _, row in df.iterrows() if row["workload"] == "free-form"}
    assert by_ledger["reference-b200-nvfp4-gptq"]["critical_concurrency"] == "17.47 (between 16 and 64)"
    assert by_ledger["reference-b200-int4"]["critical_concurrency"] == "4.76 (between 4 and 8)"
    assert by_ledger["reference-b200-fp8kv"]["kind"] == "stays-above"
    assert math.isnan(by_ledger["reference-b200-fp8kv"]["value"])
    assert "reference-b200-bf16" not in set(df["ledger"])  # concurrency not published: no curve


def test_format_table():
    text = format_table(points_table(REFERENCE))
    header = text.splitlines()[0]
    assert "multiplier" in header and "concurrency" in header
    assert "None" not in text and "nan" not in text.lower()
    critical = format_table(critical_table(REFERENCE))
    assert "critical_concurrency" in critical.splitlines()[0]
    assert "does not cross 1.0 within c=1..8" in critical


def test_points_table_carries_the_recorded_cis():
    data = json.loads(SMALL_PATH.read_text())
    data["points"][0]["arms"]["eagle"].update(multiplier_ci95=[1.61, 2.02], multiplier_vs_matched_ci95=[1.7, 2.1])
    df = points_table([parse_ledger(json.dumps(data), "x.json")])
    assert list(df["multiplier_ci95"]) == [(1.61, 2.02), None, None]
    assert list(df["multiplier_vs_matched_ci95"]) == [(1.7, 2.1), None, None]


def test_critical_table_says_what_the_cis_establish():
    """Point estimates 1.8, 1.3, 0.8 interpolate to a crossing between 4 and 16; with c=16's CI straddling
    1.0 the intervals establish no loss, and the table must say so rather than only the crossing."""
    data = json.loads(SMALL_PATH.read_text())
    cis = [[1.6, 2.0], [1.1, 1.5], [0.7, 1.02]]
    for point, ci in zip(data["points"], cis, strict=True):
        point["arms"]["eagle"]["multiplier_ci95"] = ci
    row = critical_table([parse_ledger(json.dumps(data), "x.json")]).iloc[0]
    assert row["critical_concurrency"] == "9.19 (between 4 and 16)"
    assert row["loss_bracket_ci95"] is None and row["critical_ci95"] == "no interval wholly below 1 within c=1..16"
    data["points"][2]["arms"]["eagle"]["multiplier_ci95"] = [0.7, 0.9]
    row = critical_table([parse_ledger(json.dumps(data), "x.json")]).iloc[0]
    assert row["loss_bracket_ci95"] == (4, 16) and row["critical_ci95"] == "between c=4 and c=16"
    assert critical_table([SMALL]).iloc[0]["critical_ci95"] is None  # no CIs: nothing claimed


def test_critical_table_says_where_a_dip_recovers():
    """A curve below 1.0 at c=4 and back above at c=16 (the H200 Qwen copy curves do this at c=64) must not
    read as a loss from c=4 on: both the point-estimate column and the CI column name the recovery."""
    data = json.loads(SMALL_PATH.read_text())
    for point, median, ci in zip(data["points"], [180.0, 240.0, 960.0], [[1.6, 2.0], [0.7, 0.9], [1.1, 1.3]],
                                 strict=True):
        eagle = point["arms"]["eagle"]
        base = point["arms"]["baseline"]["output_tokens_per_s"]["median"]
        eagle["output_tokens_per_s"] = {"repeats": [median - 5, median, median + 5], "median": median,
                                        "min": median - 5, "max": median + 5}
        eagle.update(multiplier=round(median / base, 3), multiplier_ci95=ci)
    row = critical_table([parse_ledger(json.dumps(data), "x.json")]).iloc[0]
    assert row["above_again_at"] == (16,) and row["wins_after_loss_ci95"] == (16,)
    assert row["critical_concurrency"].endswith("(between 1 and 4); at or above 1.0 again at c=16")
    assert row["critical_ci95"] == "between c=1 and c=4; wholly above 1 again at c=16"


def test_starts_table_gives_each_start_its_own_figures_and_host_state():
    """Each start's row is that start's windows only: its mean, its paired ratio of means, its median host slice."""
    ledger = load_ledger(ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b.json")
    df = starts_table([ledger])
    assert list(df.columns) == STARTS_COLUMNS
    point = next(p for p in ledger.points if (p["workload"], p["concurrency"]) == ("copy", 64))
    rows = df[(df.workload == "copy") & (df.concurrency == 64)]
    assert set(rows.arm) == set(point["arms"])
    for arm in ("baseline", "ngram"):
        result, base = point["arms"][arm], point["arms"]["baseline"]
        starts = result["window"]["start"]
        for start in sorted(set(starts)):
            mine = [i for i, s in enumerate(starts) if s == start]
            row = rows[(rows.arm == arm) & (rows.start == start)].iloc[0]
            spec = sum(result["output_tokens_per_s"]["repeats"][i] for i in mine) / len(mine)
            baseline = sum(base["output_tokens_per_s"]["repeats"][i] for i in mine) / len(mine)
            assert row.windows == len(mine)
            assert row.output_tokens_per_s == pytest.approx(spec)
            host = sorted(result["window"]["host_slice_ms"][i] for i in mine)
            assert row.host_slice_ms == pytest.approx(pd.Series(host).median())
            if arm == "baseline":
                assert math.isnan(row.multiplier)
            else:
                assert row.multiplier == pytest.approx(spec / baseline)


def test_starts_table_is_empty_where_no_point_has_two_starts():
    assert starts_table([SMALL]).empty
    assert list(starts_table([SMALL]).columns) == STARTS_COLUMNS
