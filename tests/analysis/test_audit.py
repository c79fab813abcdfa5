"""The audit recomputes each derived figure and names the JSON path of every one that disagrees."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import ROOT, SMALL

from specledger import stats
from specledger.analysis.audit import Finding, at_least, audit_ledger, audit_paths
from specledger.ledger import Ledger, load_ledger, parse_ledger
from specledger.ledger.figures import decimals_of, ratio_interval, rounds_to

REFERENCE = sorted((ROOT / "ledgers").glob("reference-*.json"))
EAGLE = "$.points[0].arms.eagle"


@pytest.fixture
def small() -> dict:
    return json.loads(SMALL.read_text())


def audit(data: dict) -> list[Finding]:
    return audit_ledger(parse_ledger(json.dumps(data), "small.json"))


def errors_at(findings: list[Finding], json_path: str, code: str | None = None) -> list[Finding]:
    return [
        f for f in findings if f.severity == "error" and f.json_path == json_path and code in (None, f.code)
    ]


def only_error(findings: list[Finding], json_path: str, code: str) -> Finding:
    errors = [f for f in findings if f.severity == "error"]
    assert [(f.json_path, f.code) for f in errors] == [(json_path, code)], [str(f) for f in errors]
    return errors[0]


# -- rounding arithmetic ------------------------------------------------------------------------


def test_rounds_to_basics():
    assert rounds_to(0.3, 0.258, 0.258, 1)
    assert not rounds_to(0.2, 0.258, 0.258, 1)
    assert rounds_to(0.26, 0.2577, 0.2583, 2)
    assert not rounds_to(0.258, 0.258, 0.258, 2)  # more decimals than it claims
    assert rounds_to(-0.36, -0.3704, -0.3459, 2)
    assert (
        decimals_of(0.26) == 2
        and decimals_of(-0.36) == 2
        and decimals_of(3.0) == 0
        and decimals_of(1e-5) == 5
    )


def test_ratio_interval():
    lo, hi = ratio_interval(4.3, 1, 6.7, 1)
    assert lo == pytest.approx(4.25 / 6.75) and hi == pytest.approx(4.35 / 6.65)
    assert ratio_interval(6, None, 3, None) == (2.0, 2.0)
    assert ratio_interval(1.0, 0, 0.4, 0)[1] == float("inf")


@given(
    st.floats(min_value=0.05, max_value=1e5, allow_nan=False),
    st.floats(min_value=0.05, max_value=1e5, allow_nan=False),
    st.integers(min_value=0, max_value=2),
    st.integers(min_value=0, max_value=4),
)
def test_multiplier_from_rounded_medians_always_passes(a, b, tps, decimals):
    """round(a_r / b_r, d) from medians rounded to `tps` decimals is always accepted."""
    a_r, b_r = round(a, tps), round(b, tps)
    if b_r <= 0:
        return
    stated = round(a_r / b_r, decimals)
    lo, hi = ratio_interval(a_r, tps, b_r, tps)
    assert rounds_to(stated, lo, hi, decimals)


@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.integers(min_value=0, max_value=6))
def test_rounding_of_a_value_holds(x, decimals):
    assert rounds_to(round(x, decimals), x, x, decimals)


@given(
    st.floats(min_value=1.0, max_value=5000.0, allow_nan=False),
    st.floats(min_value=1.0, max_value=5000.0, allow_nan=False),
)
def test_audit_accepts_any_multiplier_the_recorder_would_write(spec, base):
    """End to end: medians rounded to 1 decimal, multiplier to 3, the audit finds no error."""
    data = json.loads(SMALL.read_text())
    arms = data["points"][0]["arms"]
    arms["baseline"]["output_tokens_per_s"] = {"median": round(base, 1)}
    arms["eagle"]["output_tokens_per_s"] = {"median": round(spec, 1)}
    arms["eagle"]["multiplier"] = round(round(spec, 1) / round(base, 1), 3)
    del arms["eagle"]["multiplier_vs_matched"]
    del data["claims"]
    del data["critical_concurrency"]
    findings = audit_ledger(Ledger(Path("small.json"), data))
    assert not [f for f in findings if f.severity != "info"], [str(f) for f in findings]


@given(st.integers(min_value=1, max_value=10**6), st.data())
def test_audit_accepts_acceptance_figures_computed_from_counts(drafts, data):
    k = 4
    counts = [data.draw(st.integers(min_value=0, max_value=drafts))]
    for _ in range(k - 1):
        counts.append(data.draw(st.integers(min_value=0, max_value=counts[-1])))
    accepted = sum(counts)
    draft_tokens = k * drafts
    ledger = json.loads(SMALL.read_text())
    ledger["points"][0]["arms"]["eagle"]["acceptance"] = {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_position": counts,
        "acceptance_length": round(1 + accepted / drafts, 3),
        "acceptance_rate": round(accepted / draft_tokens, 4),
        "per_position": [round(c / drafts, 4) for c in counts],
    }
    findings = audit_ledger(Ledger(Path("small.json"), ledger))
    assert not [f for f in findings if f.severity != "info"], [str(f) for f in findings]


# -- a consistent ledger, then one fault at a time ---------------------------------------------


def test_consistent_ledger_has_no_errors_or_warnings(small):
    findings = audit(small)
    assert [f for f in findings if f.severity != "info"] == []
    assert all(f.file == "small.json" for f in findings)


def test_wrong_multiplier(small):
    small["points"][0]["arms"]["eagle"]["multiplier"] = 1.81
    finding = only_error(audit(small), f"{EAGLE}.multiplier", "multiplier-ratio")
    assert "180.0/100.0 = 1.800, stated as 1.81" in finding.message
    assert str(finding).startswith(f"small.json: {EAGLE}.multiplier: error: ")


def test_multiplier_within_the_medians_rounding_holds(small):
    # 180.0/100.0 with both medians +-0.05 spans 1.79895..1.80105: 1.799 and 1.801 both hold at 3 decimals.
    for stated in (1.799, 1.801):
        small["points"][0]["arms"]["eagle"]["multiplier"] = stated
        assert not errors_at(audit(small), f"{EAGLE}.multiplier")
    small["points"][0]["arms"]["eagle"]["multiplier"] = 1.802
    assert errors_at(audit(small), f"{EAGLE}.multiplier")


def test_point_rounding_override_applies(small):
    small["points"][0]["arms"]["eagle"]["multiplier"] = 1.8
    small["points"][0]["rounding"] = {"multiplier": 1}
    assert not errors_at(audit(small), f"{EAGLE}.multiplier")
    small["points"][0]["arms"]["eagle"]["multiplier"] = 1.85
    assert errors_at(audit(small), f"{EAGLE}.multiplier")  # more decimals than the rounding says


def test_wrong_multiplier_vs_matched(small):
    small["points"][1]["arms"]["eagle"]["multiplier_vs_matched"] = 1.3
    only_error(audit(small), "$.points[1].arms.eagle.multiplier_vs_matched", "multiplier-ratio")


def test_median_disagrees_with_repeats(small):
    small["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = 100.5
    findings = audit(small)
    assert errors_at(findings, "$.points[0].arms.baseline.output_tokens_per_s.median", "repeats")


def test_min_above_median(small):
    thr = small["points"][2]["arms"]["eagle"]["output_tokens_per_s"]
    del thr["repeats"]
    thr["min"] = 700.0
    only_error(audit(small), "$.points[2].arms.eagle.output_tokens_per_s.min", "order")


def test_acceptance_length_above_k_plus_one(small):
    acceptance = small["points"][0]["arms"]["eagle"]["acceptance"]
    for field in ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_position", "per_position"):
        del acceptance[field]
    acceptance["acceptance_length"] = 5.5
    finding = only_error(audit(small), f"{EAGLE}.acceptance.acceptance_length", "acceptance-bound")
    assert "k+1 = 5" in finding.message


def test_acceptance_length_disagrees_with_counts(small):
    small["points"][0]["arms"]["eagle"]["acceptance"]["acceptance_length"] = 2.6
    only_error(audit(small), f"{EAGLE}.acceptance.acceptance_length", "acceptance-length-counts")


def test_acceptance_rate_disagrees_with_counts(small):
    small["points"][0]["arms"]["eagle"]["acceptance"]["acceptance_rate"] = 0.4
    finding = only_error(audit(small), f"{EAGLE}.acceptance.acceptance_rate", "acceptance-rate-counts")
    assert "1500/4000" in finding.message


def test_per_position_disagrees_with_counts(small):
    small["points"][0]["arms"]["eagle"]["acceptance"]["per_position"][2] = 0.3
    only_error(audit(small), f"{EAGLE}.acceptance.per_position[2]", "per-position-counts")


def test_per_position_counts_must_sum_to_accepted(small):
    small["points"][0]["arms"]["eagle"]["acceptance"]["accepted_tokens"] = 1499
    findings = audit(small)
    assert errors_at(findings, f"{EAGLE}.acceptance.accepted_per_position", "counts")


def test_increasing_per_position_counts(small):
    acceptance = small["points"][0]["arms"]["eagle"]["acceptance"]
    acceptance["accepted_per_position"] = [450, 700, 250, 100]
    acceptance["per_position"] = [0.45, 0.7, 0.25, 0.1]
    finding = only_error(
        audit(small), f"{EAGLE}.acceptance.accepted_per_position[1]", "per-position-increasing"
    )
    assert "position 1" in finding.message


def test_increasing_per_position_without_counts_is_a_warning(small):
    acceptance = small["points"][0]["arms"]["eagle"]["acceptance"]
    del acceptance["accepted_per_position"]
    acceptance["per_position"] = [0.45, 0.7, 0.25, 0.1]
    findings = audit(small)
    assert not [f for f in findings if f.severity == "error"]
    (warning,) = [f for f in findings if f.severity == "warning"]
    assert warning.json_path == f"{EAGLE}.acceptance.per_position[1]"


def test_more_draft_tokens_per_draft_than_k(small):
    acceptance = small["points"][0]["arms"]["eagle"]["acceptance"]
    acceptance["draft_tokens"] = 5000
    acceptance["acceptance_rate"] = 0.3
    only_error(audit(small), f"{EAGLE}.acceptance.draft_tokens", "draft-length")


def test_more_positions_than_k(small):
    small["points"][0]["arms"]["eagle"]["acceptance"]["per_position"].append(0.0)
    findings = audit(small)
    assert errors_at(findings, f"{EAGLE}.acceptance.per_position", "draft-length")


def test_sessions_disagree_with_kv_tokens(small):
    small["arms"][0]["sessions"][0]["sessions"] = 4.5
    finding = only_error(audit(small), "$.arms[0].sessions[0].sessions", "sessions")
    assert "16000/4000" in finding.message


def test_kv_tokens_disagree_with_blocks(small):
    small["arms"][2]["kv_cache"]["tokens"] = 12801
    findings = audit(small)
    assert errors_at(findings, "$.arms[2].kv_cache.tokens", "kv-tokens")


def test_kv_change_disagrees_with_tokens(small):
    small["arms"][2]["kv_cache"]["change_vs_baseline"] = -0.25
    only_error(audit(small), "$.arms[2].kv_cache.change_vs_baseline", "kv-change")


def test_kv_change_from_sessions_when_no_tokens(small):
    """The publication case: 6.7 -> 4.3 sessions at 1 decimal, -36% holds; -30% does not."""
    for arm in small["arms"]:
        arm.pop("kv_cache", None)
    small["arms"][0]["sessions"] = [{"context_tokens": 262144, "sessions": 6.7}]
    small["arms"][2]["sessions"] = [{"context_tokens": 262144, "sessions": 4.3}]
    small["arms"][2]["kv_cache"] = {"change_vs_baseline": -0.36}
    small["rounding"] = {"sessions": 1}
    assert not [f for f in audit(small) if f.severity != "info"]
    small["arms"][2]["kv_cache"]["change_vs_baseline"] = -0.25
    only_error(audit(small), "$.arms[2].kv_cache.change_vs_baseline", "kv-change")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"value": 12.0}, "value"),
        ({"between": [1, 4]}, "between"),
        ({"crosses": False, "value": None, "between": None}, "crosses"),
    ],
)
def test_wrong_critical_concurrency(small, change, field):
    entry = small["critical_concurrency"][0]
    entry.update(change)
    for key in [k for k, v in entry.items() if v is None and k != "temperature"]:
        del entry[key]
    finding = only_error(audit(small), f"$.critical_concurrency[0].{field}", "critical")
    assert "9.19 (between 4 and 16)" in finding.message


def test_critical_value_within_tolerance_holds(small):
    small["critical_concurrency"][0]["value"] = 9.3  # log2(9.3) - log2(9.19) = 0.017
    assert not [f for f in audit(small) if f.severity == "error"]


def test_stays_above_matches_crosses_false(small):
    for point in small["points"]:
        point["arms"]["eagle"].pop("multiplier")
        point["arms"]["eagle"].pop("multiplier_vs_matched")
    small["points"][2]["arms"]["eagle"]["multiplier"] = 1.1
    small["points"][2]["arms"]["eagle"]["output_tokens_per_s"] = {"median": 880.0}
    small["critical_concurrency"] = [{"arm": "eagle", "workload": "copy", "crosses": False}]
    assert not [f for f in audit(small) if f.severity == "error"]


def test_wrong_claim(small):
    small["claims"][0]["value"] = 1.7
    small["claims"][0]["text"] = "1.7x"
    finding = only_error(audit(small), "$.claims[0].value", "claim")
    assert "180.0/100.0 = 1.800, stated as 1.7x: does not hold at 1 decimal" in finding.message


def test_claim_that_holds_is_info(small):
    (info,) = [f for f in audit(small) if f.code == "claim"]
    assert info.severity == "info"
    assert info.message == "180.0/100.0 = 1.800, stated as 1.8x: holds at 1 decimal"


def test_claim_naming_no_single_point(small):
    del small["claims"][0]["concurrency"]
    finding = only_error(audit(small), "$.claims[0]", "claim")
    assert "matches 3 points" in finding.message


def test_mix_must_sum_to_one(small):
    small["workloads"].append({"name": "chat", "kind": "free-form"})
    small["workload_mix"] = {"basis": "generated_tokens", "shares": {"copy": 0.5, "chat": 0.4}}
    only_error(audit(small), "$.workload_mix.shares", "mix")


def test_reference_inconsistencies_are_warnings(small):
    small["status"] = "reference"
    small["points"][0]["arms"]["eagle"]["multiplier"] = 1.81
    findings = audit(small)
    assert not [f for f in findings if f.severity == "error"]
    warning = next(f for f in findings if f.json_path == f"{EAGLE}.multiplier")
    assert warning.severity == "warning"
    # ...and every stated multiplier with both medians gets an info saying whether its rounding holds.
    infos = [f for f in findings if f.severity == "info" and f.json_path.endswith(".multiplier")]
    assert {f.json_path for f in infos} == {
        "$.points[1].arms.eagle.multiplier",
        "$.points[2].arms.eagle.multiplier",
    }
    assert {f.code for f in infos} == {"multiplier-ratio"}
    assert len([f for f in findings if f.json_path.endswith(".multiplier_vs_matched")]) == 3
    assert "390.0/300.0 = 1.300, stated as 1.3: holds at 3 decimals" in {f.message for f in infos}


def test_at_least():
    findings = [Finding(s, "f", "$", "c", "m") for s in ("info", "warning", "error")]
    assert [f.severity for f in at_least(findings, "warning")] == ["warning", "error"]
    assert at_least(findings, "info") == findings


# -- the reference ledgers ----------------------------------------------------------------------


def test_reference_ledgers_exist():
    names = {p.name for p in REFERENCE}
    assert {
        "reference-b200-nvfp4-gptq.json",
        "reference-b200-fp8kv.json",
        "reference-b200-int4.json",
        "reference-b200-bf16.json",
        "reference-b200-4bit.json",
        "reference-b200-workloads.json",
        "reference-b200-lookup-math.json",
    } <= names


@pytest.mark.parametrize("path", REFERENCE, ids=lambda p: p.name)
def test_reference_ledger_is_consistent(path):
    ledger = load_ledger(path)
    assert ledger.status == "reference"
    assert ledger.data["source"]["title"] == "Speculative decoding in production (write-up)"
    assert ledger.data["provenance"]["engine"] == {"name": "vllm", "version": "0.28.0"}
    findings = audit_ledger(ledger)
    assert not [f for f in findings if f.severity != "info"], [str(f) for f in findings]


def test_reference_audit_says_the_0_3x_rounding_holds():
    findings, problems = audit_paths(REFERENCE)
    assert problems == []
    claim = next(f for f in findings if f.code == "claim" and "0.3x" in f.message)
    assert claim.severity == "info"
    assert claim.message == "595/2306 = 0.258, stated as 0.3x: holds at 1 decimal"
    assert claim.file.endswith("reference-b200-nvfp4-gptq.json")


def curve(ledger: Ledger, arm: str = "dflash2", workload: str = "free-form") -> dict:
    return {
        p["concurrency"]: p["arms"][arm].get("multiplier")
        for p in ledger.points
        if p["workload"] == workload and p["concurrency"] is not None
    }


def test_reference_figures_are_the_published_ones():
    """Guard the transcription: every published figure, as published."""
    by_id = {load_ledger(p).id: load_ledger(p) for p in REFERENCE}
    assert curve(by_id["reference-b200-nvfp4-gptq"]) == {1: 1.34, 4: 1.22, 16: 1.05, 64: 0.26}
    assert curve(by_id["reference-b200-fp8kv"]) == {1: 1.45, 2: 1.34, 4: 1.28, 8: 1.27}
    assert curve(by_id["reference-b200-int4"]) == {1: 1.43, 2: 1.23, 4: 1.06, 8: 0.82}
    c64 = by_id["reference-b200-nvfp4-gptq"].find_point("free-form", None, 64)["arms"]
    assert (
        c64["baseline"]["output_tokens_per_s"]["median"],
        c64["dflash2"]["output_tokens_per_s"]["median"],
    ) == (
        2306,
        595,
    )
    for ledger_id, (base, spec, multiplier) in {
        "reference-b200-bf16": (88.7, 266.4, 3.0),
        "reference-b200-4bit": (129.0, 286.9, 2.2),
    }.items():
        arms = by_id[ledger_id].find_point("free-form", None, None)["arms"]
        assert arms["baseline"]["output_tokens_per_s"]["median"] == base
        assert arms["dflash2"]["output_tokens_per_s"]["median"] == spec
        assert arms["dflash2"]["multiplier"] == multiplier
    workloads = by_id["reference-b200-workloads"]
    acceptance = {
        w: workloads.find_point(w, None, None)["arms"]["dflash2"]["acceptance"] for w in ("copy", "free-form")
    }
    assert acceptance == {"copy": {"acceptance_length": 3.1}, "free-form": {"acceptance_length": 2.2}}
    assert curve(workloads, workload="copy") == {8: 1.1}
    assert curve(workloads, workload="free-form") == {8: 0.8}
    assert workloads.data["workload_mix"] == {
        "basis": "generated_tokens",
        "shares": {"free-form": 0.935, "copy": 0.065},
    }
    assert workloads.arm("dflash2")["kv_cache"]["change_vs_baseline"] == -0.36
    assert workloads.arm("baseline")["sessions"] == [{"context_tokens": 262144, "sessions": 6.7}]
    assert workloads.arm("dflash2")["sessions"] == [{"context_tokens": 262144, "sessions": 4.3}]
    lookup = by_id["reference-b200-lookup-math"]
    assert lookup.find_point("math", 0.0, None)["arms"]["ngram"]["multiplier_range"] == [1.3, 4.2]
    assert lookup.find_point("math", 1.0, None)["arms"]["ngram"]["multiplier_range"] == [0.3, 1.0]
    for ledger in by_id.values():
        for arm in ledger.arms:
            if arm["name"] == "dflash2":
                assert arm["drafter"] == "DFlash2 (k=7)"
                assert arm["speculative_config"] == {"method": "dflash2", "num_speculative_tokens": 7}


def test_audit_paths_collects_load_problems(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    findings, problems = audit_paths([SMALL, bad])
    assert [p.file for p in problems] == [str(bad)]
    assert all(f.file == str(SMALL) for f in findings)
    with pytest.raises(FileNotFoundError):
        audit_paths([tmp_path / "missing.json"])


# -- noise against the multiplier tolerance -----------------------------------------------------


def _with_noise(small: dict, spread: float, repeat_prompts: str = "same") -> dict:
    """Give every arm's repeats a relative spread (median kept) and a ±15% multiplier tolerance."""
    small["tolerances"] = {"multiplier_rel": 0.15}
    small["sweep"]["repeat_prompts"] = repeat_prompts
    for point in small["points"]:
        for result in point["arms"].values():
            tps = result["output_tokens_per_s"]
            m = tps["median"]
            tps.update(repeats=[m * (1 - spread), m, m * (1 + spread)], min=m * (1 - spread), max=m * (1 + spread))
    return small


