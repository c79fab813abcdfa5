"""specledger.stats: bootstrap intervals that behave like intervals, and verdicts that say only what they know."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from specledger import stats
from specledger.stats import Estimate, verdict

N_RESAMPLES = 1999  # the properties do not need 9999; the coverage checks use the default

repeats = st.lists(st.floats(min_value=1.0, max_value=1e4, allow_nan=False), min_size=2, max_size=12)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def quantile_sample(n: int, sigma: float) -> np.ndarray:
    """n evenly spaced quantiles of a lognormal: the same distribution at any n, without sampling luck."""
    return np.exp(sigma * sps.norm.ppf((np.arange(n) + 0.5) / n))


def paired_sample(seed: int, n: int, ratio: float, sigma: float, drift_sigma: float = 0.0, *,
                  drift_quantiles: bool = False):
    """Lognormal repeat noise on each arm, times an optional drift that repeat r shares across arms: drawn, or
    (``drift_quantiles``) the lognormal's evenly spaced quantiles in a drawn order, so that its spread is the one
    stated whatever the seed."""
    rng = np.random.default_rng(seed)
    drift = rng.permutation(quantile_sample(n, drift_sigma)) if drift_quantiles else rng.lognormal(0.0, drift_sigma, n)
    return ratio * 100 * drift * rng.lognormal(0.0, sigma, n), 100 * drift * rng.lognormal(0.0, sigma, n)


def width(e: Estimate) -> float:
    return e.high - e.low


# -- intervals --------------------------------------------------------------------------------


@given(repeats, seeds)
def test_mean_interval_contains_the_mean(values, seed):
    e = stats.mean_estimate(values, n_resamples=N_RESAMPLES, seed=seed)
    assert e.value == pytest.approx(float(np.mean(values)))
    assert e.low <= e.value <= e.high and e.n == len(values)


@given(st.data(), seeds)
def test_multiplier_interval_contains_the_multiplier(data, seed):
    spec = data.draw(repeats)
    base = data.draw(st.lists(st.floats(min_value=1.0, max_value=1e4), min_size=len(spec), max_size=len(spec)))
    e = stats.multiplier_estimate(spec, base, n_resamples=N_RESAMPLES, seed=seed)
    assert e.value == pytest.approx(sum(spec) / sum(base)) == stats.multiplier(spec, base)
    assert e.low <= e.value <= e.high


@given(st.integers(min_value=3, max_value=8), st.floats(min_value=0.01, max_value=0.5))
def test_interval_narrows_as_repeats_grow(n, sigma):
    small, large = quantile_sample(n, sigma), quantile_sample(4 * n, sigma)
    assert width(stats.mean_estimate(large, n_resamples=N_RESAMPLES)) < width(
        stats.mean_estimate(small, n_resamples=N_RESAMPLES))
    # Spec and base in opposite quantile order: the multiplier's noise is not constant, and shrinks too.
    narrow = stats.multiplier_estimate(2 * large, large[::-1], n_resamples=N_RESAMPLES)
    wide = stats.multiplier_estimate(2 * small, small[::-1], n_resamples=N_RESAMPLES)
    assert width(narrow) < width(wide)


@settings(max_examples=50)
@given(seeds, st.integers(min_value=5, max_value=12), st.floats(min_value=0.3, max_value=3.0))
def test_pairing_cancels_drift_both_arms_share(seed, n, ratio):
    """A per-repeat drift of 30% multiplies both arms; the arms' own noise is 1%.

    Resampled as pairs the drift cancels in the ratio; resampled independently (what pairing
    avoids) it would widen the interval about thirty-fold. The drift is the lognormal's quantiles: drawn, five
    repeats can share one drift by luck (seed 81806 drew a log SD of 0.043, not 0.3, and there is nothing to cancel).
    """
    spec, base = paired_sample(seed, n, ratio, sigma=0.01, drift_sigma=0.3, drift_quantiles=True)
    paired = stats.multiplier_estimate(spec, base, n_resamples=N_RESAMPLES, seed=seed)
    unpaired = sps.bootstrap((spec, base), lambda s, b, axis: s.mean(axis) / b.mean(axis), vectorized=True,
                             n_resamples=N_RESAMPLES, rng=np.random.default_rng(seed)).confidence_interval
    assert width(paired) < 0.25 * (unpaired.high - unpaired.low)
    assert paired.value == pytest.approx(ratio, rel=0.05)  # the drift cancels in the point value too


@given(st.data(), seeds, st.floats(min_value=1e-3, max_value=1e3), st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_the_arms_scales_the_multiplier_and_its_interval(data, seed, c_spec, c_base):
    spec = np.array(data.draw(repeats))
    base = np.array(data.draw(st.lists(st.floats(1.0, 1e4), min_size=len(spec), max_size=len(spec))))
    e = stats.multiplier_estimate(spec, base, n_resamples=N_RESAMPLES, seed=seed)
    same = stats.multiplier_estimate(c_spec * spec, c_spec * base, n_resamples=N_RESAMPLES, seed=seed)
    scaled = stats.multiplier_estimate(c_spec * spec, c_base * base, n_resamples=N_RESAMPLES, seed=seed)
    for a, b, k in ((e, same, 1.0), (e, scaled, c_spec / c_base)):
        assert [b.value, b.low, b.high] == pytest.approx([k * a.value, k * a.low, k * a.high], rel=1e-6)


@given(st.data(), seeds)
def test_same_data_and_seed_give_the_same_interval(data, seed):
    spec = data.draw(repeats)
    base = data.draw(st.lists(st.floats(1.0, 1e4), min_size=len(spec), max_size=len(spec)))
    assert stats.multiplier_estimate(spec, base, n_resamples=N_RESAMPLES, seed=seed) == stats.multiplier_estimate(
        list(spec), list(base), n_resamples=N_RESAMPLES, seed=seed)
    assert stats.throughput_change(spec, base, seed=seed, n_resamples=N_RESAMPLES) == stats.throughput_change(
        spec, base, seed=seed, n_resamples=N_RESAMPLES)


def test_identical_repeats_give_the_point_as_both_bounds():
    assert stats.mean_estimate([50.0] * 5) == Estimate(50.0, 50.0, 50.0, 5)
    # Spec an exact multiple of base, repeat by repeat: every paired resample gives the same ratio.
    e = stats.multiplier_estimate([150.0, 300.0, 225.0], [100.0, 200.0, 150.0])
    assert (e.low, e.value, e.high) == (1.5, 1.5, 1.5)


def test_two_repeats_still_give_an_interval():
    e = stats.multiplier_estimate([1.0, 2.0], [2.0, 2.5])
    assert all(math.isfinite(x) for x in e.interval) and e.low <= e.value <= e.high
    assert e.low == pytest.approx(0.5) and e.high == pytest.approx(0.8)  # the extreme resamples


def test_changes_resample_fresh_and_committed_independently():
    """Fresh and committed of one distribution: the change's interval is wider than either multiplier's."""
    fresh_spec, fresh_base = paired_sample(1, 8, 1.5, 0.05)
    committed_spec, committed_base = paired_sample(2, 8, 1.5, 0.05)
    change = stats.multiplier_change(fresh_spec, fresh_base, committed_spec, committed_base)
    fresh = stats.multiplier_estimate(fresh_spec, fresh_base)
    committed = stats.multiplier_estimate(committed_spec, committed_base)
    assert change.value == pytest.approx(fresh.value / committed.value - 1)
    assert change.half_width > max(fresh.half_width_rel, committed.half_width_rel)
    assert change.low < 0 < change.high
    t = stats.throughput_change(fresh_base, committed_base)
    assert t.value == pytest.approx(fresh_base.mean() / committed_base.mean() - 1) and t.low < 0 < t.high


def test_coverage_of_the_paired_multiplier_interval():
    """Lognormal noise (10%) and drift (10%), n=8, true ratio 1.5: the 95% interval covers it ~95% of the time.

    BCa under-covers a little at n=8 (here about 91%); below 88% or above 99% the intervals are wrong.
    """
    covered = 0
    for trial in range(300):
        spec, base = paired_sample(10_000 + trial, 8, 1.5, sigma=0.1, drift_sigma=0.1)
        e = stats.multiplier_estimate(spec, base, seed=trial)
        covered += e.low <= 1.5 <= e.high
    assert 0.88 <= covered / 300 <= 0.99


def test_coverage_of_an_unchanged_multiplier():
    """A re-run of an unchanged machine: the change's interval covers 0 at about the stated confidence."""
    covered = 0
    for trial in range(200):
        fresh, committed = paired_sample(2 * trial, 8, 1.5, 0.1, 0.1), paired_sample(2 * trial + 1, 8, 1.5, 0.1, 0.1)
        e = stats.multiplier_change(*fresh, *committed, seed=trial, n_resamples=N_RESAMPLES)
        covered += e.low <= 0 <= e.high
    assert 0.88 <= covered / 200 <= 0.99


