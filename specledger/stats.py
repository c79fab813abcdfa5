"""Protocol v3 estimates and verdicts: bootstrap intervals for throughput, multipliers and their changes.

Why bootstrap: a point has 5-12 repeats of window throughput, whose noise is neither normal nor
known (GPU clocks, host jitter, the prompt mix). The bootstrap (scipy.stats.bootstrap, BCa by
default) needs no distributional model and corrects for the skew and bias a ratio carries at small n.

Why paired: repeat r runs every arm back to back (A B, then B A), so a slow stretch of the machine
slows both arms of repeat r. Resampling repeat *indices* and taking spec and base of the same index
keeps that shared drift in both numerator and denominator, where it cancels; resampling the arms
independently would count the drift twice as noise. A fresh run and the committed ledger share no
repeats, so their samples are resampled independently of each other.

Why a ratio of means: throughput is tokens / window seconds with the same window for every repeat,
so mean(spec) / mean(base) is total speculative tokens over total baseline tokens, the rate a user
sees. A mean of per-repeat ratios weights noisy repeats alike and is biased upward (Jensen).

Why three outcomes: Criterion.rs calls a change a regression only when the change's whole bootstrap
interval lies beyond its noise threshold, and otherwise reports "Change within noise threshold" or
"No change in performance detected"; asv compare likewise flags only significant changes beyond
--factor. Both read a wide interval as "no change". Here that is a third outcome: *changed* needs the
whole interval outside ±tolerance (Criterion's rule), *holds* the whole interval inside it, anything
else is *inconclusive*, with the repeats that would settle it, so too few repeats never pass for
agreement.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

__all__ = ["Estimate", "Verdict", "mean_estimate", "multiplier", "multiplier_change", "multiplier_estimate",
           "pooled_start_spread", "predicted_change_half_width", "replicated_change", "replicated_estimate",
           "resolvable", "StartSpread", "start_means", "start_multipliers", "throughput_change", "verdict"]

Values = Sequence[float] | np.ndarray
#: scipy >= 1.15 takes the generator as `rng` (SPEC 7); older ones only as `random_state`.
_RNG = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
#: Digits a bootstrap statistic keeps: far below any measured noise, far above float rounding.
_SIGNIFICANT_DIGITS = 12
Statistic = Callable[..., np.ndarray]


@dataclass(frozen=True)
class Estimate:
    """A point value with its bootstrap confidence interval over `n` repeats."""

    value: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    @property
    def half_width(self) -> float:
        """Half the interval's width, in the value's units (for a change: a share, 0.05 = 5 points)."""
        return (self.high - self.low) / 2

    @property
    def half_width_rel(self) -> float:
        """Half-width relative to the value: the +-share a multiplier or throughput is known to (inf at 0)."""
        return self.half_width / abs(self.value) if self.value else math.inf

    @property
    def interval(self) -> list[float]:
        return [self.low, self.high]

    def rounded(self, decimals: int) -> list[float]:
        """[low, high] rounded outward, so the written interval still holds the computed one."""
        scale = 10.0**decimals
        return [math.floor(self.low * scale) / scale, math.ceil(self.high * scale) / scale]


def _sample(name: str, values: Values) -> np.ndarray:
    """Repeats as a finite 1-D float array of at least two (one repeat has no spread to bound)."""
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of repeats, got shape {array.shape}")
    if array.size < 2:
        raise ValueError(f"{name}: a confidence interval needs at least 2 repeats, got {array.size}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has non-finite repeats: {array.tolist()}")
    return array


def _positive_mean(name: str, array: np.ndarray) -> None:
    if not array.mean() > 0:
        raise ValueError(f"{name} has mean {array.mean()!r}: a ratio needs a positive mean in its denominator")


def _bootstrap(sizes: tuple[int, ...], statistic: Statistic, *, confidence: float, n_resamples: int,
               seed: int) -> Estimate:
    """Bootstrap `statistic` over repeat indices: one index array per independent sample, of these sizes.

    `statistic(*index_arrays)` indexes the value arrays itself, so arrays that share an index
    array (the arms of one run) are resampled as pairs and separate index arrays independently.
    BCa, falling back to percentile where BCa is degenerate; a constant bootstrap distribution
    (every repeat identical, or spec an exact multiple of base) gives the point value as both bounds.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    indices = tuple(np.arange(size) for size in sizes)
    exact = float(statistic(*indices))
    digits = _SIGNIFICANT_DIGITS - math.floor(math.log10(abs(exact))) if exact else _SIGNIFICANT_DIGITS
    n = sizes[0]
    kwargs = {"vectorized": True, "paired": False, "confidence_level": confidence}

    def stat(*idx: np.ndarray, axis: int = -1) -> np.ndarray:
        # Resamples equal in exact arithmetic (a permutation of the repeats; 20.1 + 20.3 = 20.2 + 20.2
        # in rounded ledger figures) must compare equal, or BCa's bias correction, which counts
        # resamples below the point value, and so the interval, would turn on float summation order.
        # Hence sorted indices (one summation order per multiset) and values cut to 12 digits.
        return np.round(statistic(*(np.sort(i, axis=-1) for i in idx)), digits)

    value = float(stat(*indices))
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)  # handled: NaN bounds, then percentile
        result = stats.bootstrap(indices, stat, n_resamples=n_resamples, method="BCa",
                                 **{_RNG: np.random.default_rng(seed)}, **kwargs)
        distribution = np.asarray(result.bootstrap_distribution)
        if np.ptp(distribution) <= 1e-12 * max(1.0, abs(value)):
            return Estimate(value, value, value, n, confidence)
        low, high = result.confidence_interval
        if not (math.isfinite(low) and math.isfinite(high)):
            low, high = stats.bootstrap(indices, stat, n_resamples=0, bootstrap_result=result,
                                        method="percentile", **kwargs).confidence_interval
    return Estimate(value, float(low), float(high), n, confidence)