def test_quiet_repeats_raise_no_noise_finding(small):
    assert [f for f in audit(_with_noise(small, 0.01)) if f.code == "noise"] == []


def test_noisy_repeats_warn_that_the_tolerance_cannot_be_verified(small):
    noise = [f for f in audit(_with_noise(small, 0.2)) if f.code == "noise"]
    assert [(f.severity, f.json_path) for f in noise] == [("warning", "$.arms[2]")]
    assert "±15%" in noise[0].message and "repeats" in noise[0].message


def test_rotating_prompts_make_the_noise_finding_an_upper_bound(small):
    noise = [f for f in audit(_with_noise(small, 0.2, "rotate")) if f.code == "noise"]
    assert [f.severity for f in noise] == ["info"] and "upper bound" in noise[0].message


def _with_engine_times(small: dict, spread: float) -> dict:
    """Give every arm engine-side request times with a relative spread."""
    for point in small["points"]:
        for result in point["arms"].values():
            result["request_time_s"] = {"engine": [0.5 * (1 - spread), 0.5, 0.5 * (1 + spread)]}
    return small


@pytest.mark.parametrize(("engine_spread", "verdict"), [
    (0.2, "in the engine's own steps"),
    (0.01, "outside the engine core"),
    (0.1, "partly in the engine's steps"),
])
def test_the_noise_finding_places_the_noise_by_engine_time(small, engine_spread, verdict):
    noise = [f for f in audit(_with_engine_times(_with_noise(small, 0.2), engine_spread)) if f.code == "noise"]
    assert len(noise) == 1 and verdict in noise[0].message
    assert "vllm:request_inference_time_seconds" in noise[0].message


