"""Can the ledger's tolerance be verified at all: repeat noise against a fixed band (protocols before v3),
and the committed v3 intervals against the change a verification can resolve."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from specledger import stats
from specledger.analysis import theory
from specledger.analysis.audit.base import Auditor, where
from specledger.ledger.figures import arm_start_count, is_v3, start_spread


def _pct_up(share: float) -> int:
    """The whole percent strictly above `share` (the smallest round tolerance a half-width stays under)."""
    return math.floor(share * 100 + 1e-9) + 1


def _cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation of repeats (None below two repeats or at a zero mean)."""
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def _noise_source(arm: str, cv_throughput: float, cv_engine: float | None) -> str:
    """Where the repeat noise lives, when the ledger timed requests inside the engine too.

    Engine-core time per request varying as much as throughput puts the noise in the engine's
    own steps (kernels, scheduling, host work per step); engine time that holds still while
    throughput moves puts it outside the engine core (front end, load generator, machine).
    """
    if cv_engine is None:
        return ""
    if cv_engine >= 0.7 * cv_throughput:
        where = "so the noise is in the engine's own steps"
    elif cv_engine <= 0.3 * cv_throughput:
        where = "so most of the noise is outside the engine core (front end, load generator, machine)"
    else:
        where = "so the noise is partly in the engine's steps, partly outside the engine core"
    return (f"; {arm}'s engine-core time per request (vllm:request_inference_time_seconds) varies by "
            f"{cv_engine:.1%} against {cv_throughput:.1%} for its throughput, {where}")


def check_noise(a: Auditor) -> None:
    """Can this ledger's multiplier tolerance be verified at all with its own repeat noise?

    Pools each arm's repeat-to-repeat coefficient of variation over the points (three
    repeats say little alone), predicts how far a faithful re-run's multiplier strays,
    and warns when the tolerance would fail points of an unchanged machine. That is the
    question of a fixed band (protocols before v3); a v3 point states its CI and is verified
    by the CI of the change, which `resolution` judges, so v3 points are left to it.
    """
    tol = (a.ledger.data.get("tolerances") or {}).get("multiplier_rel")
    if a.reference or not tol:
        return
    cvs: dict[str, list[float]] = {}
    engine_cvs: dict[str, list[float]] = {}
    counts: list[int] = []
    for point in a.ledger.points:
        if point.get("protocol_version", 1) >= 3:
            continue
        for arm_name, result in point["arms"].items():
            repeats = (result.get("output_tokens_per_s") or {}).get("repeats") or []
            cv = _cv(repeats)
            if cv is not None:
                cvs.setdefault(arm_name, []).append(cv)
                counts.append(len(repeats))
            engine = _cv((result.get("request_time_s") or {}).get("engine") or [])
            if engine is not None:
                engine_cvs.setdefault(arm_name, []).append(engine)
    if not counts:
        return
    n = int(statistics.median(counts))

    def pooled(arm: str | None, table: Mapping[str, list[float]] = cvs) -> float | None:
        values = table.get(arm) if arm else None
        return math.sqrt(statistics.fmean(v * v for v in values)) if values else None

    for i, arm in enumerate(a.ledger.arms):
        base = a.ledger.baseline_arm_for(arm["name"]) if arm["role"] in ("speculative", "policy") else None
        cv_spec, cv_base = pooled(arm["name"]), pooled(base) if base else None
        if cv_spec is None or cv_base is None:
            continue
        sd = theory.rerun_multiplier_sd(cv_spec, cv_base, n)
        p = theory.within_tolerance_probability(sd, tol)
        if p >= 0.9:
            continue
        need = theory.repeats_for_tolerance(cv_spec, cv_base, tol)
        rotating = (a.ledger.data.get("sweep") or {}).get("repeat_prompts", "rotate") != "same"
        caveat = (" (an upper bound: with rotating prompts the repeat spread also carries the prompt mix,"
                  " which a re-run repeats)") if rotating else ""
        a.add(["arms", i], "noise",
                 f"multiplier tolerance ±{tol:.0%} is tighter than this protocol's noise: repeats vary by "
                 f"{cv_spec:.1%} ({arm['name']}) and {cv_base:.1%} ({base}) (pooled CV), so a re-run of an "
                 f"unchanged machine moves the multiplier by SD {sd:.1%} with {n} repeats and stays within "
                 f"±{tol:.0%} at only {p:.0%} of points; {need} repeats give 95%{caveat}"
                 f"{_noise_source(arm['name'], cv_spec, pooled(arm['name'], engine_cvs))}",
                 "info" if rotating else "warning")


