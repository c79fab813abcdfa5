"""Verify a fresh measurement against a committed point: pure, so it is unit-tested without engines.

Speed figures (multiplier, an arm's tokens/s) get a three-way verdict from ``specledger.stats``,
as Criterion.rs decides regressions: the 95% CI of the change against the committed figure
lies inside the tolerance band (holds), wholly outside it (changed: the test fails and names
the direction), or across its edge (inconclusive: more repeats first, then a distinct outcome).
They are comparable only where the machine fingerprint and the protocol version match the
recording's; elsewhere they are shown, never asserted. Acceptance length is asserted everywhere,
absolutely (tokens per step), where both figures count the same tokens: from an acceptance pass
(every prompt once, to its end) it does not depend on speed, and at T=0 is nearly deterministic.
From windows (ledgers recorded before the pass) it covers what each window's time allowed, so it
is shown, not asserted; a point where no drafts were counted fails either way.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specledger import stats
from specledger.ledger import Ledger, figures
from specledger.ledger.model import LEGACY_ACCEPTANCE


@dataclass(frozen=True)
class Check:
    """An exact bar (acceptance length, the policy bar): inside [low, high] or not."""

    metric: str
    committed: float
    measured: float
    low: float
    high: float
    tolerance: str
    reference: str = "committed"

    @property
    def ok(self) -> bool:
        return self.low <= self.measured <= self.high

    def line(self) -> str:
        verdict = "ok" if self.ok else "OUT OF TOLERANCE"
        return (f"{self.metric}: measured {self.measured:.3f}, {self.reference} {self.committed:.3f} "
                f"(tolerance {self.tolerance}: {self.low:.3f}..{self.high:.3f}) {verdict}")


@dataclass(frozen=True)
class FigureVerdict:
    """A speed figure's verdict: fresh and committed estimates, and the verdict on their change."""

    metric: str
    fresh: stats.Estimate
    committed: stats.Estimate
    verdict: stats.Verdict

    def line(self) -> str:
        return (f"{self.metric}: fresh {self.fresh.value:.3f} ({self.fresh.low:.3f}..{self.fresh.high:.3f}), "
                f"committed {self.committed.value:.3f} ({self.committed.low:.3f}..{self.committed.high:.3f}); "
                f"{self.verdict.line()}")


@dataclass
class Comparison:
    checks: list[Check] = field(default_factory=list)
    figures: list[FigureVerdict] = field(default_factory=list)
    not_comparable: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """failed (an exact bar missed), changed, inconclusive, not comparable, or holds."""
        if not all(c.ok for c in self.checks):
            return "failed"
        if self.not_comparable is None:
            outcomes = {f.verdict.outcome for f in self.figures}
            if "changed" in outcomes:
                return "changed"
            if "inconclusive" in outcomes:
                return "inconclusive"
            return "holds"
        return "not comparable"

    @property
    def ok(self) -> bool:
        """Nothing that is asserted failed (inconclusive and not comparable are not failures by default)."""
        return self.outcome not in ("failed", "changed")

    @property
    def repeats_needed(self) -> int | None:
        """Fresh repeats that would settle every inconclusive figure; None where none is inconclusive, or where
        one of them no number of repeats can settle (``settled_by_repeats``): the most the others need would then
        promise what it cannot (2026-12-07, fp8 copy c=8: "105" beside a multiplier that repeats cannot settle)."""
        if not self.settled_by_repeats:
            return None
        needs = [f.verdict.repeats_needed for f in self.figures
                 if f.verdict.outcome == "inconclusive" and f.verdict.repeats_needed is not None]
        return max(needs) if needs else None

    @property
    def settled_by_repeats(self) -> bool:
        """Whether more fresh repeats could settle the inconclusive figures (True where none is inconclusive)."""
        return not any(f.verdict.outcome == "inconclusive" and f.verdict.repeats_needed is None
                       for f in self.figures)

    def figure(self, metric: str) -> FigureVerdict | None:
        return next((f for f in self.figures if f.metric == metric), None)

    def message(self, test_id: str) -> str:
        head = f"{test_id}: {self.outcome}"
        if self.not_comparable:
            head += f" (speed figures shown, not asserted: {self.not_comparable})"
        return "\n".join([head, *("  " + c.line() for c in self.checks),
                          *("  " + f.line() for f in self.figures), *("  " + n for n in self.notes)])