def test_request_times_must_match_the_repeats(small):
    _with_engine_times(_with_noise(small, 0.01), 0.01)
    small["points"][0]["arms"]["eagle"]["request_time_s"]["engine"].pop()
    found = [f for f in audit(small) if f.json_path == "$.points[0].arms.eagle.request_time_s.engine"]
    assert [f.code for f in found] == ["repeats"] and "2 request times for 3 throughput repeats" in found[0].message


# -- protocol v3 points: multipliers of means, intervals, and which tolerances they resolve ------


def _v3(small: dict, spread: float, *, n: int = 5, max_repeats: int = 12, tolerance: float = 0.15) -> dict:
    """The small ledger re-recorded with protocol v3: n paired repeats per arm spread ±spread around each
    median (spec and base in opposite order, so the ratio varies), multipliers and intervals from
    specledger.stats as measure/recording.py writes them. The matched arm is left out of the points."""
    small["schema_version"] = 2
    small["protocol"] = {"version": 3, "window": {"min_s": 10.0, "min_rounds": 4},
                         "warmup": {"max_windows": 4, "agree_rel": 0.1},
                         "repeats": {"min": n, "max": max_repeats}, "busy_others_cpu_share": 0.15,
                         "statistics": {"confidence": 0.95, "method": "BCa", "n_resamples": 9999,
                                        "estimator": "ratio of mean window throughput over paired repeats"}}
    small["tolerances"] = {"multiplier_rel": tolerance}
    shape = [2 * r / (n - 1) - 1 for r in range(n)]  # -1 .. +1, mean 0
    for point in small["points"]:
        point["protocol_version"] = 3
        del point["arms"]["matched"]
        for name, order in (("baseline", shape[::-1]), ("eagle", shape)):
            result = point["arms"][name]
            median = result["output_tokens_per_s"]["median"]
            reps = [round(median * (1 + spread * z), 1) for z in order]
            mean = stats.mean_estimate(reps)
            result["output_tokens_per_s"] = {"repeats": reps, "median": statistics.median(reps), "min": min(reps),
                                             "max": max(reps), "mean": round(mean.value, 1),
                                             "ci95": [round(mean.low, 1), round(mean.high, 1)]}
        eagle, base = point["arms"]["eagle"], point["arms"]["baseline"]
        eagle.pop("multiplier_vs_matched")
        m = stats.multiplier_estimate(eagle["output_tokens_per_s"]["repeats"], base["output_tokens_per_s"]["repeats"])
        eagle["multiplier"], eagle["multiplier_ci95"] = round(m.value, 3), [round(m.low, 3), round(m.high, 3)]
    return small


