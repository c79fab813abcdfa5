"""The figures a stored ledger point yields, and the rounding arithmetic that checks them: one home each.

The audit, the claims audit, the tables of `show`, the plots and the verdict notes all read the same
figures out of a point: an arm's multiplier, the throughput it divides, the multiplier's bar, the spread
of the repeats. Each used to carry its own copy, and the copies drifted. The claims audit kept dividing
medians after protocol v3 had made the multiplier a ratio of means. Every reader now asks here.

`specledger.stats` computes figures from repeats while a point is measured. This module reads what a
ledger stores.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

if TYPE_CHECKING:
    from specledger.ledger.model import Ledger

__all__ = [
    "CI_BAR",
    "CI_BAR_OVER_STARTS",
    "POOLED_FIGURES",
    "acceptance_length",
    "Centres",
    "decimals_of",
    "decimals_word",
    "engine_starts",
    "arm_start_count",
    "passes_over_the_same_prompts",
    "start_spread",
    "borrow_start_spread",
    "accelerator",
    "eps",
    "start_spread_json",
    "rounded_interval",
    "pooled_start_spreads",
    "start_spread_homogeneity",
    "pooled_intervals",
    "per_start_figures",
    "figures_by_start",
    "is_ci_bar",
    "interval_field",
    "half_unit",
    "is_v3",
    "multiplier",
    "multiplier_bar",
    "multiplier_centres",
    "multiplier_interval",
    "ratio_interval",
    "rounds_to",
    "throughput_centre",
    "throughput_spread",
]

#: What a bar drawn from a v3 point's stored multiplier_ci95 is (the plots' legend, and how they know one).
CI_BAR = "95% CI (paired bootstrap over the windows of one engine start)"
#: The same bar once the ledger pools the arm's between-start spread (replication.pool_start_intervals).
CI_BAR_OVER_STARTS = "95% CI over engine starts (t, between-start spread pooled over the points)"

Against = Literal["baseline", "matched"]


# -- rounding arithmetic -----------------------------------------------------------------------------
def eps(x: float) -> float:
    """Float slack: the figures are decimal, the arithmetic binary."""
    return 1e-9 * max(1.0, abs(x))


def half_unit(decimals: int) -> float:
    """Half the last stated digit: how far a value rounded to `decimals` may be from the truth."""
    return 0.5 * 10.0**-decimals


def rounds_to(stated: float, lo: float, hi: float, decimals: int) -> bool:
    """Whether some exact value in [lo, hi] rounds to `stated` at `decimals` decimals.

    A stated value with more decimals than it claims to have is never a rounding of anything.
    Ties are accepted both ways (half-up and half-even disagree on them).
    """
    if abs(round(stated, decimals) - stated) > eps(stated):
        return False
    slack = half_unit(decimals) + eps(stated)
    return lo <= stated + slack and hi >= stated - slack


def ratio_interval(
    num: float, num_decimals: int | None, den: float, den_decimals: int | None
) -> tuple[float, float]:
    """The range of num/den when both were rounded (None: exact); den's interval must stay positive."""
    hn = 0.0 if num_decimals is None else half_unit(num_decimals)
    hd = 0.0 if den_decimals is None else half_unit(den_decimals)
    num_lo, num_hi = max(num - hn, 0.0), num + hn
    den_lo, den_hi = den - hd, den + hd
    return num_lo / den_hi, (num_hi / den_lo if den_lo > 0 else math.inf)


def decimals_of(value: float) -> int:
    """Decimals a figure was written with (for figures whose rounding the ledger does not state)."""
    exponent = Decimal(repr(float(value))).normalize().as_tuple().exponent
    return max(0, -int(exponent))


def decimals_word(d: int) -> str:
    """'1 decimal', '3 decimals': how audit messages name a rounding."""
    return f"{d} decimal" if d == 1 else f"{d} decimals"


# -- the figures of a point --------------------------------------------------------------------------
def is_v3(point: Mapping[str, Any]) -> bool:
    """Measured with protocol v3: its multipliers are ratios of means with bootstrap intervals."""
    return point.get("protocol_version") == 3


