"""The pure math of speculative decoding, kept apart from any engine.

Ledgers record measured numbers; this module says what those numbers *mean* under the
textbook model (i.i.d. per-token acceptance, Leviathan et al. 2023), so that a claim can be
re-derived from a ledger without vLLM, numpy or scipy.  Everything here is a small pure
function over floats and ints that raises ``ValueError`` on inputs that have no meaning,
rather than returning a plausible-looking number.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Crossing",
    "alpha_from_acceptance_length",
    "critical_concurrency",
    "expected_tokens_per_step",
    "mix_multiplier",
    "sessions",
    "speedup",
]

# Above this draft length the O(gamma) Horner loop gives way to the closed form; real drafters
# use gamma <= ~16, so the loop (exact monotonicity in floating point) is what actually runs.
_HORNER_MAX_GAMMA = 4096
# Bisection stops when the alpha bracket is this narrow (absolute); the brief asks for ~1e-12.
_ALPHA_TOL = 1e-14
# Shares of generated tokens must sum to 1 within this; we refuse to renormalise silently.
_SHARE_SUM_TOL = 1e-6


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


def _real(name: str, value: object) -> float:
    """Coerce to float, refusing NaN/inf and non-numbers, so bad ledgers fail loudly."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if math.isnan(x):
        raise ValueError(f"{name} is NaN")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return x


def _int(name: str, value: object, minimum: int) -> int:
    """Accept true integers only (4.0 and True are not draft lengths)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got bool {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an int, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def _alpha(alpha: object) -> float:
    """Acceptance is a probability; anything outside [0, 1] is a bug upstream."""
    a = _real("alpha", alpha)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {a!r}")
    return a


# --------------------------------------------------------------------------------------------
# acceptance length
# --------------------------------------------------------------------------------------------


def _expected_tokens(a: float, gamma: int) -> float:
    """E for already-validated inputs (the bisection calls this in its inner loop)."""
    if a == 0.0:
        return 1.0
    if a == 1.0:
        return float(gamma + 1)
    if gamma <= _HORNER_MAX_GAMMA:
        # Horner: 1 + a(1 + a(1 + ...)).  No subtraction, so no cancellation as a -> 1, and
        # every step is a monotone rounded op, so E is non-decreasing in a and in gamma even
        # in floating point -- which the inverse's bisection relies on.
        acc = 1.0
        for _ in range(gamma):
            nxt = 1.0 + a * acc
            if nxt == acc:  # fixed point: further terms are below rounding
                break
            acc = nxt
        return acc
    # Closed form (1 - a^(g+1)) / (1 - a) with the numerator via expm1/log1p: 1 - a is exact
    # for a in [0.5, 1] (Sterbenz), so this stays accurate right up to a -> 1.
    one_minus_a = 1.0 - a
    return -math.expm1((gamma + 1) * math.log1p(-one_minus_a)) / one_minus_a


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Mean tokens emitted per verification step: (1 - alpha**(gamma+1)) / (1 - alpha).

    This is the mean acceptance length under i.i.d. per-token acceptance ``alpha`` with
    ``gamma`` draft tokens (the +1 is the token the target always contributes).  The
    alpha -> 1 limit is gamma + 1; it is computed without the 0/0 cancellation of the
    closed form, so E(1 - 1e-12, g) is ~g + 1, not noise.
    """
    return _expected_tokens(_alpha(alpha), _int("gamma", gamma, 0))