def v3_audit(data: dict) -> list[Finding]:
    """Audit without loading: the v2 schema may not read v3 points yet (it is written alongside)."""
    return audit_ledger(Ledger(Path("small.json"), data))


def predicted(point: dict, max_repeats: int) -> float:
    """The fresh-vs-committed change's half-width predicted for one point, worked by hand."""
    eagle = point["arms"]["eagle"]
    h = (eagle["multiplier_ci95"][1] - eagle["multiplier_ci95"][0]) / 2 / eagle["multiplier"]
    n = len(eagle["output_tokens_per_s"]["repeats"])
    return math.sqrt(h * h + h * h * n / max_repeats)


def test_quiet_v3_ledger_is_consistent_and_resolves_its_tolerance(small):
    findings = v3_audit(_v3(small, 0.02))
    assert [f for f in findings if f.severity != "info"] == [], [str(f) for f in findings]
    (found,) = [f for f in findings if f.code == "resolution"]
    assert (found.severity, found.json_path) == ("info", "$.arms[2]")
    assert "at the median of 3 v3 points" in found.message and "12 fresh repeats" in found.message
    assert found.message.endswith("against a tolerance of ±15% (windows of one engine start: no point has two, so "
                                  "the spread between starts is not in these widths; --ledger-add-start measures "
                                  "it): resolvable at every point")