def throughput_centre(thr: Mapping[str, Any] | None, v3: bool, starts: Sequence[int] | None = None) -> float | None:
    """The output tokens/s a multiplier divides: for v3 the mean (of the repeats, the rawer figure, else
    as stated: both within half a unit of the exact mean), else the median. Over two or more engine starts
    (``starts``, one per repeat) it is the geometric mean of the starts' means, as recorded: then the ratio of two
    arms' centres is the geometric mean of the per-start multipliers, the point's multiplier."""
    thr = thr or {}
    if not v3:
        return thr.get("median")
    repeats = thr.get("repeats")
    if not repeats:
        return thr.get("mean")
    if starts is not None and len(starts) == len(repeats) and len(set(starts)) >= 2:
        from specledger.stats import start_means  # scipy: loaded only for a point of several starts

        return statistics.geometric_mean(start_means(repeats, starts))
    return statistics.fmean(repeats)


class Centres(NamedTuple):
    """The two sides of a multiplier: the speculative arm's and the baseline's output tokens/s."""

    spec: float
    base: float
    statistic: str  # "mean" (protocol v3) or "median"


def multiplier_centres(point: Mapping[str, Any], arm: str, base: str | None) -> Centres | None:
    """The throughputs whose ratio is the arm's multiplier at this point, or None when one side is missing.

    The baseline's centre may be zero or negative: callers that divide say why they cannot.
    """
    if base is None:
        return None
    v3 = is_v3(point)
    spec_arm, base_arm = point["arms"].get(arm) or {}, point["arms"].get(base) or {}
    spec = throughput_centre(spec_arm.get("output_tokens_per_s"), v3, engine_starts(spec_arm))
    baseline = throughput_centre(base_arm.get("output_tokens_per_s"), v3, engine_starts(base_arm))
    if spec is None or baseline is None:
        return None
    return Centres(spec, baseline, "mean" if v3 else "median")


def multiplier_interval(
    point: Mapping[str, Any], arm: str, base: str | None, decimals: int
) -> tuple[float, float, Centres] | None:
    """The exact multipliers the stored centres allow, each rounded to `decimals`: (low, high, centres).

    None when a side is missing or the baseline's centre is not positive."""
    centres = multiplier_centres(point, arm, base)
    if centres is None or centres.base <= 0:
        return None
    low, high = ratio_interval(centres.spec, decimals, centres.base, decimals)
    return low, high, centres


def multiplier(ledger: Ledger, point: Mapping[str, Any], arm: str, against: Against = "baseline") -> float | None:
    """The arm's multiplier at a point against its baseline (or its matched baseline): as stated, else
    the ratio of the centres (means for v3, medians before), else None."""
    result = point["arms"].get(arm)
    if result is None:
        return None
    field_name, base = ledger.multiplier_bases(arm)[0 if against == "baseline" else 1]
    stored = result.get(field_name)
    if stored is not None:
        return stored
    centres = multiplier_centres(point, arm, base)
    if centres is None or not centres.base or centres.base <= 0:
        return None
    return centres.spec / centres.base


def multiplier_bar(point: Mapping[str, Any], arm: str, base: str | None, *,
                   pooled: bool = False) -> tuple[float, float, str] | None:
    """The multiplier's uncertainty as a bar: (low, high, what it is), or None when the ledger has none.

    A protocol-v3 point states the multiplier's 95% CI: that is the bar (`is_ci_bar`), a paired bootstrap,
    or Student's t over engine starts where ``pooled`` says the ledger pools the arm's between-start spread.
    Older points: repeats are paired (same prompts, same repeat, interleaved), so when both arms list their
    repeats the honest spread is min..max of the per-repeat ratios spec_r / base_r. Without paired repeats it
    falls back to the spec arm's min..max over the baseline median, which ignores the baseline's own noise (so
    it understates the spread).
    """
    if base is None:
        return None
    ci = (point["arms"].get(arm) or {}).get("multiplier_ci95")
    if ci and ci[0] is not None and ci[1] is not None:
        return float(ci[0]), float(ci[1]), CI_BAR_OVER_STARTS if pooled else CI_BAR
    spec = (point["arms"].get(arm) or {}).get("output_tokens_per_s") or {}
    baseline = (point["arms"].get(base) or {}).get("output_tokens_per_s") or {}
    spec_repeats, base_repeats = spec.get("repeats") or [], baseline.get("repeats") or []
    if spec_repeats and len(spec_repeats) == len(base_repeats) and all(b > 0 for b in base_repeats):
        ratios = [s / b for s, b in zip(spec_repeats, base_repeats, strict=True)]
        return min(ratios), max(ratios), "min..max of paired per-repeat ratios"
    median = baseline.get("median")
    if median and spec.get("min") is not None and spec.get("max") is not None:
        return spec["min"] / median, spec["max"] / median, "spec min..max / baseline median"
    return None


