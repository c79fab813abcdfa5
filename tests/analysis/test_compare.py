"""Comparing two ledgers: the condition that differs, and each shared figure's change with the interval a
verification would give it (the reference's between-start spread included where it pools one)."""

from __future__ import annotations

import math

from repo_paths import ROOT
from scipy import stats as scipy_stats

from specledger import stats
from specledger.analysis.compare import compare_acceptance, compare_ledgers, condition_differences
from specledger.cli import main
from specledger.ledger import load_ledger
from specledger.ledger.figures import engine_starts, start_spread

BF16 = ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b.json"
FP8 = ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b-fp8.json"
FP8_KV = ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b-fp8kv.json"


def test_the_fp8_ledger_differs_from_bf16_in_the_checkpoint_alone():
    differences = condition_differences(load_ledger(BF16), load_ledger(FP8))
    assert sorted(differences) == ["target.quantization", "target.weight_format"]
    assert differences["target.quantization"] == (None, "fp8")


def test_the_change_is_the_ratio_of_geometric_means_over_starts_with_the_pooled_t_interval():
    """Worked from the raw repeats: ngram's multiplier per engine start on each side, the bf16 ledger's pooled log
    SD and degrees of freedom joined by the fp8 starts' own deviations, and Student's t for the fp8 starts against
    the bf16 starts (one fp8 start, a nightly run, is the case of no deviations of its own)."""
    bf16, fp8 = load_ledger(BF16), load_ledger(FP8)
    table = compare_ledgers(bf16, fp8)
    # the points both measured
    assert sorted(set(table["point"])) == ["copy:0:1", "copy:0:4", "copy:0:64", "copy:0:8", "free-form:0:8"]
    assert set(table["arm"]) == {"baseline", "matched-baseline", "ngram"}  # fp8 has no ngram-gpu or draft arm
    row = table[(table["point"] == "copy:0:1") & (table["figure"] == "multiplier")].iloc[0]

    def per_start(ledger, key):
        arms = ledger.find_point(*key)["arms"]
        return stats.start_multipliers(arms["ngram"]["output_tokens_per_s"]["repeats"],
                                       arms["baseline"]["output_tokens_per_s"]["repeats"], engine_starts(arms["ngram"]))

    key = ("copy", 0.0, 1)
    logs_bf16, logs_fp8 = [math.log(m) for m in per_start(bf16, key)], [math.log(m) for m in per_start(fp8, key)]
    assert len(logs_bf16) >= 2 and len(logs_fp8) >= 1
    spread = start_spread(bf16.data, "ngram", "multiplier")
    mean_fp8, mean_bf16 = sum(logs_fp8) / len(logs_fp8), sum(logs_bf16) / len(logs_bf16)
    df = spread.df + len(logs_fp8) - 1
    sd = math.sqrt((spread.log_sd ** 2 * spread.df + sum((x - mean_fp8) ** 2 for x in logs_fp8)) / df)
    centre = mean_fp8 - mean_bf16
    half = scipy_stats.t.ppf(0.975, df) * sd * math.sqrt(1 / len(logs_fp8) + 1 / len(logs_bf16))
    assert row["change_pct"] == round(100 * (math.exp(centre) - 1), 1)
    assert row["change_ci95_pct"] == (round(100 * (math.exp(centre - half) - 1), 1),
                                      round(100 * (math.exp(centre + half) - 1), 1))
    assert row["outcome"] == "inconclusive" and row["over"] == "engine starts (pooled spread)"