def test_the_resolution_of_a_ledger_that_pools_a_start_spread_counts_starts_not_windows(small):
    """With a pooled between-start spread, verdicts count engine starts: the finding predicts one fresh start
    against the committed one, worked here by hand (t with df + 0 degrees of freedom, sd * sqrt(1/1 + 1/1)), then
    the fresh starts that would resolve it; a spread small enough resolves it with one start."""
    from scipy import stats as scipy_stats

    data = _v3(small, 0.02)
    data["start_spread"] = {"eagle": {"multiplier": {"log_sd": 0.05, "df": 4, "points": 2}}}
    (found,) = [f for f in v3_audit(data) if f.code == "resolution"]
    assert "one engine start" not in found.message and found.severity == "warning"

    def high(n_fresh: int) -> float:
        return math.exp(scipy_stats.t.ppf(0.975, 4 + n_fresh - 1) * 0.05 * math.sqrt(1 / n_fresh + 1)) - 1

    assert high(1) > 0.15 and f"known to {-(1 - 1 / (1 + high(1))):+.1%}..{high(1):+.1%}" in found.message
    needed = next(n for n in range(2, 21) if high(n) <= 0.15)
    assert f"{needed} fresh starts (--ledger-starts {needed}) would resolve it" in found.message
    assert "more windows per start do not narrow" in found.message
    data["start_spread"]["eagle"]["multiplier"]["log_sd"] = 0.02
    (found,) = [f for f in v3_audit(data) if f.code == "resolution"]
    assert found.severity == "info" and found.message.endswith("against a tolerance of ±15%: resolvable")