@pytest.mark.parametrize(("call", "message"), [
    (lambda: stats.mean_estimate([1.0]), "at least 2 repeats"),
    (lambda: stats.multiplier_estimate([1.0], [1.0]), "at least 2 repeats"),
    (lambda: stats.throughput_change([1.0, 2.0], [3.0]), "at least 2 repeats"),
    (lambda: stats.multiplier_change([1.0, 2.0], [1.0, 2.0], [1.0], [1.0]), "at least 2 repeats"),
    (lambda: stats.multiplier_estimate([1.0, 2.0], [0.0, 0.0]), "positive mean"),
    (lambda: stats.multiplier([1.0, 2.0], [0.0, 0.0]), "positive mean"),
    (lambda: stats.throughput_change([1.0, 2.0], [0.0, 0.0]), "positive mean"),
    (lambda: stats.multiplier_change([1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [1.0, 2.0]), "positive mean"),
    (lambda: stats.multiplier_estimate([1.0, 2.0, 3.0], [1.0, 2.0]), "as many spec as base"),
    (lambda: stats.mean_estimate([1.0, math.nan]), "non-finite"),
])
def test_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_estimate_helpers():
    e = Estimate(2.0, 1.9, 2.2, 5)
    assert e.interval == [1.9, 2.2] and e.half_width == pytest.approx(0.15)
    assert e.half_width_rel == pytest.approx(0.075)
    assert Estimate(1.2345, 1.23449, 1.23461, 5).rounded(3) == [1.234, 1.235]  # outward
    assert Estimate(0.0, -0.1, 0.1, 5).half_width_rel == math.inf


# -- verdicts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("low", "high", "outcome", "direction"), [
    (-0.15, 0.15, "holds", None),  # the bounds are inside
    (-0.1500001, 0.0, "inconclusive", None),
    (0.0, 0.1500001, "inconclusive", None),
    (-0.3, -0.15, "inconclusive", None),  # touching the tolerance is not outside it
    (-0.3, -0.1500001, "changed", "down"),
    (0.1500001, 0.3, "changed", "up"),
    (-0.2, 0.2, "inconclusive", None),
])
def test_verdict_boundaries(low, high, outcome, direction):
    v = verdict(Estimate((low + high) / 2, low, high, 5), 0.15, n_fresh=5)
    assert (v.outcome, v.direction) == (outcome, direction)
    assert (v.repeats_needed is None) == (outcome != "inconclusive")