def _repeats(point: Mapping[str, Any], arm: str | None) -> list[float] | None:
    tps = ((point.get("arms") or {}).get(arm) or {}).get("output_tokens_per_s") or {} if arm else {}
    values = tps.get("repeats")
    return [float(v) for v in values] if values and len(values) >= 2 else None


# What a verdict between the windows of one start on each side cannot see. The figure is the H200 Qwen ledger's pooled
# between-start spread of ngram's multiplier (log sd 0.1195, 10 df); on the H100, copy:0:1 moved 12.8% between two
# leases with the same baseline (reports/evidence/2026-12-06-h100-qwen-bf16-visit3).
ONE_START_EACH = ("speed: one engine start on each side and no between-start spread in the ledger, so each interval "
                  "covers the windows of one host state; a new start can move a multiplier by more (log SD 0.11-0.12 "
                  "for ngram on the lent H100 and H200), so 'changed' may be the host: give the committed points a "
                  "second start (--ledger-add-start), or judge against a spread measured on this kind of machine "
                  "(--ledger-start-spread-from LEDGER)")


def _replicated_verdicts(ledger: Ledger, arm: str, base: str | None, committed: Mapping[str, Any],
                         measured: Mapping[str, Any]) -> list[FigureVerdict] | None:
    """The verdicts over engine starts, where one side has two or more or the ledger pools a between-start spread
    (None: neither; then the windows of the one start on each side are compared).

    Each start is one replication: the fresh starts' figures against the committed starts', Student's t with the
    variance pooled (stats.replicated_change), so a single nightly start is judged against the spread the
    committed starts showed, not against the windows of one host state. Where the ledger keeps ``start_spread``
    (pooled over its points), that spread and its degrees of freedom serve every point, one start each included."""
    tol = ledger.tolerances
    mine_f, mine_c = _repeats(measured, arm), _repeats(committed, arm)
    if not mine_f or not mine_c:
        return None
    starts_f = figures.engine_starts(measured["arms"].get(arm))
    starts_c = figures.engine_starts(committed["arms"].get(arm))
    n_f, n_c = len(set(starts_f)), len(set(starts_c))
    spread_m = figures.start_spread(ledger.data, arm, "multiplier")
    spread_t = figures.start_spread(ledger.data, arm, "output_tokens_per_s")
    if max(n_f, n_c) < 2 and spread_m is None and spread_t is None:
        return None

    def over_starts(per_start: list[float], spread: stats.StartSpread | None) -> bool:
        """Whether this side's interval is taken over engine starts (else over one start's windows)."""
        return len(per_start) >= 2 or spread is not None

    def estimate(per_start: list[float], values: list[float], base_values: list[float] | None,
                 spread: stats.StartSpread | None) -> stats.Estimate:
        if over_starts(per_start, spread):
            return stats.replicated_estimate(per_start, spread=spread)
        return stats.multiplier_estimate(values, base_values) if base_values else stats.mean_estimate(values)

    def committed_part(per_start: list[float], committed: stats.Estimate, spread: stats.StartSpread | None
                       ) -> float | None:
        """The committed starts' share of the change's width, which fresh starts do not shrink; None where the
        committed side is one start's windows (their width is not a between-start one)."""
        return committed.half_width_rel if over_starts(per_start, spread) else None

    out: list[FigureVerdict] = []
    base_f, base_c = _repeats(measured, base), _repeats(committed, base)
    if base_f and base_c and len(mine_f) == len(base_f) and len(mine_c) == len(base_c) \
            and (spread_m is not None or max(n_f, n_c) >= 2):
        per_f = stats.start_multipliers(mine_f, base_f, starts_f)
        per_c = stats.start_multipliers(mine_c, base_c, starts_c)
        committed_m = estimate(per_c, mine_c, base_c, spread_m)
        out.append(FigureVerdict("multiplier", estimate(per_f, mine_f, base_f, spread_m), committed_m,
                                 stats.verdict(stats.replicated_change(per_f, per_c, spread=spread_m),
                                               float(tol["multiplier_rel"]), n_fresh=n_f, unit="engine starts",
                                               committed_half_width_rel=committed_part(per_c, committed_m,
                                                                                       spread_m))))
    if spread_t is not None or max(n_f, n_c) >= 2:
        per_f, per_c = stats.start_means(mine_f, starts_f), stats.start_means(mine_c, starts_c)
        committed_t = estimate(per_c, mine_c, None, spread_t)
        out.append(FigureVerdict(f"{arm} output tokens/s", estimate(per_f, mine_f, None, spread_t), committed_t,
                                 stats.verdict(stats.replicated_change(per_f, per_c, spread=spread_t),
                                               float(tol["output_tokens_per_s_rel"]), n_fresh=n_f,
                                               unit="engine starts",
                                               committed_half_width_rel=committed_part(per_c, committed_t,
                                                                                       spread_t))))
    return out