def test_noisy_v3_ledger_names_the_tolerance_it_can_resolve(small):
    data = _v3(small, 0.3)
    (found,) = [f for f in v3_audit(data) if f.code == "resolution"]
    worst = max(predicted(p, 12) for p in data["points"])
    assert worst > 0.15 and found.severity == "warning"
    assert f"±{math.floor(worst * 100) + 1}% would be resolvable at every point" in found.message
    unresolved = sum(predicted(p, 12) >= 0.15 for p in data["points"])
    assert f"resolvable at only {3 - unresolved} of 3 points" in found.message


def test_more_repeats_allowed_can_make_a_tolerance_resolvable(small):
    """Between the committed half-width h and h*sqrt(1 + n/max): only a larger protocol.repeats.max resolves it."""
    data = _v3(small, 0.15)
    worst = max(predicted(p, 12) for p in data["points"])
    tolerance = (worst + max(predicted(p, 10**6) for p in data["points"])) / 2
    data["tolerances"]["multiplier_rel"] = tolerance
    assert [f.severity for f in v3_audit(data) if f.code == "resolution"] == ["warning"]
    data["protocol"]["repeats"]["max"] = 10**6
    assert [f.severity for f in v3_audit(data) if f.code == "resolution"] == ["info"]


def test_no_resolution_finding_without_v3_points(small):
    assert [f for f in audit(small) if f.code == "resolution"] == []
    data = _v3(small, 0.02)
    for point in data["points"]:
        point["protocol_version"] = 1
    assert [f for f in v3_audit(data) if f.code == "resolution"] == []