def test_acceptance_length_is_held_to_the_reference_bar_from_the_raw_counters():
    """fp8 weights leave ngram's acceptance length where bf16 has it; an fp8 KV cache moves it past the bar on copy
    and not on free-form (few of ngram's drafts are accepted there with either cache). Worked from the counters:
    1 + accepted / drafts of each ledger's passes (a point of several engine starts sums their passes over the same
    prompts), against bf16's ±acceptance_length_abs."""
    bf16 = load_ledger(BF16)
    kv = compare_acceptance(bf16, load_ledger(FP8_KV))
    weights = compare_acceptance(bf16, load_ledger(FP8))
    assert set(weights["outcome"]) == {"holds"} and len(weights) == 5  # ngram at every shared point
    assert dict(zip(kv["point"], kv["outcome"], strict=True)) == {
        "copy:0:1": "changed", "copy:0:4": "changed", "copy:0:8": "changed", "copy:0:64": "changed",
        "free-form:0:8": "holds"}
    bar = bf16.tolerances["acceptance_length_abs"]
    for row in kv.itertuples():
        key = (row.point.split(":")[0], 0.0, int(row.point.split(":")[2]))
        lengths = []
        for ledger in (bf16, load_ledger(FP8_KV)):
            acc = ledger.find_point(*key)["arms"]["ngram"]["acceptance"]
            lengths.append(1 + acc["accepted_tokens"] / acc["drafts"])
        assert abs(row.reference - lengths[0]) < 5e-4 and abs(row.other - lengths[1]) < 5e-4
        assert (abs(lengths[1] - lengths[0]) > bar) == (row.outcome == "changed")
        assert row.bar == (round(row.reference - bar, 3), round(row.reference + bar, 3))


def test_ledgers_without_a_spread_are_compared_over_windows_and_say_so():
    # one engine start a point on either side, and no pooled spread in either (the burst record is frozen test data)
    one_start = load_ledger(ROOT / "tests" / "data" / "h200-smollm2-copy-burst.json")
    assert one_start.data.get("start_spread") is None
    table = compare_ledgers(load_ledger(ROOT / "ledgers" / "cpu-smollm2.json"), one_start)
    assert not table.empty and set(table["over"]) == {"windows of one start each"}


def test_cli_prints_the_differing_condition_and_fails_without_a_shared_point(capsys):
    assert main(["compare", str(BF16), str(FP8)]) == 0
    out = capsys.readouterr().out
    assert "target.quantization: None -> 'fp8'" in out and "copy:0:8" in out
    assert "Acceptance length" in out
    planned = ROOT / "ledgers" / "h200-qwen2.5-coder-1.5b-policy.json"
    assert load_ledger(planned).points == []
    assert main(["compare", str(BF16), str(planned)]) == 1


def test_the_change_plot_draws_every_row_in_its_panel_and_refuses_an_empty_table(tmp_path):
    import pandas as pd
    import pytest

    from specledger.render.compare_plots import change_figure, write_change_plot
    from specledger.render.plots import NothingToPlot

    table = compare_ledgers(load_ledger(BF16), load_ledger(FP8))
    fig = change_figure(table, "fp8 against bf16")
    multiplier_ax, throughput_ax = fig.axes[:2]
    rows = {t.get_text(): t.get_position()[1] for t in multiplier_ax.get_yticklabels()}
    assert rows.keys() == {f"{p} ngram" for p in ("copy:0:1", "copy:0:4", "copy:0:8", "copy:0:64", "free-form:0:8")}
    assert rows["copy:0:1 ngram"] > rows["copy:0:8 ngram"]  # in the reference's order, top down
    assert len(throughput_ax.get_yticklabels()) == (table["figure"] != "multiplier").sum() == 15
    assert len(fig.axes) == 2  # no acceptance table: no acceptance panel
    kv_acceptance = compare_acceptance(load_ledger(BF16), load_ledger(FP8_KV))
    kv = change_figure(compare_ledgers(load_ledger(BF16), load_ledger(FP8_KV)), "fp8 KV", kv_acceptance)
    acceptance_ax = kv.axes[2]
    assert {t.get_text() for t in acceptance_ax.get_yticklabels()} == {f"{p} ngram" for p in kv_acceptance["point"]}
    dots = [line for line in acceptance_ax.get_lines() if line.get_marker() == "o" and len(line.get_xdata())]
    colour_of = {float(d.get_xdata()[0]): d.get_color() for d in dots}
    assert sorted(colour_of) == sorted(kv_acceptance["other"])
    assert {colour_of[r.other] for r in kv_acceptance.itertuples()} == {"tab:red", "tab:green"}
    assert all(colour_of[r.other] == ("tab:red" if r.outcome == "changed" else "tab:green")
               for r in kv_acceptance.itertuples())
    path = write_change_plot(table, "fp8 against bf16", tmp_path / "plots" / "change.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(NothingToPlot, match="share no point"):
        change_figure(pd.DataFrame(), "nothing")