def test_repeats_needed():
    # Within the tolerance: half-width 0.121 must shrink to 0.15 - 0.09 = 0.06, so 5 * (0.121/0.06)^2 = 20.3.
    assert verdict(Estimate(-0.09, -0.211, 0.031, 5), 0.15, n_fresh=5).repeats_needed == 21
    # Outside it: half-width 0.1 must shrink to 0.2 - 0.15 = 0.05, so 5 * 4 = 20 exactly.
    assert verdict(Estimate(0.2, 0.1, 0.3, 5), 0.15, n_fresh=5).repeats_needed == 20
    # At the tolerance no number of repeats settles it.
    assert verdict(Estimate(0.15, 0.05, 0.25, 5), 0.15, n_fresh=5).repeats_needed is None
    # An asymmetric interval already narrow enough still asks for more repeats than it had.
    assert verdict(Estimate(0.0, -0.01, 0.2, 5), 0.15, n_fresh=5).repeats_needed == 6


def test_repeats_needed_when_the_committed_side_is_known():
    """Half-width 0.121 = sqrt(fresh^2 + 0.05^2): only the fresh 0.110 shrinks, to sqrt(0.06^2 - 0.05^2)."""
    change = Estimate(-0.09, -0.211, 0.031, 5)
    fresh_sq, target_sq = 0.121**2 - 0.05**2, 0.06**2 - 0.05**2
    v = verdict(change, 0.15, n_fresh=5, committed_half_width_rel=0.05)
    assert v.repeats_needed == math.ceil(5 * fresh_sq / target_sq) > verdict(change, 0.15, n_fresh=5).repeats_needed
    # The committed interval alone is wider than the target: no number of fresh repeats settles it.
    v = verdict(change, 0.15, n_fresh=5, committed_half_width_rel=0.07)
    assert v.repeats_needed is None and "cannot settle" in v.line()