def test_v3_multiplier_is_checked_against_the_means(small):
    data = _v3(small, 0.02)
    point = data["points"][0]
    base = point["arms"]["baseline"]["output_tokens_per_s"]
    base.update(repeats=[99.0, 100.0, 100.0, 101.0, 120.0], median=100.0, min=99.0, max=120.0, mean=104.0,
                ci95=[99.8, 112.0])
    spec = point["arms"]["eagle"]["output_tokens_per_s"]["repeats"]
    point["arms"]["eagle"]["multiplier"] = round(sum(spec) / 5 / 104.0, 3)
    m = point["arms"]["eagle"]["multiplier"]
    point["arms"]["eagle"]["multiplier_ci95"] = [round(m - 0.1, 3), round(m + 0.1, 3)]
    del data["claims"]  # its 1.8x was the old ratio
    del data["critical_concurrency"]
    assert not [f for f in v3_audit(data) if f.severity == "error"]
    point["arms"]["eagle"]["multiplier"] = 1.8  # the ratio of medians, which v3 does not state
    point["arms"]["eagle"]["multiplier_ci95"] = [1.7, 1.9]
    finding = only_error(v3_audit(data), f"{EAGLE}.multiplier", "multiplier-ratio")
    assert "means rounded" in finding.message


def test_v3_interval_must_hold_its_value(small):
    data = _v3(small, 0.02)
    data["points"][0]["arms"]["eagle"]["multiplier_ci95"] = [1.81, 1.9]
    finding = only_error(v3_audit(data), f"{EAGLE}.multiplier_ci95", "interval")
    assert "does not hold the multiplier 1.8" in finding.message


