"""Numeric claims in Markdown reports, checked against the ledgers they quote.

A report sells numbers ("1.4x at one user", "0.3x at 64"). Each one gets a claim mark that says
which ledger figure it is, so CI re-derives it from the ledger instead of trusting the prose.
The mark is an HTML comment on the same line, invisible when GitHub renders the Markdown:

    ngram reached 1.18x <!-- claim: h200-smollm2-copy ngram copy T=0 c=1 multiplier = 1.18 -->

Grammar (one comment, on one line):

    claim: LEDGER ARM [WORKLOAD] [T=t] [c=n] [ctx=n] METRIC = VALUE

LEDGER is a ledger `id` (not a file name). T and c left out, or written `-`, mean the point
whose field is null (reference ledgers often publish no temperature or concurrency). One slot
may list several values joined by `->` (`baseline->dflash2`, `c=1->64`); VALUE then lists as
many numbers (`6.7 -> 4.3`). A value is checked at the decimals it is written with ("0.3": 1;
"-36%" is -0.36 at 2), against every source the ledger has for it (stored figure, ratio of
medians, counters): it holds when one of them rounds to it, and the verdict says which.
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

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specledger.analysis import theory
from specledger.errors import SpecledgerError
from specledger.ledger import Ledger, LedgerError, figures, iter_ledger_paths, load_ledger
from specledger.ledger.figures import decimals_of, decimals_word, rounds_to
from specledger.ledger.model import Problem
from specledger.ledger.safe_read import load_json_safely, read_text_safely

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

#: Figures of one arm at one point (workload, temperature, concurrency).
POINT_METRICS = (
    "multiplier",
    "multiplier.low",
    "multiplier.high",
    "multiplier_vs_matched",
    "multiplier_vs_matched.low",
    "multiplier_vs_matched.high",
    "acceptance_length",
    "acceptance_rate",
    "output_tokens_per_s",
    "output_tokens_per_s.mean",
    "output_tokens_per_s.min",
    "output_tokens_per_s.max",
    "spread",
)
#: `.low`/`.high` of a multiplier: the bounds of its stored 95% CI (protocol v3 points).
_CI_BOUNDS = {"low": 0, "high": 1}
#: Figures of one arm as a whole (its KV cache); `sessions` also needs ctx=.
ARM_METRICS = ("kv_cache_tokens", "kv_cache_change", "sessions")
CRITICAL = "critical_concurrency"
METRICS = (*POINT_METRICS, *ARM_METRICS, CRITICAL)
#: Which claims can vouch for a visible number with this unit.
UNIT_METRICS: dict[str, tuple[str, ...]] = {
    "x": ("multiplier", "multiplier.low", "multiplier.high", "multiplier_vs_matched", "multiplier_vs_matched.low",
          "multiplier_vs_matched.high"),
    "tok/s": ("output_tokens_per_s", "output_tokens_per_s.mean", "output_tokens_per_s.min", "output_tokens_per_s.max"),
}
CROSSING_WORDS = ("no-crossing", "stays-above", "starts-below")

Status = Literal["holds", "fails", "unresolved"]
CrossingKind = Literal["crosses", "no-crossing", "stays-above", "starts-below"]


# --------------------------------------------------------------------------------------------
# what a claim says
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stated:
    """A number as the report writes it; its decimals are the rounding it claims."""

    text: str
    value: float
    decimals: int

    @property
    def plain(self) -> str:
        """The digits without thousands separators: how a visible number is matched to its claim."""
        return self.text.replace(",", "").lstrip("+")


@dataclass(frozen=True)
class Subject:
    """What one stated value is about: an arm, and the point or context it is taken at."""

    arm: str
    workload: str | None = None
    temperature: float | None = None
    concurrency: int | None = None
    context: int | None = None


@dataclass(frozen=True)
class CrossingStatement:
    """A claim about where the multiplier curve first falls below 1.0 (or that it does not)."""

    kind: CrossingKind
    value: Stated | None = None
    between: tuple[int, int] | None = None


@dataclass(frozen=True)
class Claim:
    """One parsed claim mark: `subjects` and `values` pair up (several only with an arrow)."""

    file: str
    line: int
    text: str
    ledger: str
    metric: str
    subjects: tuple[Subject, ...]
    values: tuple[Stated, ...] = ()
    crossing: CrossingStatement | None = None


@dataclass(frozen=True)
class Malformed:
    """A claim mark that does not parse; it fails the audit like an unresolved reference."""

    file: str
    line: int
    text: str
    reason: str


@dataclass(frozen=True)
class UnitNumber:
    """A visible number with a multiplier or tokens/s unit, and whether a claim vouches for it."""

    file: str
    line: int
    text: str
    number: str
    unit: str
    audited: bool
    #: The values the line's claims state instead, when they are as many as the line shows numbers of
    #: this unit: then this number is not merely unclaimed but contradicts its claim (an error).
    claimed: tuple[str, ...] = ()

    @property
    def mismatch(self) -> bool:
        return not self.audited and bool(self.claimed)

    def __str__(self) -> str:
        if self.mismatch:
            where = f"{self.file}:{self.line}: error: shown number '{self.text}' differs from its claim"
            return f"{where} (the claim on its line states {', '.join(self.claimed)})"
        where = f"{self.file}:{self.line}: warning: unaudited number"
        return f"{where} '{self.text}' (no claim on its line states {self.number})"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one claim; `reason` starts with the status word."""

    file: str
    line: int
    text: str
    status: Status
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: claim '{self.text}': {self.reason}"


