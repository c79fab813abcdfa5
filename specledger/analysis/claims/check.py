"""Claims against ledgers: the ledger set a report points into, one claim's verdict from every source the
ledger has for its figure (stored value, ratio of medians or means, counters), and a whole report's audit."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specledger.analysis import theory
from specledger.analysis.claims.grammar import (
    ARM_METRICS,
    CI_BOUNDS,
    CRITICAL,
    HOST_METRICS,
    Claim,
    Stated,
    Status,
    Subject,
    UnitNumber,
    Verdict,
)
from specledger.analysis.claims.scan import scan_markdown
from specledger.errors import SpecledgerError
from specledger.ledger import Ledger, LedgerError, figures, iter_ledger_paths, load_ledger
from specledger.ledger.figures import decimals_of, decimals_word, rounds_to
from specledger.ledger.model import Problem
from specledger.ledger.safe_read import load_json_safely, read_text_safely
from specledger.ledger.selection import point_label


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
        have = [point_label((s.workload, t, c)) for t, c in keys]
        raise Unresolved(
            f"ledger {ledger.id!r} has no point {point_label((s.workload, s.temperature, s.concurrency))} "
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
    if s.start is not None:
        return _start_sources(ledger, point, metric, s)
    rounding = ledger.rounding_for(point)
    tps = rounding["output_tokens_per_s"]
    acc = result.get("acceptance") or {}
    figure, _, bound = metric.partition(".")
    if figure in ("multiplier", "multiplier_vs_matched") and bound in CI_BOUNDS:
        ci = result.get(f"{figure}_ci95")
        if not ci:
            raise Unresolved(f"arm {s.arm!r} states no {figure}_ci95 at this point (a protocol-v3 figure)")
        return _stored(f"stored {figure}_ci95 {bound}", ci[CI_BOUNDS[bound]], rounding["multiplier"])
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


def _start_sources(ledger: Ledger, point: dict[str, Any], metric: str, s: Subject) -> list[_Source]:
    """One engine start's own figure, from its windows' repeats as the ledger keeps them (no stored figure to round:
    the value is exact, and the stated decimals are checked against it)."""
    by_start = figures.figures_by_start(ledger, point, s.arm)
    if s.start not in by_start:
        have = ", ".join(map(str, by_start)) or "none"
        raise Unresolved(f"arm {s.arm!r} has no engine start {s.start} at this point (starts: {have})")
    value = by_start[s.start].get(metric)
    if value is None:
        raise Unresolved(f"arm {s.arm!r} has no {metric} of its own in start {s.start}")
    return [_Source(f"start {s.start}'s {metric} {value:.4f}", value, value)]


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


def _host_sources(ledger: Ledger, metric: str, s: Subject) -> list[_Source]:
    """An arm's change per doubled host slice (or a bound of its 95% interval), exact as `specledger audit`'s
    host-sensitivity finding computes it: the stated decimals are checked against it."""
    _arm(ledger, s.arm)
    figure, _, rest = metric.partition(".per_host_doubling")
    elasticity = figures.host_elasticities(ledger).get(s.arm, {}).get(figure)
    if elasticity is None:
        raise Unresolved(f"arm {s.arm!r} has no host elasticity of {figure} (it needs v3 points of two or more "
                         "engine starts whose host slices differ, and a degree of freedom left)")
    which = {"": 0, ".low": 1, ".high": 2}[rest]
    value = elasticity.per_doubling()[which]
    label = f"{figure}'s change per doubled host slice{' (95% CI ' + rest[1:] + ')' if rest else ''}"
    over = f"over {elasticity.starts} starts at {elasticity.points} points"
    return [_Source(f"{label} {value:+.4f} {over}", value, value)]


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
            f"ledger {ledger.id!r} has no multipliers of arm {s.arm!r} for {s.workload}:{_null(s.temperature)} "
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
            elif claim.metric in HOST_METRICS:
                sources = _host_sources(ledger, claim.metric, subject)
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
    if len({s.arm for s in subjects}) > 1:
        return f"{subject.arm}: "
    if len({(s.workload, s.temperature, s.concurrency) for s in subjects}) > 1:
        return f"{point_label((subject.workload, subject.temperature, subject.concurrency))}: "
    if len({s.context for s in subjects}) > 1:
        return f"ctx={_null(subject.context)}: "
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