def test_stated_mean_must_agree_with_the_repeats(small):
    data = _v3(small, 0.02)
    data["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["mean"] = 100.5
    data["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["ci95"] = [99.0, 101.0]
    errors = [f for f in v3_audit(data) if f.severity == "error"]
    assert [(f.json_path, f.code) for f in errors] == [
        ("$.points[0].arms.baseline.output_tokens_per_s.mean", "repeats")]


def test_v3_points_are_judged_by_resolution_not_by_the_fixed_band_noise_finding():
    """The H200 v3 ledger's noise is real; it is reported once, by `resolution` (the CI of the change),
    not also by `noise`, whose pass rate of a fixed band is the question of the older protocols."""
    v3 = load_ledger(ROOT / "ledgers" / "h200-smollm2-copy.json")
    codes = [f.code for f in audit_ledger(v3)]
    assert "resolution" in codes and "noise" not in codes
    burst = load_ledger(ROOT / "tests" / "data" / "h200-smollm2-copy-burst.json")
    assert "noise" in [f.code for f in audit_ledger(burst)]


QWEN = ROOT / "ledgers" / "h200-qwen2.5-coder-1.5b.json"


def test_the_stated_between_start_spread_and_its_intervals_are_recomputed_from_the_repeats():
    """A verification takes its yardstick from `start_spread`: a ledger stating it too narrow (every check cries
    wolf) or too wide (every check holds) is caught, and so is an interval that the spread did not set."""
    data = json.loads(QWEN.read_text())
    assert [f for f in audit(data) if f.code == "start-spread"] == []  # as recorded
    narrow = json.loads(QWEN.read_text())
    narrow["start_spread"]["ngram"]["multiplier"]["log_sd"] = 0.01
    (finding,) = [f for f in audit(narrow) if f.code == "start-spread"]
    assert finding.severity == "error" and finding.json_path == "$.start_spread.ngram.multiplier"
    recorded = data["start_spread"]["ngram"]["multiplier"]  # the first assertion: the repeats give exactly this
    assert "states log_sd 0.01" in finding.message
    assert f"the repeats give log_sd {recorded['log_sd']}, df {recorded['df']}" in finding.message
    dropped = json.loads(QWEN.read_text())
    del dropped["start_spread"]["ngram"]
    assert {f.json_path for f in audit(dropped) if f.code == "start-spread"} == {
        f"$.start_spread.ngram.{figure}" for figure in ("multiplier", "multiplier_vs_matched", "output_tokens_per_s")}
    index = next(i for i, p in enumerate(data["points"]) if p["workload"] == "copy" and p["concurrency"] == 1)
    widened = json.loads(QWEN.read_text())
    low, high = widened["points"][index]["arms"]["ngram"]["multiplier_ci95"]
    widened["points"][index]["arms"]["ngram"]["multiplier_ci95"] = [round(low - 0.5, 3), round(high + 0.5, 3)]
    (finding,) = [f for f in audit(widened) if f.code == "start-spread"]
    assert finding.json_path == f"$.points[{index}].arms.ngram.multiplier_ci95"
    assert f"t interval over the point's starts with the arm's pooled spread: {low}..{high}" in finding.message


H100_FP8KV = ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b-fp8kv.json"


def test_the_host_sensitivity_finding_is_the_within_point_slope_of_shows_engine_starts_table():
    """The finding's figures are what a reader gets from `specledger show`'s engine-starts table (its host slice and
    per-start figures, through stats.host_elasticity): two homes, one answer. On the H100 fp8 KV ledger, whose
    starts ran on hosts 2.5x apart, the baseline's tokens/s moves with the host and ngram's multiplier does not
    resolve a dependence (the paired ratio cancels the host)."""
    from specledger import stats
    from specledger.render.tables import starts_table

    ledger = load_ledger(H100_FP8KV)
    found = {f.json_path: f for f in audit_ledger(ledger) if f.code == "host-sensitivity"}
    assert {f.severity for f in found.values()} == {"info"}
    table = starts_table([ledger])
    for arm, figure in (("baseline", "output_tokens_per_s"), ("ngram", "multiplier")):
        rows = table[table.arm == arm]
        groups = [(list(g.host_slice_ms), list(g[figure])) for _, g in rows.groupby(["workload", "concurrency"])]
        e = stats.host_elasticity(groups)
        assert e is not None
        change, low, high = e.per_doubling()
        message = found[f"$.start_spread.{arm}.{figure}"].message
        assert f"{100 * change:+.1f}% per doubled host slice (95% CI {100 * low:+.1f}%..{100 * high:+.1f}%" in message
        assert f"over {e.starts} engine starts at {e.points} points, {e.df} df" in message
    baseline = found["$.start_spread.baseline.output_tokens_per_s"].message
    assert "output_tokens_per_s moves with the host's speed" in baseline
    assert "multiplier shows no resolved dependence" in found["$.start_spread.ngram.multiplier"].message