# --------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_STATED = re.compile(rf"^[+-]?(?:{_NUMBER})%?$")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
_KEYS = ("T", "c", "ctx")


class _Syntax(ValueError):
    """A claim mark that does not follow the grammar."""


def _stated(text: str) -> Stated:
    """A stated number; a percentage is a fraction with two more decimals ("-36%" is -0.36 at 2)."""
    if not _STATED.match(text):
        raise _Syntax(f"value {text!r} is not a number (write e.g. 1.16, 0.3, 2,306 or -36%)")
    plain = text.replace(",", "")
    if plain.endswith("%"):
        digits = plain[:-1]
        return Stated(text, float(digits) / 100, len(digits.partition(".")[2]) + 2)
    return Stated(text, float(plain), len(plain.partition(".")[2]))


def _temperature(text: str) -> float | None:
    if text == "-":
        return None
    try:
        return float(text)
    except ValueError:
        raise _Syntax(f"T={text}: a temperature is a number or '-'") from None


def _whole(key: str, text: str, allow_null: bool) -> int | None:
    if allow_null and text == "-":
        return None
    if not text.isdigit() or int(text) < 1:
        raise _Syntax(f"{key}={text}: expected a positive whole number" + (" or '-'" if allow_null else ""))
    return int(text)


def _crossing(rhs: str) -> CrossingStatement:
    if rhs in CROSSING_WORDS:
        return CrossingStatement(rhs)  # type: ignore[arg-type]
    value_text, _, range_text = rhs.partition(" in ") if " in " in rhs else ("", "", rhs)
    if not value_text and not _RANGE.match(range_text):
        value_text, range_text = rhs, ""
    between = None
    if range_text:
        m = _RANGE.match(range_text.strip())
        if not m:
            raise _Syntax(f"{range_text.strip()!r} is not a concurrency range like 4..8")
        between = (int(m.group(1)), int(m.group(2)))
    try:
        value = _stated(value_text.strip()) if value_text else None
    except _Syntax:
        raise _Syntax(
            f"{rhs!r}: expected 4..8, 4.76, 4.76 in 4..8, {', '.join(CROSSING_WORDS[:-1])} or {CROSSING_WORDS[-1]}"
        ) from None
    return CrossingStatement("crosses", value, between)


def _slots(selectors: Sequence[str]) -> tuple[list[list[str]], dict[str, list[str]]]:
    """Positional selectors (arm, workload) and keyed ones (T=, c=, ctx=), each split on '->'."""
    positional: list[list[str]] = []
    keyed: dict[str, list[str]] = {}
    for token in selectors:
        key, sep, value = token.partition("=")
        if sep:
            if key not in _KEYS:
                raise _Syntax(f"unknown selector {token!r} (known: T=, c=, ctx=)")
            if key in keyed:
                raise _Syntax(f"{key}= given twice")
            keyed[key] = value.split("->")
        else:
            if len(positional) == 2:
                raise _Syntax(f"unexpected {token!r}: after the ledger come ARM, WORKLOAD, then T=, c=, ctx=")
            positional.append(token.split("->"))
    if any("" in values for values in [*positional, *keyed.values()]):
        raise _Syntax("an empty name or value around '->'")
    return positional, keyed