def is_ci_bar(what: str) -> bool:
    """Whether a ``multiplier_bar`` is a stated 95% CI (not a min..max spread of older points)."""
    return what in (CI_BAR, CI_BAR_OVER_STARTS)


def passes_over_the_same_prompts(one: Mapping[str, Any], other: Mapping[str, Any], *, one_starts: int,
                                 other_starts: int) -> bool:
    """Whether two acceptance figures count the same prompts: both from the pass, each the sum of whole passes over
    one per-start prompt set, and neither summing more passes than its arm has engine starts. Every engine start's
    pass runs the point's same prompts, so a point measured in several starts sums their passes (86 = 2 x 43,
    129 = 3 x 43): the per-start set is the greatest common divisor of the two counts.

    Why one home: adding a start pools passes by this rule (`measure.replication`), and a verification and
    `specledger compare` assert the acceptance bar by it. Equal counts left every point of two starts without an
    acceptance check against a one-start run (2026-12-06); "one count a multiple of the other" then left three
    starts against two unchecked (129 against 86: the H100 fp8 KV ledger against bf16, 2026-12-07), and took one
    start of 80 prompts for two of 40. ``*_starts``: the engine starts of each figure's arm (`engine_starts`)."""
    a, b = int(one.get("requests") or 0), int(other.get("requests") or 0)
    if not (one.get("from") == other.get("from") == "pass" and a > 0 and b > 0):
        return False
    per_start = math.gcd(a, b)
    return a // per_start <= max(1, one_starts) and b // per_start <= max(1, other_starts)


def arm_start_count(arm_result: Mapping[str, Any] | None) -> int:
    """How many engine starts an arm's repeats came from (one for a point recorded before starts were kept)."""
    return max(1, len(set(engine_starts(arm_result))))


def acceptance_length(accepted_tokens: int, drafts: int) -> float:
    """Tokens a speculative step yields on average: the target's own token plus the accepted drafts per
    draft (vLLM's counters are cumulative: pass the deltas of a point). `drafts` must be positive."""
    return 1.0 + accepted_tokens / drafts


def throughput_spread(arm_result: Mapping[str, Any] | None) -> float | None:
    """(max - min) / median of an arm's throughput repeats: how much the repeats of a point disagree.

    min and max as stated, else from the repeats; None without a median or a range."""
    thr = (arm_result or {}).get("output_tokens_per_s") or {}
    repeats = thr.get("repeats") or []
    low = thr["min"] if thr.get("min") is not None else (min(repeats) if repeats else None)
    high = thr["max"] if thr.get("max") is not None else (max(repeats) if repeats else None)
    median = thr.get("median")
    if low is None or high is None or not median:
        return None
    return (high - low) / median


def start_spread(data: Mapping[str, Any], arm: str, figure: str) -> Any:
    """The ledger's pooled between-start spread of one arm's figure (a ``stats.StartSpread``), or None.

    ``figure``: "multiplier", "multiplier_vs_matched" or "output_tokens_per_s"; written by
    ``replication.pool_start_intervals`` whenever a recording stores a point."""
    found = ((data.get("start_spread") or {}).get(arm) or {}).get(figure)
    if not found:
        return None
    from specledger.stats import StartSpread  # scipy: loaded only where a spread is read

    return StartSpread(float(found["log_sd"]), int(found["df"]), int(found["points"]))


def accelerator(ledger: Ledger) -> str | None:
    """The accelerator the ledger's latest run measured on (``provenance.machine.accelerator``; "cpu" for the CPU
    engine), None for a ledger never measured."""
    return ((ledger.data.get("provenance") or {}).get("machine") or {}).get("accelerator")


