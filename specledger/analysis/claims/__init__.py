"""Numeric claims in Markdown reports, checked against the ledgers they quote.

A report sells numbers ("1.4x at one user", "0.3x at 64"). Each one gets a claim mark that says
which ledger figure it is, so CI re-derives it from the ledger instead of trusting the prose.
The mark is an HTML comment on the same line, invisible when GitHub renders the Markdown:

    ngram reached 1.18x <!-- claim: h200-smollm2-copy ngram copy:0:1 multiplier = 1.18 -->

Grammar (one comment, on one line):

    claim: LEDGER ARM [WORKLOAD[:T[:C]]] [ctx=n] [start=n] METRIC = VALUE

LEDGER is a ledger `id` (not a file name). The point is written as everywhere else in specledger
(`--ledger-points`, test ids, progress lines): `copy:0:16`. T and C left out, or written `-`, mean
the point whose field is null (reference ledgers often publish no temperature or concurrency:
`copy:-:8`). The keyed `copy T=0 c=16` of reports written before this grammar still parses. One slot
may list several values joined by `->` (`baseline->dflash2`, `copy:0:1->64`); VALUE then lists as
many numbers (`6.7 -> 4.3`). A value is checked at the decimals it is written with ("0.3": 1;
"-36%" is -0.36 at 2), against every source the ledger has for it (stored figure, ratio of
medians, counters): it holds when one of them rounds to it, and the verdict says which.
`start=N` takes one engine start's own multiplier, multiplier_vs_matched or output_tokens_per_s (the
mean of its windows) at a point measured in several, numbered as `specledger show`'s engine-starts
table numbers them (`start=0->1->2` with `1.652 -> 1.681 -> 1.674`).
`critical_concurrency` takes `4..8` (crosses 1.0 between), `4.76`, `4.76 in 4..8`,
`no-crossing`, `stays-above` or `starts-below`.

Numbers written with a multiplier unit (`1.4x`, `0.3×`) or a tokens/s unit (`2,306 tok/s`)
count as audited only when a claim on their line states that same number for a multiplier or
tokens/s metric; the rest are listed as unaudited. When the claims on the line state as many such
values as the line shows numbers of that unit, a shown number that is not one of them contradicts
its claim: that is an error (the run fails), not an unaudited number. Fenced code, inline code and other HTML
comments are not read at all, so documentation can show the syntax. No vLLM here.
"""

from __future__ import annotations

from specledger.analysis.claims.check import LedgerSet, ReportAudit, audit_report, check_claim, summary_line
from specledger.analysis.claims.grammar import (
    METRICS,
    Claim,
    CrossingStatement,
    Malformed,
    Stated,
    Subject,
    UnitNumber,
    Verdict,
    parse_claim,
)
from specledger.analysis.claims.scan import scan_markdown

__all__ = [
    "METRICS",
    "Claim",
    "CrossingStatement",
    "LedgerSet",
    "Malformed",
    "ReportAudit",
    "Stated",
    "Subject",
    "UnitNumber",
    "Verdict",
    "audit_report",
    "check_claim",
    "parse_claim",
    "scan_markdown",
    "summary_line",
]