def _check_selectors(metric: str, positional: list[list[str]], keyed: dict[str, list[str]]) -> None:
    """Each metric kind names exactly what it needs: a point, an arm, or a curve."""
    if not positional:
        raise _Syntax("names no arm")
    if metric in ARM_METRICS:
        if len(positional) > 1 or "T" in keyed or "c" in keyed:
            raise _Syntax(f"{metric} is a figure of the arm: name no workload, T= or c=")
        if metric == "sessions" and "ctx" not in keyed:
            raise _Syntax("sessions needs ctx=CONTEXT_TOKENS")
        if metric != "sessions" and "ctx" in keyed:
            raise _Syntax(f"{metric} takes no ctx=")
        return
    if len(positional) < 2:
        raise _Syntax(f"{metric} needs a workload after the arm")
    if "ctx" in keyed:
        raise _Syntax(f"{metric} takes no ctx=")
    if metric == CRITICAL and "c" in keyed:
        raise _Syntax("critical_concurrency is over the concurrency curve: name no c=")


def parse_claim(body: str, file: str, line: int) -> Claim | Malformed:
    """Parse the text after `claim:`; a Malformed says what is wrong instead of raising."""
    text = " ".join(body.split())
    try:
        return _parse(text, file, line)
    except _Syntax as e:
        return Malformed(file, line, text, str(e))


