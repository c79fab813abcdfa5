"""Claim marks in Markdown: parsing, checking against ledgers, and the unaudited-number scanner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import ROOT, SMALL

from specledger.analysis.claims import (
    METRICS,
    Claim,
    CrossingStatement,
    LedgerSet,
    Malformed,
    Stated,
    Subject,
    audit_report,
    check_claim,
    parse_claim,
    scan_markdown,
    summary_line,
)
from specledger.cli import main

REFERENCES = ("reference-b200-nvfp4-gptq", "reference-b200-workloads", "reference-b200-fp8kv", "reference-b200-int4")


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory) -> Path:
    """The small measured ledger (under a file name unlike its id) and four reference ledgers."""
    directory = tmp_path_factory.mktemp("ledgers")
    shutil.copy(SMALL, directory / "not-the-id.json")
    for name in REFERENCES:
        shutil.copy(ROOT / "ledgers" / f"{name}.json", directory / f"{name}.json")
    return directory


@pytest.fixture(scope="module")
def ledgers(ledger_dir) -> LedgerSet:
    return LedgerSet.load([ledger_dir])


def parse(body: str) -> Claim:
    claim = parse_claim(body, "r.md", 7)
    assert isinstance(claim, Claim), claim
    return claim


def malformed(body: str) -> str:
    claim = parse_claim(body, "r.md", 7)
    assert isinstance(claim, Malformed), claim
    return claim.reason


def check(ledgers: LedgerSet, body: str):
    return check_claim(parse(body), ledgers)


# -- parsing ----------------------------------------------------------------------------------


def test_point_claim_parses():
    claim = parse("h200-smollm2 ngram copy T=0 c=4 multiplier = 1.16")
    assert (claim.ledger, claim.metric, claim.line) == ("h200-smollm2", "multiplier", 7)
    assert claim.subjects == (Subject("ngram", "copy", 0.0, 4),)
    assert claim.values == (Stated("1.16", 1.16, 2),)


@pytest.mark.parametrize(
    ("point", "keyed"),
    [("copy:0:4", "copy T=0 c=4"), ("free-form:-:64", "free-form c=64"), ("copy:0:1->4", "copy T=0 c=1->4"),
     ("copy->free-form:1:8", "copy->free-form T=1 c=8"), ("copy:0", "copy T=0")],
)
def test_the_point_grammar_and_the_keyed_form_of_earlier_reports_say_the_same(point, keyed):
    """Points are written copy:0:4 everywhere (test ids, --ledger-points, claims); reports marked before that
    keep parsing to the same subjects."""
    metric = "critical_concurrency = 4..8" if point == "copy:0" else "multiplier = 1 -> 2" if "->" in point \
        else "multiplier = 1"
    assert parse(f"l ngram {point} {metric}").subjects == parse(f"l ngram {keyed} {metric}").subjects


@pytest.mark.parametrize("selectors", ["free-form:-:64", "free-form c=64", "free-form T=- c=64"])
def test_null_temperature_is_left_out_or_dash(selectors):
    claim = parse(f"reference-b200-nvfp4-gptq dflash2 {selectors} multiplier = 0.3")
    assert claim.subjects == (Subject("dflash2", "free-form", None, 64),)
    assert claim.values[0].decimals == 1


def test_values_keep_their_written_decimals():
    assert parse("x a w output_tokens_per_s = 2,306").values == (Stated("2,306", 2306.0, 0),)
    assert parse("x a kv_cache_change = -36%").values == (Stated("-36%", -0.36, 2),)
    assert parse("x a kv_cache_change = -1.37%").values[0].decimals == 4
    assert parse("x a w multiplier = 3.0").values[0].decimals == 1


def test_arrow_pairs_subjects_with_values():
    claim = parse("reference-b200-workloads baseline->dflash2 ctx=262144 sessions = 6.7 -> 4.3")
    assert [s.arm for s in claim.subjects] == ["baseline", "dflash2"]
    assert {s.context for s in claim.subjects} == {262144}
    assert [v.value for v in claim.values] == [6.7, 4.3]
    claim = parse("h200-smollm2 ngram copy T=0 c=1->4 multiplier = 0.925 -> 1.159")
    assert [s.concurrency for s in claim.subjects] == [1, 4]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4..8", CrossingStatement("crosses", None, (4, 8))),
        ("4.76", CrossingStatement("crosses", Stated("4.76", 4.76, 2), None)),
        ("4.8 in 4..8", CrossingStatement("crosses", Stated("4.8", 4.8, 1), (4, 8))),
        ("no-crossing", CrossingStatement("no-crossing")),
        ("stays-above", CrossingStatement("stays-above")),
        ("starts-below", CrossingStatement("starts-below")),
    ],
)
def test_crossing_forms(value, expected):
    claim = parse(f"reference-b200-int4 dflash2 free-form critical_concurrency = {value}")
    assert claim.crossing == expected
    assert claim.values == ()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("h200-smollm2 ngram copy T=0 c=4 speedup = 1.16", "unknown metric 'speedup'"),
        ("h200-smollm2 ngram copy T=0 c=4 multiplier 1.16", "missing ' = VALUE'"),
        ("h200-smollm2 ngram copy T=0 c=4 multiplier=1.16", "missing ' = VALUE'"),
        ("h200-smollm2 ngram copy T=0 c=4 multiplier =", "no value"),
        ("h200-smollm2 ngram copy T=0 c=4 multiplier = 1.2x", "not a number"),
        ("h200-smollm2 ngram copy c=4 q=1 multiplier = 1", "unknown selector 'q=1'"),
        ("h200-smollm2 ngram copy extra c=4 multiplier = 1", "unexpected 'extra'"),
        ("h200-smollm2 ngram copy c=four multiplier = 1", "c=four"),
        ("h200-smollm2 ngram copy T=hot multiplier = 1", "T=hot"),
        ("h200-smollm2 ngram multiplier = 1", "needs a workload"),
        ("h200-smollm2 multiplier = 1", "names no arm"),
        ("h200-smollm2 a->b copy c=1->2 multiplier = 1 -> 2", "more than one slot"),
        ("h200-smollm2 a->b copy multiplier = 1", "1 value(s) for 2 subject(s)"),
        ("h200-smollm2 baseline sessions = 312.02", "needs ctx="),
        ("h200-smollm2 baseline copy ctx=4096 sessions = 312.02", "figure of the arm"),
        ("h200-smollm2 ngram copy c=4 critical_concurrency = 4..8", "name no concurrency"),
        ("h200-smollm2 ngram copy:0:4 critical_concurrency = 4..8", "name no concurrency (write copy:0)"),
        ("h200-smollm2 ngram copy:0:4:1 multiplier = 1", "a point is WORKLOAD:T:C"),
        ("h200-smollm2 ngram copy:0:4 c=4 multiplier = 1", "given twice"),
        ("h200-smollm2 ngram copy:0:four multiplier = 1", "c=four"),
        ("h200-smollm2 ngram copy critical_concurrency = soon", "expected 4..8"),
    ],
)
def test_malformed_claims_say_why(body, reason):
    assert reason in malformed(body)


def test_malformed_claim_is_reported_with_its_line(ledgers, tmp_path):
    report = tmp_path / "r.md"
    report.write_text("# r\n\nfine\nhere 1.2 <!-- claim: test-small eagle copy T=0 c=1 speed = 1.2 -->\n")
    audit = audit_report(report, ledgers)
    assert [(v.line, v.status) for v in audit.verdicts] == [(4, "unresolved")]
    assert str(audit.verdicts[0]).startswith(f"{report}:4: claim 'test-small eagle copy T=0 c=1 speed = 1.2': ")
    assert "malformed claim: unknown metric 'speed'" in audit.verdicts[0].reason


def test_claims_in_code_and_other_comments_are_not_read():
    text = "\n".join(
        [
            "```markdown",
            "1.4x <!-- claim: x a w multiplier = 1.4 -->",
            "```",
            "~~~~",
            "<!-- claim: broken -->",
            "```",
            "~~~~",
            "`<!-- claim: x a w multiplier = 9 -->` and `2.0x` in inline code",
            "<!-- a plain comment with 3.0x in it -->",
            "<!-- a comment over",
            "two lines, 4.0x -->",
            "real <!-- claim: x a w multiplier = 1.5 -->",
        ]
    )
    scan = scan_markdown(text, "r.md")
    assert [(c.line, c.text) for c in scan.claims] == [(12, "x a w multiplier = 1.5")]
    assert scan.numbers == []


def test_unclosed_claim_comment_is_malformed():
    scan = scan_markdown("a\nb <!-- claim: x a w multiplier = 1.5\n-->\n", "r.md")
    assert len(scan.claims) == 1
    assert isinstance(scan.claims[0], Malformed) and scan.claims[0].line == 2


@given(
    arm=st.sampled_from(["ngram", "draft-self", "dflash2"]),
    c=st.integers(1, 512),
    t=st.sampled_from(["0", "1.0", "-"]),
    value=st.decimals(min_value=0, max_value=10_000, places=3, allow_nan=False),
)
def test_parse_reads_back_what_was_written(arm, c, t, value):
    claim = parse(f"led {arm} copy:{t}:{c} multiplier = {value}")
    assert claim.subjects[0].arm == arm and claim.subjects[0].concurrency == c
    assert claim.subjects[0].temperature == (None if t == "-" else float(t))
    assert claim.values[0].value == float(value) and claim.values[0].decimals == 3


# -- checking ---------------------------------------------------------------------------------


def test_true_claim_holds_and_says_which_source_matched(ledgers):
    verdict = check(ledgers, "test-small eagle copy:0:4 multiplier = 1.3")
    assert verdict.status == "holds"
    assert "stored multiplier 1.3" in verdict.reason and "ratio of medians 390.0/300.0" in verdict.reason


def test_ratio_of_medians_backs_more_decimals_than_the_stored_multiplier(ledgers):
    verdict = check(ledgers, "reference-b200-nvfp4-gptq dflash2 free-form:-:64 multiplier = 0.258")
    assert verdict.status == "holds"
    assert verdict.reason.startswith("holds: ratio of medians 595/2306")
    assert "stored multiplier 0.26 has only 2 decimals" in verdict.reason


def test_wrong_value_fails(ledgers):
    verdict = check(ledgers, "test-small eagle copy:0:4 multiplier = 1.4")
    assert verdict.status == "fails"
    assert "stated 1.4 at 1 decimal" in verdict.reason and "rounds to 1.3" in verdict.reason


@pytest.mark.parametrize(
    ("stated", "status"), [("0.3", "holds"), ("0.26", "holds"), ("0.2", "fails"), ("0.25", "fails")]
)
def test_rounding_is_taken_from_the_stated_value(ledgers, stated, status):
    claim = f"reference-b200-nvfp4-gptq dflash2 free-form:-:64 multiplier = {stated}"
    assert check(ledgers, claim).status == status


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("h200-nope eagle copy:0:1 multiplier = 1.8", "no ledger with id 'h200-nope'"),
        ("not-the-id eagle copy:0:1 multiplier = 1.8", "no ledger with id 'not-the-id'"),
        ("test-small medusa copy:0:1 multiplier = 1.8", "has no arm 'medusa'"),
        ("test-small eagle copy:0:2 multiplier = 1.8", "no point copy:0:2"),
        ("test-small eagle copy:-:1 multiplier = 1.8", "no point copy:-:1"),
        ("test-small eagle prose:0:1 multiplier = 1.8", "no points for workload 'prose'"),
        ("test-small baseline copy:0:1 multiplier = 1", "arm 'baseline' has no multiplier"),
        ("reference-b200-fp8kv dflash2 free-form:-:1 output_tokens_per_s = 1", "no output_tokens_per_s"),
    ],
)
def test_unresolved_references_say_what_is_missing(ledgers, body, reason):
    verdict = check(ledgers, body)
    assert verdict.status == "unresolved"
    assert reason in verdict.reason


def test_ledgers_are_found_by_id_not_file_name(ledgers):
    assert "test-small" in ledgers.by_id and "not-the-id" not in ledgers.by_id


def test_other_point_metrics(ledgers):
    for body in (
        "test-small eagle copy:0:1 multiplier_vs_matched = 1.89",
        "test-small eagle copy:0:1 acceptance_length = 2.5",
        "test-small eagle copy:0:1 acceptance_rate = 37.5%",
        "test-small baseline->eagle copy:0:1 output_tokens_per_s = 100 -> 180",
        "test-small eagle copy:0:1 output_tokens_per_s.max = 183.0",
        "test-small eagle copy:0:1 spread = 0.03",
        "reference-b200-workloads dflash2 copy->free-form acceptance_length = 3.1 -> 2.2",
    ):
        assert check(ledgers, body).status == "holds", body
    assert check(ledgers, "test-small eagle copy:0:1 multiplier_vs_matched = 1.8").status == "fails"


def test_kv_cache_claims(ledgers):
    assert check(ledgers, "test-small eagle kv_cache_tokens = 12,800").status == "holds"
    assert check(ledgers, "test-small eagle kv_cache_tokens = 12,801").status == "fails"
    assert check(ledgers, "test-small eagle kv_cache_change = -20%").status == "holds"
    assert check(ledgers, "reference-b200-workloads dflash2 kv_cache_change = -0.36").status == "holds"
    assert check(ledgers, "test-small matched kv_cache_tokens = 1").status == "unresolved"


def test_sessions_arrow_claim(ledgers):
    assert (
        check(ledgers, "reference-b200-workloads baseline->dflash2 ctx=262144 sessions = 6.7 -> 4.3").status == "holds"
    )
    verdict = check(ledgers, "reference-b200-workloads baseline->dflash2 ctx=262144 sessions = 6.7 -> 4.4")
    assert verdict.status == "fails"
    assert "baseline: stored sessions 6.7 rounds to 6.7" in verdict.reason and "dflash2: stated 4.4" in verdict.reason
    assert check(ledgers, "test-small baseline->eagle ctx=4000 sessions = 4.0 -> 3.2").status == "holds"
    # computed from KV tokens where the ledger lists no sessions at that context
    assert check(ledgers, "test-small eagle ctx=1600 sessions = 8").status == "holds"
    assert check(ledgers, "reference-b200-workloads dflash2 ctx=4096 sessions = 1").status == "unresolved"


def test_crossing_claims_both_ways(ledgers):
    # eagle on copy: 1.8 at c=1, 1.3 at c=4, 0.8 at c=16 -> crosses between 4 and 16
    assert check(ledgers, "test-small eagle copy:0 critical_concurrency = 4..16").status == "holds"
    assert check(ledgers, "test-small eagle copy:0 critical_concurrency = 1..4").status == "fails"
    assert check(ledgers, "test-small eagle copy:0 critical_concurrency = no-crossing").status == "fails"
    assert check(ledgers, "reference-b200-int4 dflash2 free-form critical_concurrency = 4.76 in 4..8").status == "holds"
    assert check(ledgers, "reference-b200-int4 dflash2 free-form critical_concurrency = 4.8").status == "holds"
    assert check(ledgers, "reference-b200-int4 dflash2 free-form critical_concurrency = 4.7").status == "fails"
    assert check(ledgers, "reference-b200-fp8kv dflash2 free-form critical_concurrency = no-crossing").status == "holds"
    assert check(ledgers, "reference-b200-fp8kv dflash2 free-form critical_concurrency = stays-above").status == "holds"
    assert (
        check(ledgers, "reference-b200-fp8kv dflash2 free-form critical_concurrency = starts-below").status == "fails"
    )
    assert check(ledgers, "reference-b200-fp8kv dflash2 free-form critical_concurrency = 4..8").status == "fails"
    assert check(ledgers, "test-small eagle copy critical_concurrency = 4..16").status == "unresolved"


def test_every_metric_is_documented():
    readme = (ROOT / "reports" / "README.md").read_text()
    assert all(f"`{m}`" in readme for m in METRICS if "." not in m)


# -- the unaudited-number scanner -------------------------------------------------------------


def test_unaudited_numbers_are_found_and_code_is_skipped():
    text = "\n".join(
        [
            "A drafter gives 1.4x, and 2,306 tok/s drop to 595 tokens/s.",
            "```",
            "3.0x and 88.7 tok/s in a code block",
            "```",
            "Also 0.3× here, 7 x 2 is not one, nor 0x1F, nor 2x2.",
        ]
    )
    numbers = [(n.line, n.text, n.audited) for n in scan_markdown(text, "r.md").numbers]
    assert numbers == [
        (1, "1.4x", False),
        (1, "2,306 tok/s", False),
        (1, "595 tokens/s", False),
        (5, "0.3×", False),
    ]


def test_a_claim_on_the_line_audits_the_number_it_states():
    text = (
        "2,306 -> 595 tok/s, 0.3x "
        "<!-- claim: l dflash2 free-form:-:64 multiplier = 0.3 --> "
        "<!-- claim: l baseline->dflash2 free-form:-:64 output_tokens_per_s = 2,306 -> 595 -->\n"
        "0.26x <!-- claim: l dflash2 free-form:-:64 multiplier = 0.3 -->\n"
        "1.4x <!-- claim: l dflash2 free-form:-:1 acceptance_length = 1.4 -->\n"
    )
    numbers = [(n.line, n.text, n.audited) for n in scan_markdown(text, "r.md").numbers]
    # the visible 0.26 is not what the claim states; a non-multiplier claim vouches for no "x"
    assert numbers == [(1, "595 tok/s", True), (1, "0.3x", True), (2, "0.26x", False), (3, "1.4x", False)]


def test_a_shown_number_that_differs_from_its_claim_fails_without_strict(ledger_dir, tmp_path, capsys):
    report = tmp_path / "r.md"
    report.write_text(
        "eagle is 1.4x at c=1 <!-- claim: test-small eagle copy:0:1 multiplier = 1.8 -->\n"
        "1.8x here, 1.4x elsewhere <!-- claim: test-small eagle copy:0:1 multiplier = 1.8 -->\n"
    )
    assert main(["audit-report", str(report), "--ledgers", str(ledger_dir)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2] == (  # after the two verdicts (both claims hold against the ledger)
        f"{report}:1: error: shown number '1.4x' differs from its claim (the claim on its line states 1.8)"
    )
    # two numbers, one claim: which one the claim is about is not known, so 1.4x is only unaudited
    assert out[3] == f"{report}:2: warning: unaudited number '1.4x' (no claim on its line states 1.4)"
    report.write_text(report.read_text().splitlines(keepends=True)[1])
    assert main(["audit-report", str(report), "--ledgers", str(ledger_dir)]) == 0


# -- the command ------------------------------------------------------------------------------


def test_audit_report_command(ledger_dir, tmp_path, capsys):
    report = tmp_path / "r.md"
    report.write_text(
        "# r\n"
        "eagle is 1.8x at c=1 <!-- claim: test-small eagle copy:0:1 multiplier = 1.8 -->\n"
        "and 0.8x at 16, unmarked\n"
    )
    assert main(["audit-report", str(report), "--ledgers", str(ledger_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{report}:2: claim 'test-small eagle copy:0:1 multiplier = 1.8': holds")
    assert out[1] == f"{report}:3: warning: unaudited number '0.8x' (no claim on its line states 0.8)"
    assert out[-1] == "1 claims: 1 hold, 0 fail, 0 unresolved; 1 unaudited numbers"
    assert main(["audit-report", str(report), "--ledgers", str(ledger_dir), "--strict"]) == 1


def test_audit_report_fails_on_a_wrong_or_unresolved_claim(ledger_dir, tmp_path, capsys):
    report = tmp_path / "r.md"
    report.write_text(
        "1.9x <!-- claim: test-small eagle copy:0:1 multiplier = 1.9 -->\n"
        "1.8x <!-- claim: test-small eagle copy:0:8 multiplier = 1.8 -->\n"
        "1.8x <!-- claim: test-small eagle copy:0:1 multiplier = 1.8 -->\n"
    )
    assert main(["audit-report", "-q", str(report), "--ledgers", str(ledger_dir)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{report}:1: claim 'test-small eagle copy:0:1 multiplier = 1.9': fails: ")
    assert out[1].startswith(f"{report}:2: claim 'test-small eagle copy:0:8 multiplier = 1.8': unresolved: ")
    assert out[-1] == "3 claims: 1 hold, 1 fail, 1 unresolved; 0 unaudited numbers"
    assert len(out) == 3  # -q hides what holds


def test_audit_report_usage_errors(ledger_dir, tmp_path):
    assert main(["audit-report", str(tmp_path / "missing.md"), "--ledgers", str(ledger_dir)]) == 2
    report = tmp_path / "r.md"
    report.write_text("nothing\n")
    assert main(["audit-report", str(report), "--ledgers", str(tmp_path / "nope")]) == 2


def test_a_ledger_that_does_not_load_leaves_its_claims_unresolved(tmp_path):
    data = json.loads(SMALL.read_text())
    data["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(data))
    ledgers = LedgerSet.load([tmp_path])
    verdict = check(ledgers, "test-small eagle copy:0:1 multiplier = 1.8")
    assert verdict.status == "unresolved" and "does not load" in verdict.reason
    assert ledgers.problems


def test_duplicate_ledger_ids_are_unresolved(tmp_path):
    shutil.copy(SMALL, tmp_path / "a.json")
    shutil.copy(SMALL, tmp_path / "b.json")
    verdict = check(LedgerSet.load([tmp_path]), "test-small eagle copy:0:1 multiplier = 1.8")
    assert verdict.status == "unresolved" and "several files" in verdict.reason


def test_summary_line_counts(ledgers, tmp_path):
    report = tmp_path / "r.md"
    report.write_text("<!-- claim: test-small eagle copy:0:1 multiplier = 1.8 -->\n9.9x\n")
    audit = audit_report(report, ledgers)
    assert summary_line([audit, audit]) == "2 claims: 2 hold, 0 fail, 0 unresolved; 2 unaudited numbers"


def test_ci_bounds_and_means_of_v3_points_are_claims(tmp_path):
    """`.low`/`.high` check a v3 multiplier's stored 95% CI; `.mean` the mean window throughput; a
    point without a CI (older protocols) leaves the claim unresolved, not silently held."""
    from specledger.analysis.claims import LedgerSet, audit_report

    report = tmp_path / "r.md"
    report.write_text(
        "a <!-- claim: h200-smollm2-copy ngram copy:0:1 multiplier.low = 1.099 -->\n"
        "b <!-- claim: h200-smollm2-copy ngram copy:0:1 multiplier_vs_matched.high = 1.367 -->\n"
        "c <!-- claim: h200-smollm2-copy baseline copy:0:1 output_tokens_per_s.mean = 439.5 -->\n"
        "d <!-- claim: h200-smollm2-copy ngram copy:0:1 multiplier.high = 1.2 -->\n"
        "e <!-- claim: h200-smollm2-free-form-burst ngram free-form:0:1 multiplier.low = 0.2 -->\n")
    ledgers = LedgerSet.load([ROOT / "ledgers", ROOT / "tests" / "data" / "h200-smollm2-free-form-burst.json"])
    audit = audit_report(report, ledgers)
    statuses = [v.status for v in audit.verdicts]
    assert statuses == ["holds", "holds", "holds", "fails", "unresolved"], [v.reason for v in audit.verdicts]
    assert "multiplier_ci95" in audit.verdicts[4].reason


def test_a_v3_multiplier_claim_is_checked_against_the_ratio_of_means_not_of_medians():
    """Protocol v3 states the multiplier as a ratio of mean window throughputs. The claims audit used to
    divide medians there too, so a figure read off the medians held although no v3 figure backs it."""
    v3 = LedgerSet.load([ROOT / "ledgers" / "h200-smollm2-copy.json"])
    point = next(p for p in v3.get("h200-smollm2-copy").points if (p["temperature"], p["concurrency"]) == (1.0, 1))
    thr = {arm: point["arms"][arm]["output_tokens_per_s"] for arm in ("ngram", "baseline")}
    of_medians = round(thr["ngram"]["median"] / thr["baseline"]["median"], 3)
    of_means = point["arms"]["ngram"]["multiplier"]
    assert abs(of_medians - of_means) >= 0.005  # the two readings differ in the stated digits

    wrong = check(v3, f"h200-smollm2-copy ngram copy:1:1 multiplier = {of_medians:.3f}")
    assert wrong.status == "fails" and "ratio of means" in wrong.reason
    right = check(v3, f"h200-smollm2-copy ngram copy:1:1 multiplier = {of_means:.3f}")
    assert right.status == "holds" and "ratio of means" in right.reason


# -- one engine start's own figure ----------------------------------------------------------------

FP8KV = "h100-qwen2.5-coder-1.5b-fp8kv"


@pytest.fixture(scope="module")
def replicated() -> LedgerSet:
    """The H100 fp8 KV ledger: copy c=4 and 64 in three engine starts (2026-12-06 and two of 2026-12-07)."""
    return LedgerSet.load([ROOT / "ledgers" / f"{FP8KV}.json"])


def test_a_start_claim_is_that_starts_own_figure_from_its_windows(replicated):
    from specledger.ledger import figures

    ledger = replicated.get(FP8KV)
    point = ledger.find_point("copy", 0.0, 64)
    by_start = figures.figures_by_start(ledger, point, "ngram")
    assert sorted(by_start) == [0, 1, 2]
    spec, base = point["arms"]["ngram"], point["arms"]["baseline"]
    starts = figures.engine_starts(spec)
    for start in by_start:  # each start's paired ratio of means, and its mean tokens/s, from the stored repeats
        s_val = [v for v, k in zip(spec["output_tokens_per_s"]["repeats"], starts, strict=True) if k == start]
        b_val = [v for v, k in zip(base["output_tokens_per_s"]["repeats"], starts, strict=True) if k == start]
        assert by_start[start]["output_tokens_per_s"] == pytest.approx(sum(s_val) / len(s_val))
        assert by_start[start]["multiplier"] == pytest.approx(sum(s_val) / sum(b_val))
    shown = " -> ".join(f"{by_start[k]['multiplier']:.3f}" for k in (0, 1, 2))
    verdict = check(replicated, f"{FP8KV} ngram copy:0:64 start=0->1->2 multiplier = {shown}")
    assert verdict.status == "holds", verdict.reason
    wrong = check(replicated, f"{FP8KV} ngram copy:0:64 start=1 multiplier = {by_start[2]['multiplier']:.3f}")
    assert wrong.status == "fails" and "start 1's multiplier" in wrong.reason
    tps = round(by_start[1]["output_tokens_per_s"])
    assert check(replicated, f"{FP8KV} baseline copy:0:64 start=1 output_tokens_per_s = {tps:,}").status == "fails"
    base_tps = round(figures.figures_by_start(ledger, point, "baseline")[1]["output_tokens_per_s"])
    assert check(replicated, f"{FP8KV} baseline copy:0:64 start=1 output_tokens_per_s = {base_tps:,}").status \
        == "holds"


def test_a_start_the_point_does_not_have_is_unresolved_and_start_takes_only_per_start_figures(replicated):
    missing = check(replicated, f"{FP8KV} ngram copy:0:64 start=3 multiplier = 1.6")
    assert missing.status == "unresolved" and "no engine start 3 at this point (starts: 0, 1, 2)" in missing.reason
    one_start = check(replicated, f"{FP8KV} ngram free-form:0:8 start=1 multiplier = 0.4")
    assert one_start.status == "unresolved" and "(starts: 0)" in one_start.reason
    assert "start= takes one of" in malformed(f"{FP8KV} ngram copy:0:64 start=1 acceptance_length = 4.0")
    assert "takes no start=" in malformed(f"{FP8KV} ngram start=1 kv_cache_tokens = 1")
    assert "start=x" in malformed(f"{FP8KV} ngram copy:0:64 start=x multiplier = 1.6")
    assert parse(f"{FP8KV} ngram copy:0:64 start=0 multiplier = 1.652").subjects[0].start == 0


def test_a_number_shown_beside_its_start_claim_is_audited(replicated, tmp_path):
    report = tmp_path / "r.md"
    report.write_text("# r\n\nby start 1.652x, 1.681x and 1.674x "
                      f"<!-- claim: {FP8KV} ngram copy:0:64 start=0->1->2 multiplier = 1.652 -> 1.681 -> 1.674 -->\n")
    audit = audit_report(report, replicated)
    assert [v.status for v in audit.verdicts] == ["holds"] and audit.unaudited == []
    report.write_text(f"# r\n\nby start 1.652x and 1.681x <!-- claim: {FP8KV} ngram copy:0:64 multiplier = 1.669 -->\n")
    assert len(audit_report(report, replicated).unaudited) == 2  # the point's figure does not vouch for its starts


# -- how an arm's figures move with the host --------------------------------------------------------


def test_a_host_elasticity_claim_is_the_audit_findings_figure_and_its_bounds(replicated):
    from specledger.ledger import figures

    ledger = replicated.get(FP8KV)
    change, low, high = figures.host_elasticities(ledger)["baseline"]["output_tokens_per_s"].per_doubling()
    assert high < 0  # the fixture's baseline tokens/s falls with a slower host: a figure that can be stated wrong
    bounds = "output_tokens_per_s.per_host_doubling"
    for suffix, value in (("", change), (".low", low), (".high", high)):
        verdict = check(replicated, f"{FP8KV} baseline {bounds}{suffix} = {100 * value:+.1f}%")
        assert verdict.status == "holds", verdict.reason
    wrong = check(replicated, f"{FP8KV} baseline {bounds} = {100 * low:+.1f}%")
    assert wrong.status == "fails" and "change per doubled host slice" in wrong.reason


def test_a_host_elasticity_claim_names_an_arm_only_and_is_unresolved_without_replicated_starts(replicated, ledgers):
    assert "figure of the arm" in malformed(f"{FP8KV} ngram copy:0:64 multiplier.per_host_doubling = -5%")
    assert "takes no start=" in malformed(f"{FP8KV} ngram start=1 multiplier.per_host_doubling = -5%")
    assert "unknown metric" in malformed(f"{FP8KV} ngram acceptance_length.per_host_doubling = -5%")
    missing = check(ledgers, "test-small eagle multiplier.per_host_doubling = -5%")
    assert missing.status == "unresolved" and "no host elasticity of multiplier" in missing.reason
    assert check(replicated, f"{FP8KV} nope multiplier.per_host_doubling = -5%").status == "unresolved"