def mean_estimate(values: Values, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0) -> Estimate:
    """Mean of repeats (a point's output tokens/s) with its bootstrap interval."""
    x = _sample("values", values)
    return _bootstrap((x.size,), lambda i: x[i].mean(axis=-1),
                      confidence=confidence, n_resamples=n_resamples, seed=seed)


def multiplier(spec: Values, base: Values) -> float:
    """mean(spec) / mean(base): total speculative over total baseline throughput of paired repeats."""
    s, b = np.asarray(spec, dtype=float), np.asarray(base, dtype=float)
    _positive_mean("base", b)
    return float(s.mean() / b.mean())


def _paired(spec: Values, base: Values, what: str) -> tuple[np.ndarray, np.ndarray]:
    s, b = _sample(f"{what} spec", spec), _sample(f"{what} base", base)
    if s.size != b.size:
        raise ValueError(f"{what}: paired repeats need as many spec as base repeats, got {s.size} and {b.size}")
    _positive_mean(f"{what} base", b)
    return s, b


def multiplier_estimate(
    spec: Values, base: Values, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0
) -> Estimate:
    """The multiplier with its paired bootstrap interval (repeat r of spec resampled with repeat r of base)."""
    s, b = _paired(spec, base, "multiplier")
    return _bootstrap((s.size,), lambda i: s[i].mean(axis=-1) / b[i].mean(axis=-1),
                      confidence=confidence, n_resamples=n_resamples, seed=seed)