def test_verdict_lines():
    assert verdict(Estimate(0.031, -0.04, 0.098, 5), 0.15, n_fresh=5).line() == (
        "holds: change +3.1% (95% CI -4.0%..+9.8%) within ±15%")
    assert verdict(Estimate(-0.31, -0.402, -0.22, 5), 0.15, n_fresh=5).line() == (
        "changed (down): change -31.0% (95% CI -40.2%..-22.0%) outside ±15%")
    assert verdict(Estimate(-0.09, -0.213, 0.029, 3), 0.15, n_fresh=3).line() == (
        "inconclusive: change -9.0% (95% CI -21.3%..+2.9%) straddles ±15%; about 13 fresh repeats would settle it")
    assert "cannot settle" in verdict(Estimate(0.15, 0.05, 0.25, 5), 0.15, n_fresh=5).line()


def test_verdict_on_measured_changes():
    spec, base = paired_sample(3, 8, 1.5, 0.03)
    committed_spec, committed_base = paired_sample(4, 8, 1.5, 0.03)
    assert verdict(stats.multiplier_change(spec, base, committed_spec, committed_base), 0.15,
                   n_fresh=8).outcome == "holds"
    slower = verdict(stats.multiplier_change(0.7 * spec, base, committed_spec, committed_base), 0.15, n_fresh=8)
    assert (slower.outcome, slower.direction) == ("changed", "down")


def test_verdict_rejects_bad_arguments():
    with pytest.raises(ValueError, match="tolerance"):
        verdict(Estimate(0.0, -0.1, 0.1, 5), 0.0, n_fresh=5)
    with pytest.raises(ValueError, match="n_fresh"):
        verdict(Estimate(0.0, -0.1, 0.1, 5), 0.15, n_fresh=0)


# -- planning ---------------------------------------------------------------------------------


def test_predicted_change_half_width_and_resolvable():
    assert stats.predicted_change_half_width(0.1, 5, 5) == pytest.approx(0.1 * math.sqrt(2))
    assert stats.predicted_change_half_width(0.1, 5, 20) == pytest.approx(0.1 * math.sqrt(1.25))
    assert stats.resolvable(0.1, 5, 12, 0.15)  # 0.1 * sqrt(1 + 5/12) = 0.119
    assert not stats.resolvable(0.13, 5, 12, 0.15)  # 0.155
    with pytest.raises(ValueError):
        stats.predicted_change_half_width(0.1, 0, 5)