def borrow_start_spread(ledger: Ledger, source: Ledger) -> bool:
    """Give ``ledger``, which pools no between-start spread of its own, the spread ``source`` pools, in memory and for
    verification only (it is never written): False where ``ledger`` has its own, which wins.

    Why: a ledger of one engine start a point can only compare the windows of one start on each side, which leave
    out what a new start does (ngram's multiplier moved by log SD 0.108-0.120 between starts on the lent H100 and
    H200), so its verdicts cry wolf: on 2026-12-07 the H100 fp8 KV ledger's copy c=8 came out "changed", +23.6%
    (+15.7..+33.3), where three starts read 0.891, 1.004 and 1.101. A spread measured on the same kind of machine, for
    arms of the same names, puts that component back. ValueError (naming the file and JSON path) where ``source``
    pools none or ran on another accelerator."""
    if ledger.data.get("start_spread"):
        return False
    spread = source.data.get("start_spread") or {}
    names = {arm["name"] for arm in ledger.arms}
    shared = {arm: dict(figures) for arm, figures in spread.items() if arm in names}
    if not shared:
        raise ValueError(f"{source.file}: $.start_spread: no between-start spread for any arm of "
                         f"{ledger.id!r} ({', '.join(sorted(names))}); record its points with two or more engine "
                         "starts (--ledger-starts, --ledger-add-start)")
    if accelerator(ledger) != accelerator(source):
        raise ValueError(f"{source.file}: $.provenance.machine.accelerator is {accelerator(source)!r} where "
                         f"{ledger.file} has {accelerator(ledger)!r}: a between-start spread belongs to a kind of "
                         "machine")
    ledger.data["start_spread"] = shared
    ledger.spread_from = source.id
    return True


#: The figures whose per-start values pool: each drafting arm's multipliers and every arm's throughput.
POOLED_FIGURES = ("multiplier", "multiplier_vs_matched", "output_tokens_per_s")


def start_spread_json(spread: Any) -> dict[str, Any]:
    """A ``stats.StartSpread`` as the ledger keeps it under ``start_spread`` (log_sd to 4 decimals)."""
    return {"log_sd": round(spread.log_sd, 4), "df": spread.df, "points": spread.points}


def rounded_interval(e: Any, digits: int) -> list[float]:
    """[low, high] of a ``stats.Estimate`` rounded as the ledger states its figure."""
    return [round(e.low, digits), round(e.high, digits)]


def per_start_figures(ledger: Ledger, point: Mapping[str, Any], name: str) -> dict[str, list[float]]:
    """Each engine start's figure of arm ``name`` at a stored point, from the repeats as the ledger keeps them."""
    from specledger import stats  # scipy: loaded only where starts are pooled

    arms = point["arms"]
    result = arms[name]
    values = [float(v) for v in (result.get("output_tokens_per_s") or {}).get("repeats") or []]
    if not values:
        return {}
    starts = engine_starts(result)
    out = {"output_tokens_per_s": stats.start_means(values, starts)}
    for field_name, base in ledger.multiplier_bases(name):
        base_values = [float(v) for v in ((arms.get(base) or {}).get("output_tokens_per_s") or {}).get("repeats")
                       or []]
        if field_name in result and len(base_values) == len(values):  # paired window by window
            out[field_name] = stats.start_multipliers(values, base_values, starts)
    return out


def figures_by_start(ledger: Ledger, point: Mapping[str, Any], name: str) -> dict[int, dict[str, float]]:
    """`per_start_figures` keyed by each engine start's number (``window.start``, in the order the windows hold
    them): how `specledger show` lists a point's starts and how a report's claim names one (``start=N``)."""
    per_start = per_start_figures(ledger, point, name)
    order = list(dict.fromkeys(engine_starts(point["arms"][name])))
    return {start: {f: values[i] for f, values in per_start.items()} for i, start in enumerate(order)}


def per_start_window_statistic(result: Mapping[str, Any], key: str,
                               statistic: Callable[[list[float]], float] = statistics.median) -> list[float]:
    """``statistic`` of a per-window telemetry list (``window.<key>``: host_slice_ms, cpu_steal_share) for each engine
    start of an arm's result, in start order; NaN for every start where the point did not record it (ledgers before
    2026-12-03 have no host slice) or a window left it null."""
    starts = engine_starts(result)
    order = list(dict.fromkeys(starts))
    values = ((result or {}).get("window") or {}).get(key)
    if not values or len(values) != len(starts):
        return [math.nan] * len(order)
    out = []
    for start in order:
        mine = [float(v) for v, s in zip(values, starts, strict=True) if s == start and v is not None]
        out.append(float(statistic(mine)) if mine else math.nan)
    return out