def _parse(text: str, file: str, line: int) -> Claim:
    tokens = text.split()
    if "=" not in tokens:
        raise _Syntax("missing ' = VALUE' after the metric (with spaces around '=')")
    split = tokens.index("=")
    lhs, rhs = tokens[:split], " ".join(tokens[split + 1 :])
    if len(lhs) < 2:
        raise _Syntax("expected LEDGER ARM [WORKLOAD] [T=] [c=] [ctx=] METRIC before '='")
    ledger, *selectors, metric = lhs
    if metric not in METRICS:
        raise _Syntax(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    if not rhs:
        raise _Syntax("no value after '='")
    positional, keyed = _slots(selectors)
    _check_selectors(metric, positional, keyed)
    slots = {"arm": positional[0], "workload": positional[1] if len(positional) > 1 else [None]}
    slots["T"] = [_temperature(v) for v in keyed.get("T", ["-"])]
    slots["c"] = [_whole("c", v, True) for v in keyed.get("c", ["-"])]
    slots["ctx"] = [_whole("ctx", v, False) for v in keyed["ctx"]] if "ctx" in keyed else [None]
    varying = [name for name, values in slots.items() if len(values) > 1]
    if len(varying) > 1:
        raise _Syntax(f"'->' in more than one slot ({', '.join(varying)}); one claim varies one thing")
    n = len(slots[varying[0]]) if varying else 1
    subjects = tuple(
        Subject(*(values[i if len(values) > 1 else 0] for values in slots.values()))  # type: ignore[arg-type]
        for i in range(n)
    )
    if metric == CRITICAL:
        if n > 1 or "->" in rhs:
            raise _Syntax("a critical_concurrency claim names one curve and one statement")
        return Claim(file, line, text, ledger, metric, subjects, crossing=_crossing(rhs))
    values = tuple(_stated(v.strip()) for v in rhs.split("->"))
    if len(values) != n:
        raise _Syntax(f"{len(values)} value(s) for {n} subject(s): '->' on both sides must pair up")
    return Claim(file, line, text, ledger, metric, subjects, values)


# --------------------------------------------------------------------------------------------
# Markdown scanning
# --------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)")
_CLAIM = re.compile(r"^\s*claim:(.*)$", re.S)
_UNITS = (
    ("x", re.compile(rf"(?<![\w.,])({_NUMBER})(?:x| ?×)(?![\w])")),
    ("tok/s", re.compile(rf"(?<![\w.,])({_NUMBER}) ?(?:tok/s|tokens/s|tok/sec|tokens/sec|tokens per second)\b")),
)


@dataclass
class Scan:
    """What a Markdown file says: its claim marks (parsed or not) and its unit numbers."""

    claims: list[Claim | Malformed] = field(default_factory=list)
    numbers: list[UnitNumber] = field(default_factory=list)


def _outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for lines outside fenced code blocks, inline code blanked out."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, _INLINE_CODE.sub(lambda s: " " * len(s.group(0)), line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            fence = None


def scan_markdown(text: str, file: str) -> Scan:
    """Claims and unit numbers of a Markdown text; code and non-claim comments are skipped."""
    scan = Scan()
    in_comment = False
    for number, line in _outside_fences(text):
        visible, claims = [], []
        rest = line
        while rest:
            if in_comment:
                end = rest.find("-->")
                if end < 0:
                    break
                rest, in_comment = rest[end + 3 :], False
                continue
            start = rest.find("<!--")
            if start < 0:
                visible.append(rest)
                break
            visible.append(rest[:start])
            rest = rest[start + 4 :]
            end = rest.find("-->")
            body = rest if end < 0 else rest[:end]
            claim = _CLAIM.match(body)
            if claim and end < 0:
                text = " ".join(claim.group(1).split())
                claims.append(Malformed(file, number, text, "claim comment must close on its line"))
            elif claim:
                claims.append(parse_claim(claim.group(1), file, number))
            if end < 0:
                in_comment = True
                break
            rest = rest[end + 3 :]
        scan.claims.extend(claims)
        shown = " ".join(visible)
        found = sorted(
            ((m.start(), unit, m) for unit, pattern in _UNITS for m in pattern.finditer(shown)), key=lambda f: f[0]
        )
        for _, unit, m in found:
            digits = m.group(1).replace(",", "")
            stated = [v for c in claims if isinstance(c, Claim) and c.metric in UNIT_METRICS[unit] for v in c.values]
            audited = any(v.plain == digits for v in stated)
            # as many claimed values as shown numbers of the unit: each shown one should be among them
            shown = sum(u == unit for _, u, _ in found)
            claimed = tuple(v.text for v in stated) if len(stated) >= shown else ()
            scan.numbers.append(UnitNumber(file, number, m.group(0).strip(), m.group(1), unit, audited, claimed))
    return scan


# --------------------------------------------------------------------------------------------
# the ledgers claims point into
# --------------------------------------------------------------------------------------------


class Unresolved(SpecledgerError):
    """A claim names something the ledgers do not have (ledger, arm, point, figure)."""


@dataclass
class LedgerSet:
    """Ledgers by `id` (claims name ids, not files), plus what could not be loaded."""

    by_id: dict[str, Ledger] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @classmethod
    def load(cls, paths: Iterable[str | os.PathLike[str]]) -> LedgerSet:
        """Every ledger under `paths`; one that fails to load is noted, not fatal (FileNotFoundError if missing)."""
        found = cls()
        for path in iter_ledger_paths(paths):
            try:
                ledger = load_ledger(path)
            except LedgerError as e:
                found.problems.extend(e.problems)
                found.broken[_peek_id(path) or str(path)] = str(path)
                continue
            found.by_id.setdefault(ledger.id, ledger)
            found.files.setdefault(ledger.id, []).append(str(path))
        return found

    def get(self, ledger_id: str) -> Ledger:
        if ledger_id in self.files and len(self.files[ledger_id]) > 1:
            raise Unresolved(f"ledger id {ledger_id!r} is in several files: {', '.join(self.files[ledger_id])}")
        if ledger_id in self.by_id:
            return self.by_id[ledger_id]
        if ledger_id in self.broken:
            raise Unresolved(f"ledger {ledger_id!r} ({self.broken[ledger_id]}) does not load")
        raise Unresolved(f"no ledger with id {ledger_id!r} (ids: {', '.join(sorted(self.by_id)) or 'none'})")


def _peek_id(path: Path) -> str | None:
    """The `id` of a ledger that fails validation, so a claim on it can say why it is unresolved."""
    try:
        data = load_json_safely(path, "ledger", strict=False)
    except LedgerError:
        return None
    return data.get("id") if isinstance(data, dict) and isinstance(data.get("id"), str) else None


# --------------------------------------------------------------------------------------------
# checking
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """One way the ledger gives the figure: an exact value or an interval, and how many decimals it backs."""

    label: str
    lo: float
    hi: float
    decimals: int | None = None  # a stored, rounded figure cannot back a finer stated rounding


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else repr(float(x))


def _null(x: Any) -> str:
    return "-" if x is None else _fmt(x)


def _arm(ledger: Ledger, name: str) -> dict[str, Any]:
    try:
        return ledger.arm(name)
    except KeyError:
        names = ", ".join(a["name"] for a in ledger.arms)
        raise Unresolved(f"ledger {ledger.id!r} has no arm {name!r} (arms: {names})") from None


def _point(ledger: Ledger, s: Subject) -> dict[str, Any]:
    workloads = list(dict.fromkeys(p["workload"] for p in ledger.points))
    if s.workload not in workloads:
        have = ", ".join(workloads)
        raise Unresolved(f"ledger {ledger.id!r} has no points for workload {s.workload!r} (has: {have})")
    point = ledger.find_point(s.workload, s.temperature, s.concurrency)
    if point is None:
        keys = sorted(
            {k[1:] for k in map(Ledger.point_key, ledger.points) if k[0] == s.workload},
            key=lambda k: (k[0] is not None, k[0] or 0.0, k[1] is not None, k[1] or 0),
        )
        have = [f"T={_null(t)} c={_null(c)}" for t, c in keys]
        raise Unresolved(
            f"ledger {ledger.id!r} has no point {s.workload} T={_null(s.temperature)} c={_null(s.concurrency)} "
            f"(it has: {', '.join(have)})"
        )
    return point


def _stored(label: str, value: Any, decimals: int) -> list[_Source]:
    return [] if value is None else [_Source(f"{label} {_fmt(value)}", value, value, decimals)]


def _ratio(against: str, point: dict[str, Any], arm: str, base: str | None, tps: int) -> list[_Source]:
    """The ratio of the throughputs the multiplier divides (means for v3, medians before), as an interval
    because those throughputs are themselves rounded."""
    found = figures.multiplier_interval(point, arm, base, tps)
    if found is None:
        return []
    lo, hi, (num, den, statistic) = found
    return [_Source(f"ratio of {statistic}s{against} {_fmt(num)}/{_fmt(den)} = {num / den:.4f}", lo, hi)]


def _point_sources(ledger: Ledger, metric: str, s: Subject) -> list[_Source]:
    _arm(ledger, s.arm)
    point = _point(ledger, s)
    result = point["arms"].get(s.arm)
    if result is None:
        raise Unresolved(f"the point has no result for arm {s.arm!r}")
    rounding = ledger.rounding_for(point)
    tps = rounding["output_tokens_per_s"]
    acc = result.get("acceptance") or {}
    figure, _, bound = metric.partition(".")
    if figure in ("multiplier", "multiplier_vs_matched") and bound in _CI_BOUNDS:
        ci = result.get(f"{figure}_ci95")
        if not ci:
            raise Unresolved(f"arm {s.arm!r} states no {figure}_ci95 at this point (a protocol-v3 figure)")
        return _stored(f"stored {figure}_ci95 {bound}", ci[_CI_BOUNDS[bound]], rounding["multiplier"])
    if metric == "multiplier":
        return _stored("stored multiplier", result.get("multiplier"), rounding["multiplier"]) + _ratio(
            "", point, s.arm, ledger.baseline_arm_for(s.arm), tps
        )
    if metric == "multiplier_vs_matched":
        return _stored("stored multiplier_vs_matched", result.get("multiplier_vs_matched"), rounding["multiplier"]) + (
            _ratio(" vs matched", point, s.arm, ledger.matched_baseline_for(s.arm), tps)
        )
    thr = result.get("output_tokens_per_s") or {}
    if metric.startswith("output_tokens_per_s"):
        statistic = metric.partition(".")[2] or "median"
        return _stored(statistic, thr.get(statistic), tps)
    if metric == "spread":
        low, high, median = thr.get("min"), thr.get("max"), thr.get("median")
        if low is None or high is None or not median:
            return []
        exact = (high - low) / median
        return [
            _Source(f"(max - min)/median = ({_fmt(high)} - {_fmt(low)})/{_fmt(median)} = {exact:.4f}", exact, exact)
        ]
    if metric == "acceptance_length":
        sources = _stored("stored acceptance length", acc.get("acceptance_length"), rounding["acceptance_length"])
        if acc.get("drafts") and acc.get("accepted_tokens") is not None:
            exact = 1 + acc["accepted_tokens"] / acc["drafts"]
            label = f"counters 1 + {acc['accepted_tokens']}/{acc['drafts']} = {exact:.4f}"
            sources.append(_Source(label, exact, exact))
        return sources
    sources = _stored("stored acceptance rate", acc.get("acceptance_rate"), rounding["acceptance_rate"])
    if acc.get("draft_tokens") and acc.get("accepted_tokens") is not None:
        exact = acc["accepted_tokens"] / acc["draft_tokens"]
        sources.append(_Source(f"counters {acc['accepted_tokens']}/{acc['draft_tokens']} = {exact:.4f}", exact, exact))
    return sources


def _arm_sources(ledger: Ledger, metric: str, s: Subject) -> list[_Source]:
    arm = _arm(ledger, s.arm)
    kv = arm.get("kv_cache") or {}
    tokens = kv.get("tokens")
    if metric == "kv_cache_tokens":
        return _stored("KV-cache tokens", tokens, 0)
    if metric == "kv_cache_change":
        change = kv.get("change_vs_baseline")
        sources = [] if change is None else _stored("stored change_vs_baseline", change, decimals_of(change))
        base = ledger.baseline_arm_for(s.arm)
        base_tokens = (_arm(ledger, base).get("kv_cache") or {}).get("tokens") if base else None
        if tokens is not None and base_tokens:
            exact = tokens / base_tokens - 1
            sources.append(_Source(f"tokens {tokens}/{base_tokens} - 1 = {exact:.4f}", exact, exact))
        return sources
    assert s.context is not None
    entry = next((e for e in arm.get("sessions") or [] if e["context_tokens"] == s.context), None)
    sources = [] if entry is None else _stored("stored sessions", entry["sessions"], ledger.rounding["sessions"])
    if tokens is not None:
        exact = theory.sessions(tokens, s.context)
        sources.append(_Source(f"KV tokens {tokens}/{s.context} = {exact:.3f}", exact, exact))
    return sources


def _judge(stated: Stated, sources: Sequence[_Source]) -> tuple[bool, str]:
    """Holds when some source rounds to the stated value at its decimals; the text says which."""
    matched, missed = [], []
    for source in sources:
        if source.decimals is not None and stated.decimals > source.decimals:
            missed.append(f"{source.label} has only {decimals_word(source.decimals)}")
        elif rounds_to(stated.value, source.lo, source.hi, stated.decimals):
            matched.append(source.label)
        else:
            missed.append(f"{source.label} rounds to {(source.lo + source.hi) / 2:.{stated.decimals}f}")
    at = decimals_word(stated.decimals)
    if matched:
        verb = "rounds" if len(matched) == 1 else "round"
        others = f" ({'; '.join(missed)})" if missed else ""
        return True, f"{' and '.join(matched)} {verb} to {stated.text} at {at}{others}"
    return False, f"stated {stated.text} at {at}, but {' and '.join(missed)}"


def _judge_crossing(ledger: Ledger, claim: Claim) -> tuple[bool, str]:
    s, statement = claim.subjects[0], claim.crossing
    assert statement is not None
    _arm(ledger, s.arm)
    curve = sorted(
        (p["concurrency"], m)
        for p in ledger.points
        if Ledger.point_key(p)[:2] == (s.workload, s.temperature)
        and p["concurrency"] is not None
        and (m := figures.multiplier(ledger, p, s.arm)) is not None
    )
    if not curve:
        raise Unresolved(
            f"ledger {ledger.id!r} has no multipliers of arm {s.arm!r} for {s.workload} T={_null(s.temperature)} "
            "at a known concurrency"
        )
    crossing = theory.critical_concurrency([c for c, _ in curve], [m for _, m in curve])
    said = f"the points say {crossing.describe()}"
    if statement.kind == "no-crossing":
        return crossing.kind != "crosses", said
    if statement.kind != "crosses":
        return crossing.kind == statement.kind, said
    if crossing.kind != "crosses":
        return False, said
    assert crossing.value is not None
    holds = statement.between is None or statement.between == crossing.between
    if statement.value is not None:
        v = statement.value
        holds = holds and rounds_to(v.value, crossing.value, crossing.value, v.decimals)
        said += f"; {crossing.value:.4f} rounds to {crossing.value:.{v.decimals}f}"
    return holds, said


def check_claim(claim: Claim, ledgers: LedgerSet) -> Verdict:
    """Resolve a claim against the ledgers and check each stated value at its own rounding."""

    def verdict(status: Status, reason: str) -> Verdict:
        return Verdict(claim.file, claim.line, claim.text, status, f"{status}: {reason}")

    try:
        ledger = ledgers.get(claim.ledger)
        if claim.metric == CRITICAL:
            holds, why = _judge_crossing(ledger, claim)
            return verdict("holds" if holds else "fails", why)
        parts = []
        for subject, stated in zip(claim.subjects, claim.values, strict=True):
            if claim.metric in ARM_METRICS:
                sources = _arm_sources(ledger, claim.metric, subject)
            else:
                sources = _point_sources(ledger, claim.metric, subject)
            if not sources:
                raise Unresolved(f"arm {subject.arm!r} has no {claim.metric} there")
            ok, why = _judge(stated, sources)
            parts.append((ok, f"{_label(claim.subjects, subject)}{why}"))
    except Unresolved as e:
        return verdict("unresolved", str(e))
    holds = all(ok for ok, _ in parts)
    return verdict("holds" if holds else "fails", "; ".join(why for _, why in parts))


def _label(subjects: Sequence[Subject], subject: Subject) -> str:
    """'baseline: ' for the arrow slot of a claim about several subjects; '' for one subject."""
    if len(subjects) == 1:
        return ""
    names = ("arm", "workload", "temperature", "concurrency", "context")
    keys = ("", "", "T=", "c=", "ctx=")
    for name, key in zip(names, keys, strict=True):
        if len({getattr(s, name) for s in subjects}) > 1:
            value = getattr(subject, name)
            return f"{key}{value if isinstance(value, str) else _null(value)}: "
    return ""


# --------------------------------------------------------------------------------------------
# whole reports
# --------------------------------------------------------------------------------------------


@dataclass
class ReportAudit:
    """Every claim verdict of one report, and its unit numbers that no claim vouches for."""

    file: str
    verdicts: list[Verdict]
    unaudited: list[UnitNumber]

    def count(self, status: Status) -> int:
        return sum(v.status == status for v in self.verdicts)


def audit_report(path: str | os.PathLike[str], ledgers: LedgerSet) -> ReportAudit:
    """Check every claim in one Markdown file; malformed marks count as unresolved.

    LedgerError (naming the file) when the report cannot be read: not a regular file, too large, not UTF-8.
    """
    file = str(path)
    scan = scan_markdown(read_text_safely(path, "report", where=""), file)
    verdicts = [
        check_claim(c, ledgers)
        if isinstance(c, Claim)
        else Verdict(c.file, c.line, c.text, "unresolved", f"unresolved: malformed claim: {c.reason}")
        for c in scan.claims
    ]
    return ReportAudit(file, verdicts, [n for n in scan.numbers if not n.audited])


def summary_line(audits: Sequence[ReportAudit]) -> str:
    """`N claims: N hold, N fail, N unresolved; N unaudited numbers`."""
    total = sum(len(a.verdicts) for a in audits)
    holds, fails, unresolved = (sum(a.count(s) for a in audits) for s in ("holds", "fails", "unresolved"))
    unaudited = sum(len(a.unaudited) for a in audits)
    return f"{total} claims: {holds} hold, {fails} fail, {unresolved} unresolved; {unaudited} unaudited numbers"