def speed_verdicts(ledger: Ledger, arm: str, committed: Mapping[str, Any], measured: Mapping[str, Any]
                   ) -> list[FigureVerdict]:
    """Multiplier (speculative arms) and the arm's own tokens/s, each fresh vs committed with its CI."""
    tol = ledger.tolerances
    out: list[FigureVerdict] = []
    mine_f, mine_c = _repeats(measured, arm), _repeats(committed, arm)
    base = ledger.baseline_arm_for(arm) if ledger.arm(arm)["role"] in ("speculative", "policy") else None
    replicated = _replicated_verdicts(ledger, arm, base, committed, measured)
    if replicated is not None:
        return replicated
    base_f, base_c = _repeats(measured, base), _repeats(committed, base)
    if mine_f and mine_c and base_f and base_c and len(mine_f) == len(base_f) and len(mine_c) == len(base_c):
        change = stats.multiplier_change(mine_f, base_f, mine_c, base_c)
        committed_m = stats.multiplier_estimate(mine_c, base_c)
        out.append(FigureVerdict("multiplier", stats.multiplier_estimate(mine_f, base_f), committed_m,
                                 stats.verdict(change, float(tol["multiplier_rel"]), n_fresh=len(mine_f),
                                               committed_half_width_rel=committed_m.half_width_rel)))
    if mine_f and mine_c:
        change = stats.throughput_change(mine_f, mine_c)
        committed_t = stats.mean_estimate(mine_c)
        out.append(FigureVerdict(f"{arm} output tokens/s", stats.mean_estimate(mine_f), committed_t,
                                 stats.verdict(change, float(tol["output_tokens_per_s_rel"]), n_fresh=len(mine_f),
                                               committed_half_width_rel=committed_t.half_width_rel)))
    return out