def check_resolution(a: Auditor) -> None:
    """Can a verification settle ±multiplier_rel at all, given the committed v3 intervals?

    A verdict holds only when the change's whole interval fits inside the tolerance, and the
    committed interval's width enters that interval however many fresh repeats there are
    (stats.predicted_change_half_width). So per speculative arm: the committed multiplier
    half-widths over the v3 points (median and worst), and whether the tolerance can be
    resolved at protocol.repeats.max fresh repeats, else the smallest tolerance that can. Where the ledger
    pools a between-start spread, verdicts count engine starts, and so does the finding (_resolution_over_starts).
    """
    tol = a.ledger.tolerances["multiplier_rel"]
    protocol = a.ledger.data.get("protocol") or {}
    max_repeats = (protocol.get("repeats") or {}).get("max")
    for i, arm in enumerate(a.ledger.arms):
        if arm["role"] not in ("speculative", "policy"):
            continue
        spread = start_spread(a.ledger.data, arm["name"], "multiplier")
        if spread is not None:
            _resolution_over_starts(a, i, arm["name"], spread, tol)
            continue
        # (committed half-width, predicted change half-width, committed repeats, resolvable, point)
        rows: list[tuple[float, float, int, bool, dict[str, Any]]] = []
        for point in a.ledger.points:
            result = point["arms"].get(arm["name"]) or {}
            interval, m = result.get("multiplier_ci95"), result.get("multiplier")
            n = len((result.get("output_tokens_per_s") or {}).get("repeats") or [])
            if not is_v3(point) or interval is None or not m or m <= 0 or n < 2:
                continue
            h = (interval[1] - interval[0]) / 2 / m
            fresh = max_repeats or n  # no protocol stated: a verification repeats what was recorded
            rows.append((h, stats.predicted_change_half_width(h, n, fresh), n,
                         stats.resolvable(h, n, fresh, tol), point))
        if not rows:
            continue
        fresh = max_repeats or max(n for _, _, n, _, _ in rows)
        ok = sum(row[3] for row in rows)
        h_median = statistics.median(row[0] for row in rows)
        p_median = statistics.median(row[1] for row in rows)
        h_worst, p_worst, n_worst, _, worst = max(rows, key=lambda row: row[1])
        # windows of one start each: a new start's host state is not in these widths (verdict.ONE_START_EACH)
        one_start = (" (windows of one engine start: no point has two, so the spread between starts is not in "
                     "these widths; --ledger-add-start measures it)")
        message = (f"committed multiplier 95% CI half-width ±{h_median:.1%} at the median of {len(rows)} v3 "
                   f"points, ±{h_worst:.1%} at the worst ({where(worst)}; {n_worst} repeats); a verification "
                   f"with {fresh} fresh repeats predicts the change known to ±{p_median:.1%} (median point) "
                   f"and ±{p_worst:.1%} (worst), against a tolerance of ±{tol:.0%}{one_start}: ")
        if ok == len(rows):
            a.add(["arms", i], "resolution", message + "resolvable at every point", "info")
            continue
        a.add(["arms", i], "resolution",
                 message + f"resolvable at only {ok} of {len(rows)} points (elsewhere a re-run of an unchanged "
                 f"machine comes out inconclusive); ±{_pct_up(p_worst)}% would be resolvable at every point "
                 f"(±{_pct_up(p_median)}% at the median one), or record with more repeats",
                 "warning")


#: The most engine starts a resolution finding offers as advice: past it, a start count is no plan.
MAX_STARTS_ADVISED = 20


def _resolution_over_starts(a: Auditor, i: int, arm: str, spread: stats.StartSpread, tol: float) -> None:
    """The resolution finding where the ledger pools a between-start spread: verdicts then count engine starts, so
    what a verification can resolve depends on the starts on each side, not on windows (more windows do not help).

    Judged at the point with the fewest committed starts (the widest): one fresh start, which a nightly run is,
    then the fresh starts that would do (``MAX_STARTS_ADVISED`` at most), and else the starts on each side."""
    counts = [arm_start_count(point["arms"][arm]) for point in a.ledger.points
              if is_v3(point) and (point["arms"].get(arm) or {}).get("multiplier")]
    if not counts:
        return
    committed = min(counts)

    def fits(n_fresh: int, n_committed: int) -> bool:  # an unchanged machine's verdict would say "holds"
        change = stats.predicted_replicated_change(spread, n_fresh, n_committed)
        return stats.verdict(change, tol, n_fresh=n_fresh, unit="engine starts").outcome == "holds"

    one = stats.predicted_replicated_change(spread, 1, committed)
    message = (f"between-start spread of the multiplier pooled over {spread.points} points (log SD "
               f"{spread.log_sd:.3f}, {spread.df} df), so verdicts count engine starts; with {committed} committed "
               f"start(s) at the point that has fewest, one fresh start (a nightly run) predicts an unchanged "
               f"machine's change known to {one.low:+.1%}..{one.high:+.1%}, against a tolerance of ±{tol:.0%}: ")
    if fits(1, committed):
        a.add(["arms", i], "resolution", message + "resolvable", "info")
        return
    fresh = next((n for n in range(2, MAX_STARTS_ADVISED + 1) if fits(n, committed)), None)
    both = next((n for n in range(committed + 1, MAX_STARTS_ADVISED + 1) if fits(n, n)), None)
    advice = [f"{fresh} fresh starts (--ledger-starts {fresh}) would resolve it" if fresh is not None else
              f"no count of fresh starts up to {MAX_STARTS_ADVISED} resolves it against {committed} committed"]
    if fresh is None:
        advice.append(f"{both} starts on each side would (--ledger-add-start to the committed points)"
                      if both is not None else f"nor {MAX_STARTS_ADVISED} starts on each side")
    advice.append(f"±{_pct_up(max(-one.low, one.high))}% would be resolvable with one fresh start; more windows "
                  "per start do not narrow a between-start interval")
    a.add(["arms", i], "resolution", message + "not resolvable (a re-run of an unchanged machine comes out "
          "inconclusive); " + "; ".join(advice), "warning")