def multiplier_change(
    fresh_spec: Values,
    fresh_base: Values,
    committed_spec: Values,
    committed_base: Values,
    *,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> Estimate:
    """fresh multiplier / committed multiplier - 1; each run paired within, the two runs independent.

    `n` of the result is the fresh run's repeats (the side a verifier can add to).
    """
    fs, fb = _paired(fresh_spec, fresh_base, "fresh")
    cs, cb = _paired(committed_spec, committed_base, "committed")
    _positive_mean("committed spec", cs)

    def change(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        return (fs[i].mean(axis=-1) / fb[i].mean(axis=-1)) / (cs[j].mean(axis=-1) / cb[j].mean(axis=-1)) - 1

    return _bootstrap((fs.size, cs.size), change, confidence=confidence, n_resamples=n_resamples, seed=seed)


def throughput_change(
    fresh: Values, committed: Values, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0
) -> Estimate:
    """mean(fresh) / mean(committed) - 1 of one arm's throughput; the two runs resampled independently."""
    f, c = _sample("fresh", fresh), _sample("committed", committed)
    _positive_mean("committed", c)
    return _bootstrap((f.size, c.size), lambda i, j: f[i].mean(axis=-1) / c[j].mean(axis=-1) - 1,
                      confidence=confidence, n_resamples=n_resamples, seed=seed)


# -- across engine starts: independent replications -----------------------------------------
#
# Why: a point's windows from one engine start share that start's host state. On a lent H200 VM the same point,
# recorded in four starts 12 minutes apart, gave ngram multipliers whose window-bootstrap CIs did not overlap
# (1.326..1.490 and 1.048..1.250, reports/evidence/2026-12-03-h200-affinity-ab): resampling windows treats the start
# as if it were the population. Each start is one replication (asv runs every benchmark in several processes for
# the same reason); its windows give one figure, and the interval is Student's t over the starts' logs, the
# textbook method of independent replications. With few starts it is wide, and that width is the truth: the
# between-start spread is what a verification on another day will meet.


#: Per-start logs this close are one figure: the t interval is zero-width, and scipy's moments would lose precision.
_SAME_LOG = 1e-9


def _by_start(name: str, values: Values, starts: Sequence[int]) -> dict[int, np.ndarray]:
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(starts) != x.size:
        raise ValueError(f"{name}: one start index per repeat, got {len(starts)} for {x.size} repeats")
    return {int(s): x[np.asarray(starts) == s] for s in dict.fromkeys(int(s) for s in starts)}


def start_multipliers(spec: Values, base: Values, starts: Sequence[int]) -> list[float]:
    """The multiplier of each engine start (ratio of means of its paired windows), in start order."""
    s, b = _by_start("spec", spec, starts), _by_start("base", base, starts)
    return [multiplier(s[k], b[k]) for k in s]


def start_means(values: Values, starts: Sequence[int]) -> list[float]:
    """Each engine start's mean throughput, in start order."""
    return [float(v.mean()) for v in _by_start("values", values, starts).values()]


def _logs(name: str, figures: Sequence[float]) -> np.ndarray:
    x = np.asarray(figures, dtype=float)
    if not np.all(np.isfinite(x)) or not np.all(x > 0):
        raise ValueError(f"{name}: per-start figures must be positive and finite, got {x.tolist()}")
    return np.log(x)


@dataclass(frozen=True)
class StartSpread:
    """The spread of a figure's logs between engine starts, pooled over a ledger's points (one arm, one figure).

    Why: each visit measures a whole curve in one start, so a point rarely has more than 2-3 starts, and a t
    interval over 2 starts has 1 degree of freedom (t = 12.7): honest, and useless. Every point of a visit shares
    that visit's host state, though, so the points are groups of one experiment, and their within-group
    variances pool as in a one-way ANOVA (the residual mean square): `df` is the sum of (starts - 1) over the
    points. It assumes the between-start spread in logs is alike across the arm's points (`SpreadHomogeneity` tests
    that)."""

    log_sd: float
    df: int
    points: int


def pooled_start_spread(groups: Sequence[Sequence[float]]) -> StartSpread | None:
    """The pooled between-start spread of per-start figures, one group per point (None: no point has 2 starts)."""
    logs = [_logs("per-start figures", g) for g in groups if len(g) >= 2]
    df = sum(x.size - 1 for x in logs)
    if df < 1:
        return None
    ss = sum(float(((x - x.mean()) ** 2).sum()) for x in logs)
    return StartSpread(math.sqrt(ss / df), int(df), len(logs))


@dataclass(frozen=True)
class SpreadHomogeneity:
    """Bartlett's test that an arm's between-start spread (in logs) is alike across the points it is pooled over.

    Why: `StartSpread` assumes it, and with 2-3 starts a point nobody can see it by eye. A small p says the pooled
    spread is too wide for some points and too narrow for others (the narrow ones' intervals then overstate their
    certainty). With one or two degrees of freedom a point the test has little power: a large p is no proof."""

    statistic: float
    p_value: float
    points: int


def start_spread_homogeneity(groups: Sequence[Sequence[float]]) -> SpreadHomogeneity | None:
    """Bartlett's test over the points with two or more starts; None below two such points, or when a point's
    starts agree exactly (its variance of 0 has no logarithm, so the test is undefined, not significant)."""
    logs = [_logs("per-start figures", g) for g in groups if len(g) >= 2]
    if len(logs) < 2 or any(np.ptp(x) <= _SAME_LOG for x in logs):
        return None
    result = stats.bartlett(*logs)
    return SpreadHomogeneity(float(result.statistic), float(result.pvalue), len(logs))


@dataclass(frozen=True)
class HostElasticity:
    """How a figure moves with the host's speed across engine starts of the same points: the within-point slope of
    its log on the log host slice (ms of a fixed Python loop; larger is a slower host), with a t interval.

    Why: a verification calls two machines "the same" when their CPU model numbers match, but on 2026-12-07 one H100
    host of model 143 ran the loop in 23-26 ms and another in 10 ms. If the multiplier moves with the host slice,
    the between-start spread hides a cause a reader can check. Each point is its own group (a fixed-effects
    regression: the point's mean is removed from both logs), so the slope compares starts of one point only and the
    curve's own shape cannot pass for a host effect. `df` = starts - points - 1."""

    slope: float
    low: float
    high: float
    df: int
    starts: int
    points: int
    r: float
    host_ms_min: float
    host_ms_max: float

    def per_doubling(self) -> tuple[float, float, float]:
        """The figure's relative change when the host slice doubles: (estimate, low, high), e.g. -0.07 = -7%."""
        return 2.0**self.slope - 1, 2.0**self.low - 1, 2.0**self.high - 1


def host_elasticity(groups: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                    confidence: float = 0.95) -> HostElasticity | None:
    """`HostElasticity` from one (host slice ms per start, figure per start) pair a point; points of one start add
    nothing. None when no degree of freedom is left or the host slice never differs within a point."""
    pairs = [(_logs("host slices", h), _logs("per-start figures", f)) for h, f in groups if len(f) >= 2]
    for h, f in pairs:
        if h.size != f.size:
            raise ValueError(f"a point has {h.size} host slices for {f.size} engine starts")
    starts = sum(f.size for _, f in pairs)
    df = starts - len(pairs) - 1
    if df < 1:
        return None
    x = np.concatenate([h - h.mean() for h, _ in pairs])
    y = np.concatenate([f - f.mean() for _, f in pairs])
    sxx, syy, sxy = float(x @ x), float(y @ y), float(x @ y)
    if sxx <= _SAME_LOG**2:
        return None
    slope = sxy / sxx
    se = math.sqrt(max(syy - slope * sxy, 0.0) / df / sxx)
    low, high = _t_interval(slope, se, df, confidence)
    r = sxy / math.sqrt(sxx * syy) if syy > 0 else 0.0
    hosts = np.exp(np.concatenate([h for h, _ in pairs]))
    return HostElasticity(slope, low, high, df, starts, len(pairs), r, float(hosts.min()), float(hosts.max()))


def _t_interval(centre_log: float, se_log: float, df: int, confidence: float) -> tuple[float, float]:
    q = float(stats.t.ppf((1 + confidence) / 2, df))
    return centre_log - q * se_log, centre_log + q * se_log


def replicated_estimate(per_start: Sequence[float], *, spread: StartSpread | None = None,
                        confidence: float = 0.95) -> Estimate:
    """Geometric mean of per-start figures (multipliers or tokens/s) with a t interval over the starts.

    With ``spread`` (the ledger's pooled between-start spread) the interval takes its variance and degrees of
    freedom from there, so it also serves a point of one start; without, from this point's own starts."""
    logs = _logs("per-start figures", per_start)
    if spread is not None and logs.size >= 1:
        centre = float(logs.mean())
        low, high = _t_interval(centre, spread.log_sd / math.sqrt(logs.size), spread.df, confidence)
        return Estimate(float(np.exp(centre)), float(np.exp(low)), float(np.exp(high)), int(logs.size), confidence)
    if logs.size < 2:
        raise ValueError(f"an interval over engine starts needs at least 2 starts, got {logs.size}")
    value = float(np.exp(logs.mean()))
    if np.ptp(logs) <= _SAME_LOG:
        return Estimate(value, value, value, int(logs.size), confidence)
    low, high = stats.ttest_1samp(logs, 0.0).confidence_interval(confidence)
    return Estimate(value, float(np.exp(low)), float(np.exp(high)), int(logs.size), confidence)


def _change_over_starts(centre_log: float, sd_log: float, df: int, n_fresh: int, n_committed: int,
                        confidence: float) -> Estimate:
    """fresh / committed - 1 with the t interval of two means of n_fresh and n_committed starts that share one
    log spread: what a verdict over starts judges (replicated_change) and what the audit predicts of it
    (predicted_replicated_change), in one place."""
    low, high = _t_interval(centre_log, sd_log * math.sqrt(1 / n_fresh + 1 / n_committed), df, confidence)
    return Estimate(float(np.exp(centre_log) - 1), float(np.exp(low) - 1), float(np.exp(high) - 1), n_fresh,
                    confidence)


def replicated_change(fresh_per_start: Sequence[float], committed_per_start: Sequence[float], *,
                      spread: StartSpread | None = None, confidence: float = 0.95) -> Estimate:
    """fresh / committed - 1 of per-start figures, as a ratio of geometric means, with a pooled-variance t interval.

    Pooled: both sides are starts of one procedure on one machine type, so one variance serves both, and a single
    fresh start (a nightly run) is compared with the committed starts as a new replication: its interval is the
    committed spread times sqrt(1 + 1/n), with n - 1 degrees of freedom. With ``spread`` (the committed ledger's,
    pooled over its points) the variance and degrees of freedom come from there, and the fresh starts' own
    deviations join it; then one start on each side is enough. `n` of the result is the fresh starts."""
    f, c = _logs("fresh per-start figures", fresh_per_start), _logs("committed per-start figures",
                                                                     committed_per_start)
    if spread is not None and f.size >= 1 and c.size >= 1:
        ss = spread.log_sd ** 2 * spread.df + float(((f - f.mean()) ** 2).sum())
        df = spread.df + f.size - 1
        return _change_over_starts(float(f.mean() - c.mean()), math.sqrt(ss / df), df, int(f.size), int(c.size),
                                   confidence)
    if f.size < 1 or c.size < 1 or f.size + c.size < 3:
        raise ValueError(f"a change across engine starts needs 3 starts in all, got {f.size} fresh and {c.size} "
                         "committed")
    value = float(np.exp(f.mean() - c.mean()) - 1)
    if np.ptp(np.concatenate([f - f.mean(), c - c.mean()])) <= _SAME_LOG:
        return Estimate(value, value, value, int(f.size), confidence)
    low, high = stats.ttest_ind(f, c, equal_var=True).confidence_interval(confidence)
    return Estimate(value, float(np.exp(low) - 1), float(np.exp(high) - 1), int(f.size), confidence)


# -- verdicts --------------------------------------------------------------------------------

Outcome = Literal["holds", "changed", "inconclusive"]
Direction = Literal["up", "down"] | None


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _tol(tolerance: float) -> str:
    return f"±{tolerance * 100:.3g}%"


@dataclass(frozen=True)
class Verdict:
    """Whether a change's interval lies within ±tolerance (holds), wholly outside (changed), or neither."""

    outcome: Outcome
    change: Estimate
    tolerance: float
    direction: Direction
    repeats_needed: int | None
    unit: str = "repeats"  # what repeats_needed counts: windows of one start, or "engine starts"

    def line(self) -> str:
        """One line for a person: the outcome, the change with its interval, against the tolerance."""
        c = self.change
        figures = f"change {_pct(c.value)} ({c.confidence * 100:.3g}% CI {_pct(c.low)}..{_pct(c.high)})"
        if self.outcome == "holds":
            return f"holds: {figures} within {_tol(self.tolerance)}"
        if self.outcome == "changed":
            return f"changed ({self.direction}): {figures} outside {_tol(self.tolerance)}"
        settle = (f"about {self.repeats_needed} fresh {self.unit} would settle it" if self.repeats_needed is not None
                  else f"more fresh {self.unit} cannot settle it (the change sits at the tolerance, or the "
                  "committed interval alone is wider than the room left)")
        return f"inconclusive: {figures} straddles {_tol(self.tolerance)}; {settle}"


def verdict(change: Estimate, tolerance: float, *, n_fresh: int,
            committed_half_width_rel: float | None = None, unit: str = "repeats") -> Verdict:
    """Classify a change (e.g. multiplier_change) against ±tolerance, Criterion.rs-style.

    For an inconclusive change, `repeats_needed` is the fresh repeats whose interval would settle
    it if the half-width shrinks as 1/sqrt(n) and the value stays put: narrow enough to fit
    inside the tolerance (|value| < tol) or to clear it (|value| > tol). None where no number
    of repeats can (|value| == tol), and for holds/changed. At least n_fresh + 1: an asymmetric
    interval can straddle the tolerance with a half-width already below the target.

    Given the committed side's relative half-width, only the fresh part (the two add in
    quadrature) shrinks with fresh repeats, and None also where the committed part alone is
    wider than the target: then only a re-recorded ledger can settle it.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    if n_fresh < 1:
        raise ValueError(f"n_fresh must be >= 1, got {n_fresh!r}")
    if change.low >= -tolerance and change.high <= tolerance:
        return Verdict("holds", change, tolerance, None, None, unit)
    if change.high < -tolerance:
        return Verdict("changed", change, tolerance, "down", None, unit)
    if change.low > tolerance:
        return Verdict("changed", change, tolerance, "up", None, unit)
    target_sq, fresh_sq = (tolerance - abs(change.value)) ** 2, change.half_width**2
    if committed_half_width_rel is not None:
        target_sq -= committed_half_width_rel**2
        fresh_sq = max(fresh_sq - committed_half_width_rel**2, 0.0)
    needed = None
    if target_sq > 1e-15:  # the 1e-9 absorbs float noise in exact ratios; never fewer than one repeat more
        needed = max(n_fresh + 1, math.ceil(n_fresh * fresh_sq / target_sq - 1e-9))
    return Verdict("inconclusive", change, tolerance, None, needed, unit)


# -- planning: which tolerances the recorded noise can resolve --------------------------------


def predicted_change_half_width(committed_half_width_rel: float, n_committed: int, n_fresh: int) -> float:
    """Predicted relative half-width of a multiplier change when a fresh run of `n_fresh` repeats is
    compared with a committed multiplier whose interval has relative half-width h over `n_committed`.

    An approximation: the fresh run is assumed as noisy as the committed one, its half-width scales
    as 1/sqrt(n), and the two independent half-widths add in quadrature: sqrt(h^2 + h^2 n_c / n_f).
    """
    if n_committed < 1 or n_fresh < 1:
        raise ValueError(f"repeat counts must be >= 1, got {n_committed!r} and {n_fresh!r}")
    h = committed_half_width_rel
    return math.sqrt(h * h + h * h * n_committed / n_fresh)


def predicted_replicated_change(spread: StartSpread, n_fresh: int, n_committed: int,
                                confidence: float = 0.95) -> Estimate:
    """The change interval that ``replicated_change`` would give an unchanged machine: ``n_fresh`` fresh engine
    starts against ``n_committed`` committed ones, the fresh starts as spread as the ledger's pooled ``spread``.

    Why: with a between-start spread, windows no longer set the width; starts do, on both sides, and the committed
    starts' share never shrinks with fresh ones. Centre 0; the interval is exp(±t·sd·sqrt(1/f + 1/c)) - 1."""
    if n_fresh < 1 or n_committed < 1:
        raise ValueError(f"start counts must be >= 1, got {n_fresh!r} fresh and {n_committed!r} committed")
    return _change_over_starts(0.0, spread.log_sd, spread.df + n_fresh - 1, n_fresh, n_committed, confidence)


def resolvable(committed_half_width_rel: float, n_committed: int, max_repeats: int, tolerance: float) -> bool:
    """Whether a verification with `max_repeats` fresh repeats could show an unchanged multiplier holds."""
    return predicted_change_half_width(committed_half_width_rel, n_committed, max_repeats) < tolerance