def compare_point(ledger: Ledger, arm: str, committed: Mapping[str, Any], measured: Mapping[str, Any],
                  *, not_comparable: str | None = None) -> Comparison:
    """Everything a verifier asks of one arm at one point; ``not_comparable`` says why speed is only shown."""
    tol = ledger.tolerances
    result = Comparison()
    c_arm, m_arm = committed["arms"].get(arm), measured["arms"].get(arm)
    if c_arm is None or m_arm is None:
        result.checks.append(Check("arm present", 1.0, 0.0, 1.0, 1.0, f"arm {arm!r} missing"))
        return result
    c_version = int(committed.get("protocol_version", 1))
    m_version = int(measured.get("protocol_version", 1))
    if c_version != m_version:
        not_comparable = (f"committed with protocol v{c_version}, measured with v{m_version}"
                          + (f"; {not_comparable}" if not_comparable else ""))
    result.not_comparable = not_comparable
    result.figures = speed_verdicts(ledger, arm, committed, measured)
    # the verdicts counted repeats, not engine starts: the windows of one start each (where speed is only shown,
    # its interval decides nothing)
    if result.figures and not_comparable is None and all(f.verdict.unit == "repeats" for f in result.figures):
        result.notes.append(ONE_START_EACH)
    if ledger.spread_from is not None and any(f.verdict.unit == "engine starts" for f in result.figures):
        result.notes.append(f"speed: over engine starts with the between-start spread of {ledger.spread_from} "
                            "(--ledger-start-spread-from): this ledger pools none of its own")
    check, other_tokens = acceptance_check(c_arm, m_arm, float(tol["acceptance_length_abs"]))
    if check is not None:
        result.checks.append(check)
    elif other_tokens:
        c, m = c_arm["acceptance"]["acceptance_length"], m_arm["acceptance"]["acceptance_length"]
        result.notes.append(f"acceptance_length: measured {float(m):.3f}, committed {float(c):.3f}; not asserted: "
                            f"{other_tokens}")
    if ledger.arm(arm)["role"] == "policy":
        from specledger.analysis.policy_bar import policy_checks  # it builds on Check, defined here

        for bar in policy_checks(ledger, arm, measured):
            if not_comparable is None:
                result.checks.append(bar)
            else:  # a schedule is derived from one machine's curve: elsewhere its bar is a speed figure
                result.notes.append(f"{bar.line()}; not asserted: {not_comparable}")
    same = m_arm.get("lossless")
    if same:
        result.notes.append(f"lossless at T=0: {same['identical']}/{same['requests_compared']} requests identical "
                            f"to the baseline" + (f", first divergence {same['first_divergence']}"
                                                   if same.get("first_divergence") else ""))
    base = ledger.baseline_arm_for(arm)
    for label, point in (("measured", measured), ("committed", committed)):
        parts = []
        for name in dict.fromkeys(n for n in (arm, base) if n):
            s = figures.throughput_spread(point["arms"].get(name))
            if s is not None:
                med = point["arms"][name]["output_tokens_per_s"]["median"]
                engine = engine_spread(point["arms"][name])
                inside = f"; engine time per request {engine:.1%}" if engine is not None else ""
                host = _median_host_slice_ms(point["arms"][name])
                inside += f"; host slice {host:.1f} ms" if host is not None else ""
                parts.append(f"{name} {med:.1f} tok/s (repeat spread {s:.1%}{inside})")
        if parts:
            result.notes.append(f"{label}: " + ", ".join(parts))
    host_note = _host_expectation(ledger, arm, c_arm, m_arm)
    if host_note:
        result.notes.append(host_note)
    return result


#: Host slices this far apart (ratio) get the host's expected share of a tokens/s change spelt out.
HOST_RATIO_NOTED = 1.25


def _host_expectation(ledger: Ledger, arm: str, committed_arm: Mapping[str, Any],
                      measured_arm: Mapping[str, Any]) -> str | None:
    """What the host alone predicts for the arm's tokens/s when the two sides ran on hosts of different speed: the
    ledger's host elasticity (``figures.host_elasticities``, `specledger audit`'s host-sensitivity) at the ratio of
    the two median host slices, with its interval. Why: a verification on a host of the same CPU model that runs
    the host loop 2.5x slower sees tokens/s fall by a third for that alone; the verdict stays as judged, and this
    says how much of a tokens/s change the host explains. None when the slices are within 25% or unknown, or the
    ledger resolves no elasticity."""
    c_host, m_host = _median_host_slice_ms(committed_arm), _median_host_slice_ms(measured_arm)
    if c_host is None or m_host is None or c_host <= 0 or m_host <= 0 \
            or max(c_host, m_host) / min(c_host, m_host) < HOST_RATIO_NOTED:
        return None
    by_figure = figures.host_elasticities(ledger).get(arm, {})
    ratio = m_host / c_host
    predicted = []
    for figure, what in (("output_tokens_per_s", "tokens/s"), ("multiplier", "multiplier")):
        e = by_figure.get(figure)
        if e is not None:
            expected, low, high = (ratio**b - 1 for b in (e.slope, e.low, e.high))
            predicted.append(f"{what} {expected:+.1%} ({min(low, high):+.1%}..{max(low, high):+.1%}, "
                             f"{e.starts} starts at {e.points} points)")
    if not predicted:
        return None
    return (f"host: this run's host slice {m_host:.1f} ms against the committed {c_host:.1f} ms ({ratio:.2f}x); "
            f"from the ledger's host sensitivity (`specledger audit`) the host alone predicts {arm}'s "
            + " and its ".join(predicted))


