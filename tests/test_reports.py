"""CI audits this project's own reports: every marked claim must hold against the committed ledgers."""

from __future__ import annotations

import re

from repo_paths import ROOT

from specledger.cli import main

REPORTS = sorted((ROOT / "reports").glob("*.md"))
SUMMARY = re.compile(r"^(\d+) claims: (\d+) hold, (\d+) fail, (\d+) unresolved; (\d+) unaudited numbers$")


def test_reports_hold_against_the_ledgers(capsys):
    assert REPORTS, "no reports/*.md to audit"
    # The burst-protocol figures are test data now; findings.md still quotes them, audited.
    bursts = [str(ROOT / "tests" / "data" / f"h200-smollm2-{workload}-burst.json")
              for workload in ("copy", "free-form")]
    code = main(["audit-report", *map(str, REPORTS), "--ledgers", str(ROOT / "ledgers"),
                 *(arg for burst in bursts for arg in ("--ledgers", burst)), "--strict"])
    out = capsys.readouterr().out
    problems = [line for line in out.splitlines() if ": holds" not in line and not SUMMARY.match(line)]
    assert code == 0, "\n".join(problems)
    summary = SUMMARY.match(out.splitlines()[-1])
    assert summary, out[-500:]
    claims, holds, fails, unresolved, unaudited = map(int, summary.groups())
    assert claims >= 10 and holds == claims
    assert (fails, unresolved, unaudited) == (0, 0, 0)