@given(st.floats(min_value=0.001, max_value=1.0), st.integers(1, 20), st.integers(1, 20))
def test_more_fresh_repeats_never_predict_a_wider_change(h, n_committed, n_fresh):
    assert stats.predicted_change_half_width(h, n_committed, n_fresh + 1) <= stats.predicted_change_half_width(
        h, n_committed, n_fresh)
    assert stats.predicted_change_half_width(h, n_committed, n_fresh) >= h


# -- across engine starts ---------------------------------------------------------------------------------------


def started_sample(seed: int, n_starts: int, pairs: int, ratio: float, *, between: float, within: float
                   ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Paired windows from `n_starts` engine starts: each start draws its own host state, which moves the
    multiplier by a lognormal factor (sd `between` in logs), and each window adds its own noise (sd `within`)."""
    rng = np.random.default_rng(seed)
    spec, base, starts = [], [], []
    for s in range(n_starts):
        start_ratio = ratio * math.exp(rng.normal(0.0, between))
        level = 5000.0 * math.exp(rng.normal(0.0, between))
        for _ in range(pairs):
            b = level * math.exp(rng.normal(0.0, within))
            spec.append(b * start_ratio * math.exp(rng.normal(0.0, within)))
            base.append(b)
            starts.append(s)
    return np.array(spec), np.array(base), starts


def test_windows_of_one_start_miss_the_between_start_spread_and_replications_cover_it():
    """Host state drawn per start (8% in logs, as between the lent H200 runs), windows 5% each: the window
    bootstrap of one start covers the machine type's multiplier far less often than it claims, the t interval
    over four starts about as often as it claims."""
    truth, trials = 1.4, 200
    one_start = replicated = 0
    for trial in range(trials):
        spec, base, starts = started_sample(trial, 4, 6, truth, between=0.08, within=0.05)
        first = [i for i, s in enumerate(starts) if s == 0]
        e = stats.multiplier_estimate(spec[first], base[first], seed=trial, n_resamples=N_RESAMPLES)
        one_start += e.low <= truth <= e.high
        r = stats.replicated_estimate(stats.start_multipliers(spec, base, starts))
        replicated += r.low <= truth <= r.high
    assert one_start / trials < 0.6, one_start
    assert 0.9 <= replicated / trials <= 0.99, replicated


def test_a_fresh_start_of_an_unchanged_machine_type_is_covered_at_the_stated_confidence():
    """One nightly start against six committed starts, nothing changed: the change's interval covers 0 ~95%."""
    covered, trials = 0, 300
    for trial in range(trials):
        c_spec, c_base, c_starts = started_sample(2 * trial, 6, 4, 1.4, between=0.08, within=0.05)
        f_spec, f_base, f_starts = started_sample(2 * trial + 1, 1, 4, 1.4, between=0.08, within=0.05)
        e = stats.replicated_change(stats.start_multipliers(f_spec, f_base, f_starts),
                                    stats.start_multipliers(c_spec, c_base, c_starts))
        covered += e.low <= 0 <= e.high
    assert 0.9 <= covered / trials <= 0.99, covered


def test_a_spread_pooled_over_a_curves_points_covers_each_point_with_far_narrower_intervals():
    """Six points of a curve, two starts each (a visit measures the whole curve in one start), host state drawn per
    start: each point's own t interval has 1 degree of freedom (t = 12.7) and is very wide; the spread pooled over
    the six points gives 6 degrees of freedom, and still covers each point's multiplier about as often as it claims.
    A point of one start gets an interval from the pooled spread too, and it covers as claimed, where the window
    bootstrap of that start does not."""
    truths, trials = [1.9, 1.5, 1.1, 1.0, 1.4, 1.8], 150
    own = pooled = single = 0
    own_width, pooled_width = [], []
    for trial in range(trials):
        per_point = []
        for j, truth in enumerate(truths):
            spec, base, starts = started_sample(1000 * trial + j, 2, 6, truth, between=0.08, within=0.05)
            per_point.append((truth, stats.start_multipliers(spec, base, starts)))
        spread = stats.pooled_start_spread([per_start for _, per_start in per_point])
        assert spread is not None and spread.df == len(truths) and spread.points == len(truths)
        for truth, per_start in per_point:
            e, p = stats.replicated_estimate(per_start), stats.replicated_estimate(per_start, spread=spread)
            own += e.low <= truth <= e.high
            pooled += p.low <= truth <= p.high
            own_width.append(e.high / e.low)
            pooled_width.append(p.high / p.low)
        truth, per_start = per_point[0]
        one = stats.replicated_estimate(per_start[:1], spread=spread)
        single += one.low <= truth <= one.high
    n = trials * len(truths)
    assert 0.9 <= pooled / n <= 0.99, pooled
    assert 0.9 <= own / n <= 0.995, own
    assert np.median(pooled_width) < 0.5 * np.median(own_width), (np.median(pooled_width), np.median(own_width))
    assert 0.88 <= single / trials <= 1.0, single


def test_with_a_pooled_spread_one_fresh_start_is_judged_against_one_committed_start():
    """Nightly: one fresh start against a point recorded in one start, nothing changed; the ledger's spread pooled
    over its other points (here 5 points of 2 starts) lets the change's interval cover 0 about as claimed."""
    covered, trials = 0, 300
    for trial in range(trials):
        groups = [stats.start_multipliers(*started_sample(10 * trial + j, 2, 4, 1.4, between=0.08, within=0.05))
                  for j in range(5)]
        spread = stats.pooled_start_spread(groups)
        c = stats.start_multipliers(*started_sample(10 * trial + 7, 1, 4, 1.4, between=0.08, within=0.05))
        f = stats.start_multipliers(*started_sample(10 * trial + 8, 1, 4, 1.4, between=0.08, within=0.05))
        e = stats.replicated_change(f, c, spread=spread)
        covered += e.low <= 0 <= e.high
    assert 0.9 <= covered / trials <= 0.99, covered


def test_a_pooled_spread_is_the_within_group_mean_square_of_the_logs():
    s = stats.pooled_start_spread([[1.0, math.e ** 0.2], [2.0], [3.0, 3.0 * math.e ** -0.2, 3.0 * math.e ** 0.2]])
    # logs' deviations: (+-0.1) and (0, -0.2, +0.2): SS = 0.02 + 0.08 over df = 1 + 2
    assert s is not None and (s.df, s.points) == (3, 2)
    assert s.log_sd == pytest.approx(math.sqrt(0.1 / 3))
    assert stats.pooled_start_spread([[1.2], [1.4]]) is None


def test_the_spread_homogeneity_test_tells_a_point_of_wild_starts_from_points_alike():
    """Bartlett over points of 3 starts each: alike spreads pass, one point 20 times as spread is caught, and what
    cannot be tested (one pooled point, a point whose starts agree exactly) says so instead of a number."""
    rng = np.random.default_rng(7)
    alike = [list(np.exp(rng.normal(0.3, 0.1, 3))) for _ in range(6)]
    test = stats.start_spread_homogeneity(alike)
    assert test is not None and test.points == 6 and test.p_value > 0.05
    wild = alike[:5] + [list(np.exp(rng.normal(0.3, 2.0, 3)))]
    caught = stats.start_spread_homogeneity(wild)
    assert caught is not None and caught.p_value < 0.01 < test.p_value
    assert stats.start_spread_homogeneity(alike[:1] + [[1.3]]) is None  # one point of two or more starts
    assert stats.start_spread_homogeneity(alike[:3] + [[1.3, 1.3]]) is None  # log variance of 0: undefined


@given(st.lists(st.floats(0.2, 5.0), min_size=2, max_size=8), st.floats(0.1, 10.0))
def test_scaling_every_start_scales_the_replicated_estimate(per_start, c):
    e, scaled = stats.replicated_estimate(per_start), stats.replicated_estimate([c * x for x in per_start])
    assert scaled.value == pytest.approx(c * e.value, rel=1e-9)
    assert scaled.low == pytest.approx(c * e.low, rel=1e-9) and scaled.high == pytest.approx(c * e.high, rel=1e-9)
    assert e.low <= e.value <= e.high and e.n == len(per_start)


@given(st.lists(st.floats(0.2, 5.0), min_size=2, max_size=8), st.floats(0.5, 2.0))
def test_a_replicated_change_is_the_ratio_of_geometric_means(committed, factor):
    fresh = [factor * x for x in committed]
    e = stats.replicated_change(fresh, committed)
    assert e.value == pytest.approx(factor - 1, rel=1e-9, abs=1e-12)
    assert e.low <= e.value <= e.high


def test_per_start_figures_group_windows_by_their_start():
    assert stats.start_multipliers([2, 2, 3, 3, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 2]) == [2.0, 3.0, 1.0]
    assert stats.start_means([1, 3, 10, 20], [5, 5, 2, 2]) == [2.0, 15.0]  # in the order the starts came


def test_identical_starts_give_the_point_as_both_bounds():
    e = stats.replicated_estimate([1.3, 1.3, 1.3])
    assert (e.low, e.value, e.high) == pytest.approx((1.3, 1.3, 1.3))
    c = stats.replicated_change([1.3], [1.3, 1.3])
    assert (c.low, c.value, c.high) == pytest.approx((0.0, 0.0, 0.0))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: stats.replicated_estimate([1.4]), "at least 2 starts"),
    (lambda: stats.replicated_change([1.4], [1.3]), "3 starts in all"),
    (lambda: stats.pooled_start_spread([[1.4, -1.0]]), "positive and finite"),
    (lambda: stats.replicated_estimate([1.4, 0.0]), "positive and finite"),
    (lambda: stats.start_multipliers([1.0, 2.0], [1.0, 2.0], [0]), "one start index per repeat"),
])
def test_replication_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_host_elasticity_is_the_slope_within_points_not_across_them():
    """Starts of a point whose figure falls 10% per doubled host slice, on a curve where the slow-host points are
    also the high-multiplier ones: the within-point slope recovers -10% (its interval covers the truth, excludes
    0), where a pooled regression across points would read the curve's shape as a host effect of the other sign."""
    rng = np.random.default_rng(3)
    truth = math.log2(0.9)
    groups = []
    for level, host_centre in zip((0.5, 1.0, 1.5, 2.0), (10.0, 14.0, 20.0, 26.0), strict=True):
        host = list(host_centre * np.exp(rng.uniform(-0.5, 0.5, 3)))
        figure = [level * h**truth * math.exp(rng.normal(0, 0.01)) for h in host]
        groups.append((host, figure))
    e = stats.host_elasticity(groups)
    assert e is not None and (e.starts, e.points, e.df) == (12, 4, 7)
    assert e.low < truth < e.high < 0 and e.r < -0.9
    change, low, high = e.per_doubling()
    assert change == pytest.approx(-0.1, abs=0.02) and low < change < high < 0
    across = np.polyfit(np.log([h for g in groups for h in g[0]]), np.log([f for g in groups for f in g[1]]), 1)[0]
    assert across > 0  # the confound the within-point slope removes
    assert (e.host_ms_min, e.host_ms_max) == pytest.approx(
        (min(h for g in groups for h in g[0]), max(h for g in groups for h in g[0])))


def test_a_host_elasticity_needs_starts_that_differ_in_host_slice_and_a_degree_of_freedom():
    assert stats.host_elasticity([([10.0], [1.2]), ([12.0], [1.1])]) is None  # one start a point
    assert stats.host_elasticity([([10.0, 20.0], [1.2, 1.1])]) is None  # two starts, one point: df 0
    assert stats.host_elasticity([([10.0, 10.0], [1.2, 1.1]), ([15.0, 15.0], [1.0, 1.3])]) is None  # same host
    with pytest.raises(ValueError, match="3 host slices for 2 engine starts"):
        stats.host_elasticity([([10.0, 11.0, 12.0], [1.2, 1.1])])