def acceptance_check(committed_arm: Mapping[str, Any], measured_arm: Mapping[str, Any], bar_abs: float
                     ) -> tuple[Check | None, str | None]:
    """One arm's acceptance length held to the committed value ± ``bar_abs``: (the check, None), or (None, why it is
    not asserted) when the two figures count other tokens, or (None, None) when nothing was committed. A measurement
    that counted no drafts is a failing check. Its own function so that `compare_point` and `analysis.compare` judge
    the bar one way, and comparing two ledgers need not recompute their speed verdicts for it."""
    c_acc, m_acc = committed_arm.get("acceptance") or {}, measured_arm.get("acceptance") or {}
    if c_acc.get("acceptance_length") is None:
        return None, None
    c = float(c_acc["acceptance_length"])
    m = m_acc.get("acceptance_length")
    if m is None:
        return Check("acceptance_length", c, float("nan"), c - bar_abs, c + bar_abs,
                     "no drafts were counted in the measurement"), None
    other_tokens = acceptance_sources_differ(c_acc, m_acc, committed_requests=committed_arm.get("requests"),
                                             measured_requests=measured_arm.get("requests"),
                                             committed_starts=figures.arm_start_count(committed_arm),
                                             measured_starts=figures.arm_start_count(measured_arm))
    if other_tokens:
        return None, other_tokens
    return Check("acceptance_length", c, float(m), c - bar_abs, c + bar_abs, f"±{bar_abs:g}"), None


def acceptance_sources_differ(committed: Mapping[str, Any], measured: Mapping[str, Any], *,
                              committed_requests: int | None = None, measured_requests: int | None = None,
                              committed_starts: int, measured_starts: int) -> str | None:
    """Why two acceptance figures count different tokens (so a bar between them means nothing), or None.

    From a pass, both count the same prompts (`figures.passes_over_the_same_prompts`: a point with several engine
    starts sums their passes); from windows, whatever each window's time covered
    (absent ``from``: windows, as every ledger recorded before the pass). Two window figures are never
    the same tokens: over HTTP on a CI machine 3.4x slower, the CPU ledger's copy:0:2 ngram windows
    held 40 requests against the recording's 59, and the length moved by 0.115 against a bar of 0.1
    with nothing wrong (2026-12-06). ``*_requests``: the arm's timed requests, named in the reason; ``*_starts``:
    the engine starts of each side's arm, whose passes a figure may sum.
    """
    legacy = LEGACY_ACCEPTANCE["from"]
    c_from, m_from = committed.get("from", legacy), measured.get("from", legacy)
    if c_from != m_from:
        return f"committed from the {c_from}, measured from the {m_from}: re-record the point to compare them"
    if c_from == "pass" and not figures.passes_over_the_same_prompts(committed, measured,
                                                                     one_starts=committed_starts,
                                                                     other_starts=measured_starts):
        return (f"the committed pass covered {committed.get('requests')} prompts in {committed_starts} engine "
                f"start(s), this one {measured.get('requests')} in {measured_starts}")
    if c_from == "windows":
        held = ("" if committed_requests is None or measured_requests is None
                else f" ({committed_requests} committed, {measured_requests} here)")
        return (f"both from timed windows, which hold whatever requests their time allowed{held}: "
                f"re-record the point with the acceptance pass to assert it")
    return None


def _median_host_slice_ms(arm_result: Mapping[str, Any]) -> float | None:
    """Median host slice of an arm's windows (None before 2026-12-03): beside each side's tokens/s, because tokens/s
    falls 20-34% per doubled host slice on the H100 ledgers (`specledger audit`'s host-sensitivity), and two hosts
    of one CPU model can differ 2.5x."""
    values = [float(v) for v in ((arm_result.get("window") or {}).get("host_slice_ms") or []) if v is not None]
    return statistics.median(values) if values else None


def engine_spread(arm_result: Mapping[str, Any]) -> float | None:
    """(max - min) / median of the engine's own time per request over the repeats, if recorded.

    Beside the throughput spread it tells whether a noisy repeat was slow inside the engine.
    """
    times = (arm_result.get("request_time_s") or {}).get("engine") or []
    if len(times) < 2 or statistics.median(times) <= 0:
        return None
    return (max(times) - min(times)) / statistics.median(times)
