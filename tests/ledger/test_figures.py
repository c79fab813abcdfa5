"""specledger.ledger.figures: the one home of a stored point's multiplier, its bar, and the spread of the repeats."""

from __future__ import annotations

import copy
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import ROOT

from specledger.ledger import figures, load_ledger

V3 = load_ledger(ROOT / "ledgers" / "h200-smollm2-copy.json")
BURST = load_ledger(ROOT / "tests" / "data" / "h200-smollm2-copy-burst.json")


def _point(ledger, temperature: float, concurrency: int) -> dict:
    return copy.deepcopy(ledger.find_point("copy", temperature, concurrency))


def test_a_stored_multiplier_is_the_figure_and_without_it_the_centres_divide():
    point = _point(V3, 1.0, 1)
    stored = point["arms"]["ngram"]["multiplier"]
    assert figures.multiplier(V3, point, "ngram") == stored
    del point["arms"]["ngram"]["multiplier"]
    spec, base = (statistics.fmean(point["arms"][a]["output_tokens_per_s"]["repeats"]) for a in ("ngram", "baseline"))
    assert figures.multiplier(V3, point, "ngram") == pytest.approx(spec / base)
    assert round(spec / base, 3) == stored  # the stored figure is that ratio, rounded


def test_against_the_matched_baseline_reads_multiplier_vs_matched_and_divides_by_the_matched_arm():
    point = _point(V3, 0.0, 64)
    assert figures.multiplier(V3, point, "ngram", "matched") == point["arms"]["ngram"]["multiplier_vs_matched"]
    del point["arms"]["ngram"]["multiplier_vs_matched"]
    spec, matched = (statistics.fmean(point["arms"][a]["output_tokens_per_s"]["repeats"])
                     for a in ("ngram", "matched-baseline"))
    assert figures.multiplier(V3, point, "ngram", "matched") == pytest.approx(spec / matched)


def test_v3_centres_are_means_and_older_centres_medians():
    v3 = figures.multiplier_centres(_point(V3, 0.0, 1), "ngram", "baseline")
    old = figures.multiplier_centres(_point(BURST, 0.0, 1), "ngram", "baseline")
    assert v3.statistic == "mean" and old.statistic == "median"
    assert old.spec == BURST.find_point("copy", 0.0, 1)["arms"]["ngram"]["output_tokens_per_s"]["median"]


def test_no_ratio_without_a_positive_baseline_or_a_baseline_arm():
    point = _point(BURST, 0.0, 1)
    point["arms"]["baseline"]["output_tokens_per_s"]["median"] = 0.0
    assert figures.multiplier_interval(point, "ngram", "baseline", 1) is None
    assert figures.multiplier_centres(point, "ngram", None) is None
    del point["arms"]["ngram"]["multiplier"]
    assert figures.multiplier(BURST, point, "ngram") is None


def test_the_bar_of_a_v3_point_is_its_ci_and_of_an_older_point_the_paired_ratios():
    v3 = _point(V3, 0.0, 8)
    assert figures.multiplier_bar(v3, "ngram", "baseline") == (
        *v3["arms"]["ngram"]["multiplier_ci95"], figures.CI_BAR)
    over_starts = figures.multiplier_bar(v3, "ngram", "baseline", pooled=True)
    assert over_starts is not None and over_starts[2] == figures.CI_BAR_OVER_STARTS
    assert figures.is_ci_bar(figures.CI_BAR) and figures.is_ci_bar(over_starts[2])
    old = _point(BURST, 0.0, 8)
    spec, base = (old["arms"][a]["output_tokens_per_s"]["repeats"] for a in ("ngram", "baseline"))
    ratios = [s / b for s, b in zip(spec, base, strict=True)]
    assert figures.multiplier_bar(old, "ngram", "baseline") == (
        min(ratios), max(ratios), "min..max of paired per-repeat ratios")
    assert not figures.is_ci_bar("min..max of paired per-repeat ratios")


def test_spread_reads_min_and_max_else_the_repeats():
    assert figures.throughput_spread({"output_tokens_per_s": {"median": 10.0, "min": 9.0, "max": 12.0}}) == 0.3
    assert figures.throughput_spread({"output_tokens_per_s": {"median": 10.0, "repeats": [9.0, 10.0, 11.0]}}) \
        == pytest.approx(0.2)
    assert figures.throughput_spread({"output_tokens_per_s": {"median": 0.0, "min": 1.0, "max": 2.0}}) is None
    assert figures.throughput_spread(None) is None


@given(
    spec=st.floats(0.5, 20_000, allow_nan=False),
    base=st.floats(0.5, 20_000, allow_nan=False),
    decimals=st.integers(0, 3),
)
def test_the_interval_of_rounded_centres_holds_the_exact_ratio(spec, base, decimals):
    """Whatever the exact throughputs were, the interval computed from their roundings contains their ratio:
    so a figure the audit refuses is wrong, not unlucky."""
    point = {"arms": {"s": {"output_tokens_per_s": {"median": round(spec, decimals)}},
                      "b": {"output_tokens_per_s": {"median": round(base, decimals)}}}}
    found = figures.multiplier_interval(point, "s", "b", decimals)
    if found is None:  # the baseline rounded to 0
        assert round(base, decimals) <= 0
        return
    low, high, _ = found
    exact = spec / base
    assert low - figures.eps(exact) <= exact <= high + figures.eps(exact)


def _pass(requests: int, source: str = "pass") -> dict:
    return {"from": source, "requests": requests}


@pytest.mark.parametrize(("one", "one_starts", "other", "other_starts", "same"), [
    (86, 2, 43, 1, True),     # two starts' passes over the same 43 prompts, against one
    (129, 3, 86, 2, True),    # three against two: the H100 fp8 KV ledger against bf16 (2026-12-07)
    (43, 3, 86, 2, True),     # a ledger whose earlier passes were dropped (2026-12-03) sums fewer passes than starts
    (80, 1, 40, 1, False),    # one start of 80 prompts is another prompt set than one of 40
    (120, 2, 80, 2, False),   # 3 x 40 cannot come from two starts
    (43, 1, 40, 1, False),
    (43, 1, 0, 1, False),
])
def test_passes_over_the_same_prompts_are_whole_per_start_sets_no_more_than_the_starts(
        one: int, one_starts: int, other: int, other_starts: int, same: bool):
    assert figures.passes_over_the_same_prompts(_pass(one), _pass(other), one_starts=one_starts,
                                                other_starts=other_starts) is same
    assert figures.passes_over_the_same_prompts(_pass(other), _pass(one), one_starts=other_starts,
                                                other_starts=one_starts) is same


def test_acceptance_from_windows_is_never_the_same_prompts_and_starts_come_from_the_windows():
    assert not figures.passes_over_the_same_prompts(_pass(43, "windows"), _pass(43, "windows"), one_starts=1,
                                                    other_starts=1)
    arm = {"output_tokens_per_s": {"repeats": [1.0, 2.0, 3.0]}, "window": {"start": [0, 0, 2]}}
    assert figures.arm_start_count(arm) == 2
    assert figures.arm_start_count({"output_tokens_per_s": {"repeats": [1.0]}}) == 1  # before starts were kept
    assert figures.arm_start_count(None) == 1