def alpha_from_acceptance_length(length: float, gamma: int) -> float:
    """Per-token acceptance alpha that explains a measured mean acceptance ``length``.

    Engines report acceptance length, while the theory (and other drafters' papers) speak in
    alpha; this inverts E(., gamma) by bisection, which is safe because E is monotone in
    alpha.  ``length`` must lie in [1, gamma + 1]: a step always yields at least the target's
    token and at most all drafts plus one.  gamma = 0 is rejected because E(alpha, 0) == 1
    for every alpha, so the length says nothing about alpha.
    """
    g = _int("gamma", gamma, 0)
    x = _real("length", length)
    hi_len = float(g + 1)
    if not 1.0 <= x <= hi_len:
        raise ValueError(f"acceptance length must be in [1, gamma+1] = [1, {g + 1}] for gamma={g}, got {x!r}")
    if g == 0:
        raise ValueError("gamma=0: every alpha gives acceptance length 1, so alpha is not identifiable")
    if x == hi_len:
        return 1.0
    if x == 1.0:
        return 0.0
    lo, hi = 0.0, 1.0  # invariant: E(lo) <= x <= E(hi)
    while hi - lo > _ALPHA_TOL:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _expected_tokens(mid, g) < x:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Idealised wall-time multiplier E / (gamma * c + 1) (Leviathan et al. 2023).

    ``cost_ratio`` c is the cost of one draft forward pass in target forward passes; a step
    costs gamma drafts plus one verification.  It ignores batching, so it is an upper bound
    to compare measured multipliers against, not a prediction at high concurrency.
    """
    e = expected_tokens_per_step(alpha, gamma)
    c = _real("cost_ratio", cost_ratio)
    if c < 0.0:
        raise ValueError(f"cost_ratio must be >= 0, got {c!r}")
    return e / (gamma * c + 1.0)


# --------------------------------------------------------------------------------------------
# critical concurrency
# --------------------------------------------------------------------------------------------


CrossingKind = Literal["crosses", "stays-above", "starts-below"]


@dataclass(frozen=True)
class Crossing:
    """Where a multiplier curve first falls below ``threshold``, or why it has no such point.

    "stays-above" and "starts-below" are explicit outcomes rather than a number (0, inf,
    the range edge) so that a report can never present "not observed" as a measurement.
    """

    kind: CrossingKind
    value: float | None
    between: tuple[int, int] | None
    threshold: float = 1.0
    measured_range: tuple[int, int] | None = None
    above_again_at: tuple[int, ...] = ()
    """Concurrencies past the first loss whose multiplier is back at or above the threshold. Why: a curve that
    dips below 1.0 and recovers (continuous batching can make drafts cheap again at high concurrency) must not
    read as "speculation loses from here on"."""

    def __post_init__(self) -> None:
        """Keep value/between consistent with kind so downstream code can trust them."""
        if self.kind not in ("crosses", "stays-above", "starts-below"):
            raise ValueError(f"unknown crossing kind {self.kind!r}")
        if self.kind == "crosses":
            if self.value is None or self.between is None:
                raise ValueError("a 'crosses' result needs both value and between")
        elif self.value is not None or self.between is not None:
            raise ValueError(f"a {self.kind!r} result must have value=None and between=None")
        if self.kind == "stays-above" and self.above_again_at:
            raise ValueError("a 'stays-above' result has no loss to come back from")

    def _within(self) -> str:
        if self.measured_range is None:
            return ""
        lo, hi = self.measured_range
        return f" within c={lo}..{hi}"

    def _again(self) -> str:
        if not self.above_again_at:
            return ""
        return f"; at or above {self.threshold} again at c={', '.join(str(c) for c in self.above_again_at)}"

    def describe(self) -> str:
        """One human line for reports, e.g. '5.70 (between 4 and 8)', with any recovery after the first loss."""
        thr = f"{self.threshold}"
        if self.kind == "crosses":
            assert self.value is not None and self.between is not None
            lo, hi = self.between
            return f"{self.value:.2f} (between {lo} and {hi}){self._again()}"
        if self.kind == "stays-above":
            return f"does not cross {thr}{self._within()}"
        start = f" from c={self.measured_range[0]}" if self.measured_range is not None else ""
        return f"below {thr}{start} (no crossing{self._within()}){self._again()}"


def _curve(concurrencies: Sequence[int], multipliers: Sequence[float]) -> list[tuple[int, float]]:
    """Validate and sort a measured curve; every rejection names what is wrong."""
    cs, ms = list(concurrencies), list(multipliers)
    if not cs and not ms:
        raise ValueError("empty curve: need at least one (concurrency, multiplier) point")
    if len(cs) != len(ms):
        raise ValueError(f"length mismatch: {len(cs)} concurrencies vs {len(ms)} multipliers")
    points: list[tuple[int, float]] = []
    for c, m in zip(cs, ms, strict=True):
        ci = _int("concurrency", c, 1)
        points.append((ci, _real(f"multiplier at concurrency {ci}", m)))
    points.sort(key=lambda p: p[0])
    dups = sorted({a for (a, _), (b, _) in zip(points, points[1:], strict=False) if a == b})
    if dups:
        raise ValueError(f"duplicate concurrencies: {dups}")
    return points


def _interpolate_log2(c_lo: int, m_lo: float, c_hi: int, m_hi: float, thr: float) -> float:
    """Concurrency where the straight line in (log2 c, m) between two points hits thr.

    Throughput curves are sampled at powers of two and bend in log space, so linear-in-c
    interpolation would bias the crossing toward the higher concurrency.
    """
    t = (m_lo - thr) / (m_lo - m_hi)  # in [0, 1) exactly; may round to 1.0
    value = c_lo * 2.0 ** (t * (math.log2(c_hi) - math.log2(c_lo)))
    return min(max(value, float(c_lo)), float(c_hi))  # guard rounding at the ends


def critical_concurrency(
    concurrencies: Sequence[int], multipliers: Sequence[float], threshold: float = 1.0
) -> Crossing:
    """First concurrency at which the speculative multiplier falls below ``threshold``.

    Beyond this point speculation costs throughput, at least for a while.  Walking up from the
    lowest concurrency, the first step from m >= threshold to m < threshold is the crossing
    (the first loss is what operators hit); `Crossing.above_again_at` lists the later
    concurrencies where the curve is back at or above the threshold, so a dip that recovers is
    never described as a loss from there on.  A multiplier exactly equal to the threshold is not
    below it.  Input order is irrelevant.
    """
    thr = _real("threshold", threshold)
    points = _curve(concurrencies, multipliers)
    rng = (points[0][0], points[-1][0])

    def again(after: int) -> tuple[int, ...]:
        return tuple(c for c, m in points if c > after and m >= thr)

    if points[0][1] < thr:
        return Crossing("starts-below", None, None, thr, rng, again(points[0][0]))
    for (c_lo, m_lo), (c_hi, m_hi) in zip(points, points[1:], strict=False):
        if m_lo >= thr > m_hi:
            value = _interpolate_log2(c_lo, m_lo, c_hi, m_hi, thr)
            return Crossing("crosses", value, (c_lo, c_hi), thr, rng, again(c_hi))
    return Crossing("stays-above", None, None, thr, rng)


def loss_bracket(
    concurrencies: Sequence[int], lows: Sequence[float], highs: Sequence[float], threshold: float = 1.0
) -> tuple[int | None, int] | None:
    """Where the first loss lies at the confidence of the points' intervals (95% CIs in v3 ledgers).

    Returns (the last concurrency before it whose interval lies wholly above ``threshold``, or
    None if none does; the first concurrency whose interval lies wholly below), or None when no
    interval lies wholly below. `critical_concurrency` interpolates between point estimates; this
    says how far the crossing can move once the noise is counted: a curve whose c=2 interval
    straddles 1.0 crosses somewhere between the last certain win and the first certain loss.
    """
    thr = _real("threshold", threshold)
    if not (len(concurrencies) == len(lows) == len(highs)):
        raise ValueError(f"length mismatch: {len(concurrencies)} concurrencies, {len(lows)} lows, {len(highs)} highs")
    last_win: int | None = None
    for c, low, high in sorted(zip(concurrencies, lows, highs, strict=True)):
        if _real(f"upper bound at concurrency {c}", high) < thr:
            return last_win, int(c)
        if _real(f"lower bound at concurrency {c}", low) > thr:
            last_win = int(c)
    return None


def wins_after_loss(concurrencies: Sequence[int], lows: Sequence[float], highs: Sequence[float],
                    threshold: float = 1.0) -> tuple[int, ...]:
    """Concurrencies past the first certain loss (`loss_bracket`) whose interval lies wholly above ``threshold``.

    Why: a curve can fall below 1.0 and come back (at high concurrency the baseline may be bound by per-step
    overheads that drafts amortise); a certain win after a certain loss is a second crossing, not noise.
    """
    bracket = loss_bracket(concurrencies, lows, highs, threshold)
    if bracket is None:
        return ()
    thr = _real("threshold", threshold)
    return tuple(int(c) for c, low in sorted(zip(concurrencies, lows, strict=True))
                 if c > bracket[1] and _real(f"lower bound at concurrency {c}", low) > thr)


def describe_loss_bracket(bracket: tuple[int | None, int] | None, measured: Sequence[int],
                          threshold: float = 1.0, wins_after: Sequence[int] = ()) -> str:
    """`loss_bracket`'s answer in words, for tables beside `Crossing.describe` (the point estimates' crossing).

    Why both: interpolating point estimates always names a crossing once a point falls below the threshold,
    even when that point's interval straddles it; this line says what the intervals establish, including
    any certain win after the first certain loss (`wins_after_loss`).
    """
    thr = _real("threshold", threshold)
    within = f"c={min(measured)}..{max(measured)}" if measured else "the measured range"
    if bracket is None:
        return f"no interval wholly below {thr:g} within {within}"
    last_win, first_loss = bracket
    again = f"; wholly above {thr:g} again at c={', '.join(str(c) for c in wins_after)}" if wins_after else ""
    if last_win is None:
        return f"below {thr:g} from c={first_loss} (no interval wholly above before it){again}"
    return f"between c={last_win} and c={first_loss}{again}"


# --------------------------------------------------------------------------------------------
# capacity and fleet mix
# --------------------------------------------------------------------------------------------


def sessions(kv_cache_tokens: float, context_tokens: int) -> float:
    """How many full-length sessions fit in the KV cache at once: tokens / context.

    Not floored: the ledger keeps the fraction so nothing is lost before aggregation;
    flooring (whole sessions only) is the caller's choice at presentation time.
    """
    tokens = _real("kv_cache_tokens", kv_cache_tokens)
    if tokens < 0.0:
        raise ValueError(f"kv_cache_tokens must be >= 0, got {tokens!r}")
    ctx = _int("context_tokens", context_tokens, 1)
    return tokens / ctx


def mix_multiplier(
    shares: Mapping[str, float],
    multipliers: Mapping[str, float],
    baseline_tokens_per_s: Mapping[str, float] | None = None,
) -> float:
    """Fleet multiplier for a traffic mix, weighting each workload by the time it takes.

    ``shares[w]`` is workload w's fraction of *generated tokens* (must sum to 1; we do not
    renormalise, since a mis-summed mix is usually a missing workload).  A token of w costs
    1/B_w seconds on the baseline and 1/(m_w * B_w) with the drafter, so the fleet multiplier
    is sum(s_w / B_w) / sum(s_w / (m_w * B_w)); with B unknown (equal) it is the
    share-weighted harmonic mean of the multipliers.  An arithmetic mean of the ratios
    overstates the gain: the workload that got slower takes more of the wall time, so it
    dominates the total, while averaging ratios lets a fast workload's gain offset it 1:1.
    """
    total = math.fsum(_real(f"share of {w!r}", s) for w, s in shares.items())
    if abs(total - 1.0) > _SHARE_SUM_TOL:
        raise ValueError(f"shares must sum to 1 (within {_SHARE_SUM_TOL:g}), got sum {total!r}")
    base_time: list[float] = []
    spec_time: list[float] = []
    for w, s in shares.items():
        share = _real(f"share of {w!r}", s)
        if share < 0.0:
            raise ValueError(f"share of {w!r} must be >= 0, got {share!r}")
        if share == 0.0:
            continue
        if w not in multipliers:
            raise ValueError(f"missing multiplier for workload {w!r} (share {share!r})")
        m = _real(f"multiplier of {w!r}", multipliers[w])
        if m <= 0.0:
            raise ValueError(f"multiplier of {w!r} must be > 0, got {m!r}")
        b = 1.0
        if baseline_tokens_per_s is not None:
            if w not in baseline_tokens_per_s:
                raise ValueError(f"missing baseline tokens/s for workload {w!r} (share {share!r})")
            b = _real(f"baseline tokens/s of {w!r}", baseline_tokens_per_s[w])
            if b <= 0.0:
                raise ValueError(f"baseline tokens/s of {w!r} must be > 0, got {b!r}")
        base_time.append(share / b)
        spec_time.append(share / (m * b))
    return math.fsum(base_time) / math.fsum(spec_time)


# --------------------------------------------------------------------------------------------
# measurement noise against a verification tolerance
# --------------------------------------------------------------------------------------------

#: n x variance of the median of n standard normal draws (simulated, 2e6 samples each); it
#: tends to pi/2 for large n. Small n matter: ledgers keep 3 to 10 repeats.
_MEDIAN_VARIANCE_TIMES_N = (1.0, 1.0, 1.344, 1.193, 1.432, 1.291, 1.474, 1.349, 1.493, 1.381,
                            1.509, 1.412, 1.518, 1.43, 1.524)


def _median_variance_factor(n: int) -> float:
    return _MEDIAN_VARIANCE_TIMES_N[n - 1] if n <= len(_MEDIAN_VARIANCE_TIMES_N) else math.pi / 2


def rerun_multiplier_sd(cv_spec: float, cv_base: float, repeats: int) -> float:
    """Standard deviation of log(multiplier of a re-run / multiplier committed), from noise alone.

    Each multiplier is a ratio of two medians of `repeats` runs whose throughput varies with
    coefficients of variation `cv_spec` and `cv_base`; a verification compares two such
    ratios, so four medians enter. Why: a tolerance tighter than this noise fails points of a
    machine that has not changed at all, and a verifier must tell that from real drift.
    """
    n = _int("repeats", repeats, 1)
    for name, cv in (("cv_spec", cv_spec), ("cv_base", cv_base)):
        if _real(name, cv) < 0.0:
            raise ValueError(f"{name} must be >= 0, got {cv!r}")
    return math.sqrt(2.0 * _median_variance_factor(n) * (cv_spec**2 + cv_base**2) / n)


def repeats_for_tolerance(cv_spec: float, cv_base: float, tolerance_rel: float, z: float = 2.0) -> int:
    """Fewest repeats for which a ±tolerance_rel multiplier check spans z noise SDs (z=2: ~95% per point)."""
    tol = _real("tolerance_rel", tolerance_rel)
    if not 0.0 < tol:
        raise ValueError(f"tolerance_rel must be > 0, got {tolerance_rel!r}")
    limit = math.log1p(tol)
    n = 1
    while z * rerun_multiplier_sd(cv_spec, cv_base, n) > limit:
        n += 1
    return n


def within_tolerance_probability(sd_log: float, tolerance_rel: float) -> float:
    """Chance that a re-run lands within ±tolerance_rel when its log-ratio noise has SD `sd_log`."""
    if sd_log <= 0.0:
        return 1.0
    half = math.log1p(tolerance_rel)
    return math.erf(half / (sd_log * math.sqrt(2.0)))