def host_elasticities(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """arm -> pooled figure -> ``stats.HostElasticity`` over the ledger's v3 points measured in two or more engine
    starts: how the figure moves with the median host slice of that arm's windows, start by start. Arms whose
    starts never differ in host slice, or leave no degree of freedom, are left out."""
    from specledger import stats

    groups: dict[str, dict[str, list[tuple[list[float], list[float]]]]] = {}
    for point in ledger.data.get("points", []):
        if not is_v3(point):
            continue
        for name, result in point["arms"].items():
            if arm_start_count(result) < 2:
                continue
            host = per_start_window_statistic(result, "host_slice_ms")
            if any(math.isnan(h) or h <= 0 for h in host):
                continue
            for field_name, per_start in per_start_figures(ledger, point, name).items():
                if min(per_start) > 0:
                    groups.setdefault(name, {}).setdefault(field_name, []).append((host, per_start))
    found: dict[str, dict[str, Any]] = {}
    for name, by_figure in groups.items():
        for field_name, pairs in by_figure.items():
            value = stats.host_elasticity(pairs)
            if value is not None:
                found.setdefault(name, {})[field_name] = value
    return found


def _per_start_groups(ledger: Ledger) -> dict[str, dict[str, list[list[float]]]]:
    """arm -> pooled figure -> each v3 point's per-start figures (positive ones only): what pooling works on."""
    per_point = [{name: per_start_figures(ledger, point, name) for name in point["arms"]}
                 for point in ledger.data.get("points", []) if is_v3(point)]
    groups: dict[str, dict[str, list[list[float]]]] = {}
    for name in (arm["name"] for arm in ledger.data["arms"]):
        for field_name in POOLED_FIGURES:
            found = [point[name][field_name] for point in per_point
                     if field_name in point.get(name, {}) and min(point[name][field_name]) > 0]
            if found:
                groups.setdefault(name, {})[field_name] = found
    return groups


def _over_start_groups(ledger: Ledger, statistic: Any) -> dict[str, dict[str, Any]]:
    """arm -> figure -> ``statistic(groups)`` over each pooled figure's per-start groups, Nones left out."""
    found: dict[str, dict[str, Any]] = {}
    for name, by_figure in _per_start_groups(ledger).items():
        for field_name, groups in by_figure.items():
            value = statistic(groups)
            if value is not None:
                found.setdefault(name, {})[field_name] = value
    return found


def pooled_start_spreads(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """Each arm's between-start spread of each pooled figure over the ledger's v3 points (arm -> figure ->
    ``stats.StartSpread``), from the repeats as stored: what ``start_spread`` must say, recording or auditing."""
    from specledger import stats

    return _over_start_groups(ledger, stats.pooled_start_spread)


def start_spread_homogeneity(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """arm -> figure -> ``stats.SpreadHomogeneity``: whether the spread that ``pooled_start_spreads`` pools is alike
    across the points (Bartlett), the one assumption pooling makes; arms with fewer than two such points left out."""
    from specledger import stats

    return _over_start_groups(ledger, stats.start_spread_homogeneity)


def interval_field(figure: str) -> tuple[str, ...]:
    """Where a pooled figure's 95% CI lives in an arm's result: ``output_tokens_per_s.ci95``, else ``<figure>_ci95``."""
    return (figure, "ci95") if figure == "output_tokens_per_s" else (f"{figure}_ci95",)


def pooled_intervals(ledger: Ledger, spreads: Mapping[str, Mapping[str, Any]]) -> list[
        tuple[dict[str, Any], str, str, list[float]]]:
    """(point, arm, figure, ci95) for every interval that ``spreads`` sets: Student's t over the point's starts
    with the arm's pooled spread, rounded as the ledger states the figure."""
    from specledger import stats

    out = []
    for point in ledger.data.get("points", []):
        if not is_v3(point):
            continue
        for name in point["arms"]:
            for field_name, per_start in per_start_figures(ledger, point, name).items():
                spread = spreads.get(name, {}).get(field_name)
                if spread is None or min(per_start) <= 0:
                    continue
                digits = ledger.rounding["output_tokens_per_s" if field_name == "output_tokens_per_s" else "multiplier"]
                e = stats.replicated_estimate(per_start, spread=spread)
                out.append((point, name, field_name, rounded_interval(e, digits)))
    return out


def engine_starts(arm_result: Mapping[str, Any] | None) -> list[int]:
    """Each repeat's engine start (``window.start``); a point recorded before starts were kept is all start 0."""
    n = len(((arm_result or {}).get("output_tokens_per_s") or {}).get("repeats") or [])
    starts = ((arm_result or {}).get("window") or {}).get("start")
    return [int(s) for s in starts] if starts and len(starts) == n else [0] * n
