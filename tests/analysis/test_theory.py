"""Properties and worked examples for specledger.analysis.theory (pure math, no engine)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specledger.analysis.theory import (
    Crossing,
    alpha_from_acceptance_length,
    critical_concurrency,
    describe_loss_bracket,
    expected_tokens_per_step,
    loss_bracket,
    mix_multiplier,
    sessions,
    speedup,
    wins_after_loss,
)

# deadline=None per test (not a global profile: other modules share the session); a loaded
# 2-core CI box would otherwise trip hypothesis deadlines on the bisection tests.
no_deadline = settings(deadline=None)

alphas = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
gammas = st.integers(min_value=0, max_value=64)
pos_gammas = st.integers(min_value=1, max_value=64)
costs = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


# ------------------------------------------------------------------ expected_tokens_per_step


def test_expected_tokens_worked_example() -> None:
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(0.3, 0) == 1.0


@no_deadline
@given(gammas)
def test_expected_tokens_endpoints(g: int) -> None:
    assert expected_tokens_per_step(0.0, g) == 1.0
    assert expected_tokens_per_step(1.0, g) == g + 1


@no_deadline
@given(gammas)
def test_expected_tokens_continuous_at_one(g: int) -> None:
    """The naive closed form is 0/0-noise here; ours must approach g + 1."""
    assert expected_tokens_per_step(1 - 1e-12, g) == pytest.approx(g + 1, rel=1e-9)


@no_deadline
@given(alphas, gammas)
def test_expected_tokens_bounds_and_closed_form(a: float, g: int) -> None:
    e = expected_tokens_per_step(a, g)
    assert 1.0 <= e <= g + 1
    assert e == pytest.approx(math.fsum(a**i for i in range(g + 1)), rel=1e-12)


@no_deadline
@given(alphas, alphas, gammas)
def test_expected_tokens_increasing_in_alpha(a1: float, a2: float, g: int) -> None:
    lo, hi = sorted((a1, a2))
    assert expected_tokens_per_step(lo, g) <= expected_tokens_per_step(hi, g)
    if g >= 1 and hi - lo > 1e-9:
        assert expected_tokens_per_step(lo, g) < expected_tokens_per_step(hi, g)


@no_deadline
@given(alphas, gammas)
def test_expected_tokens_non_decreasing_in_gamma(a: float, g: int) -> None:
    assert expected_tokens_per_step(a, g) <= expected_tokens_per_step(a, g + 1)


def test_expected_tokens_large_gamma_uses_stable_closed_form() -> None:
    assert expected_tokens_per_step(0.5, 10_000) == pytest.approx(2.0, rel=1e-12)
    assert expected_tokens_per_step(1 - 1e-12, 5_000) == pytest.approx(5_001, rel=1e-6)
    # both code paths (Horner up to 4096, closed form above) match the plain series
    for g in (4_096, 4_097):
        series = math.fsum(0.999**i for i in range(g + 1))
        assert expected_tokens_per_step(0.999, g) == pytest.approx(series, rel=1e-12)


@pytest.mark.parametrize("alpha", [-0.01, 1.01, math.nan, math.inf, "0.5", None])
def test_expected_tokens_rejects_bad_alpha(alpha: object) -> None:
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(alpha, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("gamma", [-1, 2.0, True, "3"])
def test_expected_tokens_rejects_bad_gamma(gamma: object) -> None:
    with pytest.raises(ValueError, match="gamma"):
        expected_tokens_per_step(0.5, gamma)  # type: ignore[arg-type]


# ------------------------------------------------------------------ alpha_from_acceptance_length


@no_deadline
@given(alphas, pos_gammas)
def test_inverse_round_trips_alpha(a: float, g: int) -> None:
    # dE/dalpha >= 1 for gamma >= 1, so the inverse is well conditioned everywhere.
    assert alpha_from_acceptance_length(expected_tokens_per_step(a, g), g) == pytest.approx(a, abs=1e-9)


@no_deadline
@given(st.floats(min_value=0.0, max_value=1.0), pos_gammas)
def test_inverse_round_trips_length(u: float, g: int) -> None:
    length = 1.0 + u * g
    a = alpha_from_acceptance_length(length, g)
    assert 0.0 <= a <= 1.0
    assert expected_tokens_per_step(a, g) == pytest.approx(length, rel=1e-10, abs=1e-10)


def test_inverse_endpoints_and_example() -> None:
    assert alpha_from_acceptance_length(5.0, 4) == 1.0
    assert alpha_from_acceptance_length(1.0, 4) == 0.0
    assert alpha_from_acceptance_length(3.3616, 4) == pytest.approx(0.8, abs=1e-12)


@no_deadline
@given(pos_gammas, st.floats(min_value=1e-9, max_value=100.0))
def test_inverse_rejects_length_outside_bounds(g: int, excess: float) -> None:
    with pytest.raises(ValueError, match=rf"\[1, {g + 1}\]"):
        alpha_from_acceptance_length(g + 1 + excess, g)
    with pytest.raises(ValueError, match=rf"\[1, {g + 1}\]"):
        alpha_from_acceptance_length(1 - excess, g)


def test_inverse_rejects_gamma_zero_and_nan() -> None:
    with pytest.raises(ValueError, match="identifiable"):
        alpha_from_acceptance_length(1.0, 0)
    with pytest.raises(ValueError, match="NaN"):
        alpha_from_acceptance_length(math.nan, 4)


# ------------------------------------------------------------------ speedup


def test_speedup_worked_example() -> None:
    assert speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, abs=1e-12)
    assert speedup(0.8, 4, 0.05) == pytest.approx(2.8013, abs=5e-5)


@no_deadline
@given(alphas, gammas)
def test_speedup_free_draft_is_expected_tokens(a: float, g: int) -> None:
    assert speedup(a, g, 0.0) == expected_tokens_per_step(a, g)


@no_deadline
@given(alphas, pos_gammas, costs, costs)
def test_speedup_decreasing_in_cost(a: float, g: int, c1: float, c2: float) -> None:
    lo, hi = sorted((c1, c2))
    assert speedup(a, g, lo) >= speedup(a, g, hi)
    if hi - lo > 1e-9:
        assert speedup(a, g, lo) > speedup(a, g, hi)


@pytest.mark.parametrize("c", [-0.1, math.nan, math.inf])
def test_speedup_rejects_bad_cost(c: float) -> None:
    with pytest.raises(ValueError, match="cost_ratio"):
        speedup(0.8, 4, c)


# ------------------------------------------------------------------ critical_concurrency

CS = [1, 2, 4, 8, 16, 64]


def test_critical_concurrency_worked_example() -> None:
    r = critical_concurrency(CS, [1.52, 1.95, 1.22, 0.79, 0.6, 0.3])
    assert r.kind == "crosses"
    assert r.between == (4, 8)
    assert r.measured_range == (1, 64)
    assert r.value == pytest.approx(2 ** (2 + 0.22 / 0.43), rel=1e-12)
    assert r.value == pytest.approx(5.70, abs=5e-3)
    assert r.describe() == "5.70 (between 4 and 8)"


def test_critical_concurrency_stays_above() -> None:
    r = critical_concurrency(CS, [1.5, 1.9, 1.4, 1.2, 1.0, 1.01])
    assert r == Crossing("stays-above", None, None, 1.0, (1, 64))
    assert r.describe() == "does not cross 1.0 within c=1..64"


def test_critical_concurrency_starts_below() -> None:
    # even though it later rises above and falls again, the first point decides
    r = critical_concurrency(CS, [0.9, 1.1, 1.2, 0.8, 0.6, 0.3])
    assert r == Crossing("starts-below", None, None, 1.0, (1, 64), above_again_at=(2, 4))
    assert r.describe() == "below 1.0 from c=1 (no crossing within c=1..64); at or above 1.0 again at c=2, 4"
    assert critical_concurrency([1, 2], [0.4, 0.5]).describe() == "below 1.0 from c=1 (no crossing within c=1..2)"


def test_critical_concurrency_reports_first_crossing_of_a_dip() -> None:
    r = critical_concurrency(CS, [1.5, 0.9, 1.2, 1.3, 0.6, 0.3])
    assert r.kind == "crosses" and r.between == (1, 2)
    assert r.above_again_at == (4, 8)  # the recovery is reported, not hidden behind "first below at 1..2"
    assert r.describe().endswith("(between 1 and 2); at or above 1.0 again at c=4, 8")


def test_critical_concurrency_of_a_curve_that_recovers_at_high_concurrency() -> None:
    # the H200 Qwen2.5-Coder-1.5B copy curve of ngram-gpu k=4 (2026-12-02): below 1.0 from c=4, 1.41x at c=64
    r = critical_concurrency([1, 2, 4, 8, 64], [1.305, 1.191, 0.908, 0.675, 1.413])
    assert (r.kind, r.between, r.above_again_at) == ("crosses", (2, 4), (64,))


def test_critical_concurrency_equal_to_threshold_is_not_below() -> None:
    r = critical_concurrency([1, 2, 4], [1.2, 1.0, 0.8])
    assert r.between == (2, 4) and r.value == 2.0
    r = critical_concurrency([1, 2, 4], [1.2, 1.0, 1.0])
    assert r.kind == "stays-above"


def test_critical_concurrency_custom_threshold_and_order() -> None:
    r = critical_concurrency([8, 1, 4, 2], [0.79, 1.52, 1.22, 1.95], threshold=1.5)
    assert r.between == (2, 4)
    assert r.threshold == 1.5
    assert critical_concurrency([1], [1.0]).describe() == "does not cross 1.0 within c=1..1"


@pytest.mark.parametrize(
    ("cs", "ms", "match"),
    [
        ([], [], "empty"),
        ([1, 2], [1.0], "length mismatch"),
        ([1, 2, 2], [1.0, 1.0, 0.5], "duplicate concurrencies: \\[2\\]"),
        ([0, 1], [1.0, 0.5], "concurrency must be >= 1"),
        ([1, 2.5], [1.0, 0.5], "concurrency must be an int"),
        ([1, 2], [1.0, math.nan], "multiplier at concurrency 2 is NaN"),
    ],
)
def test_critical_concurrency_rejects(cs: list, ms: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        critical_concurrency(cs, ms)


def test_crossing_rejects_inconsistent_fields() -> None:
    with pytest.raises(ValueError):
        Crossing("crosses", None, None)
    with pytest.raises(ValueError):
        Crossing("stays-above", 3.0, (2, 4))
    with pytest.raises(ValueError, match="no loss to come back from"):
        Crossing("stays-above", None, None, above_again_at=(8,))


multiplier_values = st.one_of(
    st.sampled_from([0.5, 1.0, 1.5]),
    st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
)


@st.composite
def curves(draw: st.DrawFn) -> tuple[list[int], list[float], float]:
    cs = draw(st.lists(st.integers(1, 4096), min_size=1, max_size=10, unique=True))
    ms = draw(st.lists(multiplier_values, min_size=len(cs), max_size=len(cs)))
    thr = draw(st.sampled_from([1.0, 0.9, 1.25]))
    return cs, ms, thr


@no_deadline
@given(curves(), st.randoms(use_true_random=False))
def test_critical_concurrency_properties(curve: tuple[list[int], list[float], float], rnd) -> None:
    cs, ms, thr = curve
    r = critical_concurrency(cs, ms, thr)
    pts = sorted(zip(cs, ms, strict=True))
    assert r.measured_range == (pts[0][0], pts[-1][0])
    if pts[0][1] < thr:
        assert r.kind == "starts-below"
    elif all(m >= thr for _, m in pts):
        assert r.kind == "stays-above"
    else:
        assert r.kind == "crosses"
        assert r.value is not None and r.between is not None
        lo, hi = r.between
        by_c = dict(pts)
        i = [c for c, _ in pts].index(lo)
        assert pts[i + 1][0] == hi  # bracketing points are adjacent measurements
        assert by_c[lo] >= thr > by_c[hi]
        assert all(m >= thr for c, m in pts if c <= lo)  # it is the FIRST crossing
        # every later point at or above the threshold is reported as a recovery, and only those
        assert r.above_again_at == tuple(c for c, m in pts if c > hi and m >= thr)
        # Exactly, value lies in [lo, hi) and equals lo only when m_lo sits on the
        # threshold; in floats the fraction can round to 1 (value == hi) or to 0.
        assert lo <= r.value <= hi
        if by_c[lo] == thr:
            assert r.value == lo
        elif by_c[lo] - thr > 1e-9:
            assert r.value > lo
    # input order does not matter
    order = list(range(len(cs)))
    rnd.shuffle(order)
    assert critical_concurrency([cs[k] for k in order], [ms[k] for k in order], thr) == r


# ------------------------------------------------------------------ sessions


def test_sessions_keeps_the_fraction() -> None:
    assert sessions(100_000, 8_192) == pytest.approx(12.20703125)
    assert sessions(0, 4_096) == 0.0


@no_deadline
@given(st.integers(0, 10_000), st.integers(1, 1 << 20))
def test_sessions_exact_multiples(k: int, ctx: int) -> None:
    assert sessions(k * ctx, ctx) == k


@pytest.mark.parametrize(
    ("tokens", "ctx", "match"),
    [(-1, 10, "kv_cache_tokens"), (100, 0, "context_tokens"), (100, 1.5, "context_tokens")],
)
def test_sessions_rejects(tokens: float, ctx: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sessions(tokens, ctx)


# ------------------------------------------------------------------ mix_multiplier


def test_mix_worked_example() -> None:
    m = mix_multiplier({"free-form": 0.935, "copy": 0.065}, {"free-form": 0.8, "copy": 1.1})
    assert m == pytest.approx(1 / (0.935 / 0.8 + 0.065 / 1.1), rel=1e-12)
    assert m == pytest.approx(0.81444, abs=1e-5)
    # the arithmetic mean of ratios (0.8195) overstates it
    assert m < 0.935 * 0.8 + 0.065 * 1.1


def test_mix_slower_workload_weighs_more() -> None:
    shares = {"slow": 0.5, "fast": 0.5}
    mults = {"slow": 0.8, "fast": 1.2}
    equal = mix_multiplier(shares, mults)
    assert equal == pytest.approx(0.96)
    skewed = mix_multiplier(shares, mults, {"slow": 10.0, "fast": 100.0})
    assert skewed == pytest.approx((0.5 / 10 + 0.5 / 100) / (0.5 / 8 + 0.5 / 120))
    assert skewed < equal  # closer to the slow workload's 0.8
    assert mix_multiplier(shares, mults, {"slow": 100.0, "fast": 10.0}) > equal


def test_mix_zero_share_needs_no_multiplier() -> None:
    assert mix_multiplier({"a": 1.0, "b": 0.0}, {"a": 1.3}) == pytest.approx(1.3)


def test_mix_rejects() -> None:
    with pytest.raises(ValueError, match="sum 0.9"):
        mix_multiplier({"a": 0.5, "b": 0.4}, {"a": 1.0, "b": 1.0})
    with pytest.raises(ValueError, match="'copy'"):
        mix_multiplier({"free": 0.9, "copy": 0.1}, {"free": 1.0})
    with pytest.raises(ValueError, match="baseline.*'copy'"):
        mix_multiplier({"free": 0.9, "copy": 0.1}, {"free": 1.0, "copy": 1.2}, {"free": 50.0})
    with pytest.raises(ValueError, match="> 0"):
        mix_multiplier({"a": 1.0}, {"a": 0.0})


@st.composite
def mixes(draw: st.DrawFn) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    n = draw(st.integers(1, 6))
    raw = draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))
    total = math.fsum(raw)
    names = [f"w{i}" for i in range(n)]
    shares = {w: x / total for w, x in zip(names, raw, strict=True)}
    mults = {w: draw(st.floats(0.1, 5.0)) for w in names}
    base = {w: draw(st.floats(1.0, 1e4)) for w in names}
    return shares, mults, base


@no_deadline
@given(mixes())
def test_mix_lies_between_min_and_max(mix: tuple[dict, dict, dict]) -> None:
    shares, mults, base = mix
    for b in (None, base):
        m = mix_multiplier(shares, mults, b)
        assert min(mults.values()) * (1 - 1e-12) <= m <= max(mults.values()) * (1 + 1e-12)
    # harmonic (equal-baseline) mix never exceeds the arithmetic mean of ratios
    arith = math.fsum(shares[w] * mults[w] for w in shares)
    assert mix_multiplier(shares, mults) <= arith * (1 + 1e-12)


@no_deadline
@given(mixes(), st.floats(0.1, 5.0), st.floats(1.0, 1e4))
def test_mix_equal_multipliers_and_equal_baselines(mix: tuple[dict, dict, dict], m: float, b: float) -> None:
    shares, _, base = mix
    same = dict.fromkeys(shares, m)
    assert mix_multiplier(shares, same) == pytest.approx(m, rel=1e-12)
    assert mix_multiplier(shares, same, base) == pytest.approx(m, rel=1e-12)
    _, mults, _ = mix
    assert mix_multiplier(shares, mults, dict.fromkeys(shares, b)) == pytest.approx(
        mix_multiplier(shares, mults), rel=1e-12
    )


# -- re-run noise of a multiplier -------------------------------------------------------------------


@given(cv_s=st.floats(0.01, 0.5), cv_b=st.floats(0.01, 0.5), n=st.integers(16, 200))
def test_rerun_sd_shrinks_as_one_over_root_repeats(cv_s: float, cv_b: float, n: int) -> None:
    from specledger.analysis.theory import rerun_multiplier_sd

    assert rerun_multiplier_sd(cv_s, cv_b, 4 * n) == pytest.approx(rerun_multiplier_sd(cv_s, cv_b, n) / 2)
    assert rerun_multiplier_sd(cv_s, cv_b, 3) > rerun_multiplier_sd(cv_s, cv_b, 10) > rerun_multiplier_sd(cv_s, cv_b, n)


@given(cv_s=st.floats(0.01, 0.5), cv_b=st.floats(0.01, 0.5), tol=st.floats(0.02, 0.5))
def test_repeats_for_tolerance_is_the_fewest_that_reach_two_sds(cv_s: float, cv_b: float, tol: float) -> None:
    from specledger.analysis.theory import repeats_for_tolerance, rerun_multiplier_sd

    n = repeats_for_tolerance(cv_s, cv_b, tol)
    assert 2 * rerun_multiplier_sd(cv_s, cv_b, n) <= math.log1p(tol)
    assert all(2 * rerun_multiplier_sd(cv_s, cv_b, m) > math.log1p(tol) for m in range(1, n) if m % 2 == n % 2)


def test_predicted_pass_rate_matches_a_simulated_rerun() -> None:
    """Simulate two runs of n noisy repeats per arm; the share within ±15% matches the prediction."""
    import random
    import statistics

    from specledger.analysis.theory import rerun_multiplier_sd, within_tolerance_probability

    rng = random.Random(7)
    cv, n, tol, trials = 0.12, 3, 0.15, 6000

    def multiplier() -> float:
        spec = statistics.median(rng.gauss(1.0, cv) for _ in range(n))
        base = statistics.median(rng.gauss(1.0, cv) for _ in range(n))
        return spec / base

    inside = sum(1 - tol <= multiplier() / multiplier() <= 1 + tol for _ in range(trials)) / trials
    predicted = within_tolerance_probability(rerun_multiplier_sd(cv, cv, n), tol)
    assert inside == pytest.approx(predicted, abs=0.05)


def test_loss_bracket_is_between_the_last_certain_win_and_the_first_certain_loss():
    cs = [1, 2, 4, 8, 16, 64]
    lows = [1.10, 0.81, 0.59, 0.76, 0.95, 1.45]
    highs = [1.29, 1.07, 0.84, 0.96, 1.26, 1.77]
    assert loss_bracket(cs, lows, highs) == (1, 4)
    assert loss_bracket(cs[::-1], lows[::-1], highs[::-1]) == (1, 4)  # order does not matter
    assert loss_bracket([1, 2], [0.9, 0.8], [1.1, 0.95]) == (None, 2)  # no certain win before the loss
    assert loss_bracket([1, 2], [1.1, 0.9], [1.3, 1.1]) is None  # no certain loss: no bracket
    with pytest.raises(ValueError, match="length mismatch"):
        loss_bracket([1, 2], [1.0], [1.0, 1.0])


@given(st.lists(st.tuples(st.floats(0.1, 3.0), st.floats(0.0, 1.0)), min_size=1, max_size=8))
def test_loss_bracket_brackets_the_interpolated_crossing(points):
    """Each estimate sits inside its interval, so a certain loss means the point-estimate curve has
    crossed by then, and the last certain win comes before the first certain loss."""
    cs = [2 ** i for i in range(len(points))]
    mids = [m for m, _ in points]
    lows = [m - w for m, w in points]
    highs = [m + w for m, w in points]
    bracket = loss_bracket(cs, lows, highs)
    crossing = critical_concurrency(cs, mids)
    if bracket is None:
        return
    win, loss = bracket
    assert crossing.kind in ("crosses", "starts-below")
    if crossing.kind == "crosses":
        assert crossing.value <= loss
    assert win is None or win < loss


@pytest.mark.parametrize("bracket, expected", [
    (None, "no interval wholly below 1 within c=1..64"),
    ((None, 1), "below 1 from c=1 (no interval wholly above before it)"),
    ((4, 8), "between c=4 and c=8"),
])
def test_describe_loss_bracket(bracket, expected):
    assert describe_loss_bracket(bracket, [1, 8, 64, 4]) == expected


def test_wins_after_loss_is_a_certain_win_past_the_first_certain_loss():
    # ngram-gpu k=4 on the H200 Qwen copy curve (2026-12-02), the multipliers' 95% CIs
    cs = [1, 2, 4, 8, 64]
    lows, highs = [1.216, 1.083, 0.845, 0.572, 1.234], [1.456, 1.304, 0.990, 0.786, 1.554]
    assert loss_bracket(cs, lows, highs) == (2, 4)
    assert wins_after_loss(cs, lows, highs) == (64,)
    assert (describe_loss_bracket((2, 4), cs, wins_after=(64,))
            == "between c=2 and c=4; wholly above 1 again at c=64")
    lows[-1] = 0.95  # straddling 1.0 at c=64 is no certain win
    assert wins_after_loss(cs, lows, highs) == ()
    assert wins_after_loss([1, 2], [1.1, 1.2], [1.3, 1.4]) == ()  # no certain loss, nothing to come back from
