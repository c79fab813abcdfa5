"""Speculation policy: which draft length k to run at which batch size, derived from a ledger.

Speculation cannot be switched per request, but vLLM can switch k (0 = no speculation) by the
running batch size: ``speculative_config.num_speculative_tokens_per_batch_size =
[[start, end, k], ...]``. This module turns a ledger's measured curve into such a schedule,
explains every boundary with the points behind it and, because some engines drop the schedule,
states the same decision as routing advice (which concurrency band goes to a speculative
endpoint, which to a plain one). Pure: no vLLM import, no engine.

The rules, so that a schedule can be re-derived by hand:

* **Win rule.** A speculative arm beats the baseline at a point only if the noise cannot explain
  the win. Where the point states the multiplier's 95% CI (protocol v3: paired bootstrap of the
  ratio of medians), that CI must lie wholly above 1.0. Without it (protocol v1/v2, reference
  figures) the arm's repeat range must lie wholly above the baseline's, ``arm.min > baseline.max``;
  without min/max (one repeat) the range is the median alone. The range rule is the stricter of
  the two and was the only one before v3: on the H200 Qwen curve it called ngram-gpu's c=2 point
  (1.191x, CI 1.083..1.304) a loss because one baseline window out of ten was fast. Among arms
  that win, the highest median is chosen (a tie goes to the smaller k: less drafting). No
  winner: k = 0.
* **Boundary rule.** Between two consecutive measured concurrencies a < b with different
  choices, a's band ends at ``floor(sqrt(a * b))``, the geometric midpoint: sweeps are spaced
  in powers of two and crossings are interpolated in log2(concurrency) elsewhere
  (`theory.critical_concurrency`). A boundary with unmeasured batch sizes between a and b
  (b > a + 1) is marked: the schedule is only as fine as the sweep.
* **Coverage.** Bands cover batch sizes 1 .. the largest measured concurrency, contiguous and
  non-overlapping; vLLM requires the first range to start at 1, so a sweep that starts above 1
  extends its first choice down (marked as extrapolated), and vLLM carries the last range's k
  forward up to max_num_seqs (``build_dynamic_sd_schedule_lookup``), which is extrapolation too.
* **Batch size is not concurrency.** The engine looks k up by the number of requests in a
  step (``len(num_scheduled_tokens)``), which is at most the client concurrency and lower
  during ramps and tails; bands keyed by measured concurrency approximate that.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from specledger.ledger import Ledger

if TYPE_CHECKING:
    from specledger.analysis.schedule_support import Support

__all__ = [
    "Band",
    "Boundary",
    "Choice",
    "Policy",
    "Route",
    "Throughput",
    "bands_from_choices",
    "beats",
    "choose",
    "derive_policies",
    "derive_policy",
    "drafter_groups",
    "drafter_key",
    "policy_document",
    "render_policy",
]

#: speculative_config keys that the schedule changes; every other key names the drafter.
_K_KEYS = ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")


# --------------------------------------------------------------------------------------------
# one point: which k wins
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """Output tokens/s of one arm at one point: the median and the repeat range, and for a speculative arm of
    a v3 point the 95% CI of its multiplier over the baseline (what the win rule uses when present)."""

    median: float
    low: float
    high: float
    multiplier_ci95: tuple[float, float] | None = None

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> Throughput | None:
        """From a point's arm result; None when it has no throughput (nothing to compare)."""
        tps = result.get("output_tokens_per_s")
        if not isinstance(tps, Mapping) or "median" not in tps:
            return None
        median = float(tps["median"])
        ci = result.get("multiplier_ci95")
        ci95 = (float(ci[0]), float(ci[1])) if isinstance(ci, Sequence) and len(ci) == 2 else None
        return cls(median, float(tps.get("min", median)), float(tps.get("max", median)), ci95)

    def describe(self) -> str:
        if self.low == self.high == self.median:
            return f"{self.median:.1f}"
        return f"{self.median:.1f} [{self.low:.1f}..{self.high:.1f}]"


def beats(candidate: Throughput, baseline: Throughput) -> bool:
    """The win rule: the multiplier's 95% CI lies wholly above 1.0 (v3), else the candidate's slowest repeat
    is faster than the baseline's fastest."""
    if candidate.multiplier_ci95 is not None:
        return candidate.multiplier_ci95[0] > 1.0
    return candidate.low > baseline.high


def choose(baseline: Throughput, candidates: Mapping[int, Throughput]) -> int:
    """k for one point: the highest median among the k that beat the baseline, else 0."""
    winners = [(t.median, -k, k) for k, t in candidates.items() if k > 0 and beats(t, baseline)]
    return max(winners)[2] if winners else 0


@dataclass(frozen=True)
class Choice:
    """The decision at one measured concurrency, with the figures it rests on."""

    concurrency: int
    k: int
    arm: str | None  # None: no speculation
    baseline: Throughput
    candidates: Mapping[str, Throughput]  # arm name -> figures, ledger order
    matched: Throughput | None = None  # the matched baseline, when the ledger has one

    def reason(self, baseline_name: str, ks: Mapping[str, int]) -> str:
        base = self.baseline
        if self.arm is None:
            close = [n for n, t in self.candidates.items() if t.median > base.median]
            if not close:
                return f"k=0: no arm beats {baseline_name}"
            names = ", ".join(f"{n} k={ks[n]}" for n in close)
            cis = [self.candidates[n].multiplier_ci95 for n in close]
            if all(ci is not None for ci in cis):
                shown = ", ".join(f"{ci[0]:.3f}..{ci[1]:.3f}" for ci in cis if ci is not None)
                return f"k=0: {names} has a higher median, but its multiplier's 95% CI ({shown}) reaches 1.0"
            return (f"k=0: {names} has a higher median, but not beyond the spread "
                    f"(min <= {baseline_name} max {base.high:.1f})")
        won = self.candidates[self.arm]
        if won.multiplier_ci95 is not None:
            low, high = won.multiplier_ci95
            return (f"k={self.k}: {self.arm} multiplier 95% CI {low:.3f}..{high:.3f} > 1, "
                    f"highest median among the winners")
        return (f"k={self.k}: {self.arm} min {won.low:.1f} > {baseline_name} max {base.high:.1f}, "
                f"highest median among the winners")


# --------------------------------------------------------------------------------------------
# many points: bands, boundaries, routes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """Batch sizes start..end (inclusive) that run with draft length k."""

    start: int
    end: int
    k: int
    measured: tuple[int, ...]  # measured concurrencies inside the band

    @property
    def extrapolated_below(self) -> bool:
        """The band reaches below its lowest measured concurrency (only the first band can)."""
        return self.start == 1 and self.measured[0] > 1


@dataclass(frozen=True)
class Boundary:
    """Where k changes: ``at`` is the first batch size of the upper band."""

    at: int
    below: int  # the last measured concurrency under it
    above: int  # the first measured concurrency over it
    k_below: int
    k_above: int

    @property
    def between_measured(self) -> bool:
        """Batch sizes strictly between the two measured points were not measured."""
        return self.above > self.below + 1


def bands_from_choices(choices: Mapping[int, int]) -> list[Band]:
    """Contiguous bands over 1..max(concurrency) from {measured concurrency: k} (boundary rule)."""
    if not choices:
        raise ValueError("no measured concurrencies to build a schedule from")
    points = sorted(choices.items())
    if points[0][0] < 1:
        raise ValueError(f"concurrency must be >= 1, got {points[0][0]}")
    bands: list[Band] = []
    start, measured, k = 1, [points[0][0]], points[0][1]
    for (c_lo, _), (c_hi, k_hi) in zip(points, points[1:], strict=False):
        if k_hi == k:
            measured.append(c_hi)
            continue
        end = math.isqrt(c_lo * c_hi)  # floor of the geometric midpoint: c_lo <= end < c_hi
        bands.append(Band(start, end, k, tuple(measured)))
        start, measured, k = end + 1, [c_hi], k_hi
    bands.append(Band(start, points[-1][0], k, tuple(measured)))
    return bands


def boundaries_of(bands: Sequence[Band]) -> list[Boundary]:
    return [Boundary(hi.start, lo.measured[-1], hi.measured[0], lo.k, hi.k) for lo, hi in zip(bands, bands[1:],
                                                                                            strict=False)]


@dataclass(frozen=True)
class Route:
    """A concurrency band and the endpoint it should go to when the engine ignores the schedule."""

    start: int
    end: int  # the last band's end is the largest measured concurrency; traffic above goes the same way
    endpoint: Literal["speculative", "plain"]
    arm: str  # the measured arm that serves it (the baseline for a plain endpoint)
    k: int


# --------------------------------------------------------------------------------------------
# the ledger side
# --------------------------------------------------------------------------------------------


def drafter_key(arm: Mapping[str, Any]) -> str:
    """Arms that differ only in k are one drafter: a schedule can switch k, not the method."""
    spec = {key: value for key, value in arm["speculative_config"].items() if key not in _K_KEYS}
    return json.dumps([spec, arm.get("engine_args", {}), arm.get("env", {})], sort_keys=True)


def drafter_groups(ledger: Ledger) -> dict[str, list[str]]:
    """Speculative arms with a vLLM config, grouped by drafter; label -> arm names (ledger order).

    The label is the method, or the first arm's name when two drafters share a method.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for arm in ledger.arms:
        if arm["role"] == "speculative" and arm.get("speculative_config", {}).get("num_speculative_tokens"):
            groups.setdefault(drafter_key(arm), []).append(arm)
    methods = [arms[0]["speculative_config"]["method"] for arms in groups.values()]
    out: dict[str, list[str]] = {}
    for arms in groups.values():
        method = arms[0]["speculative_config"]["method"]
        label = method if methods.count(method) == 1 else arms[0]["name"]
        ks = [a["speculative_config"]["num_speculative_tokens"] for a in arms]
        if len(set(ks)) != len(ks):
            raise ValueError(f"{ledger.file}: drafter {label!r} has two arms with the same k: {ks}")
        out[label] = [a["name"] for a in arms]
    return out


@dataclass(frozen=True)
class Policy:
    """One drafter's schedule for one (workload, temperature) of one ledger."""

    ledger_id: str
    workload: str
    temperature: float | None
    drafter: str
    baseline: str
    matched_baseline: str | None
    arms: Mapping[str, int]  # arm name -> k
    configs: Mapping[str, Mapping[str, Any]]  # arm name -> speculative_config, verbatim
    arm_settings: Mapping[str, Any]  # engine_args / env the drafter's arms share
    choices: tuple[Choice, ...]
    bands: tuple[Band, ...]

    @property
    def boundaries(self) -> list[Boundary]:
        return boundaries_of(self.bands)

    @property
    def max_k(self) -> int:
        return max(band.k for band in self.bands)

    def arm_for(self, k: int) -> str | None:
        return next((name for name, arm_k in self.arms.items() if arm_k == k), None)

    def schedule(self) -> list[list[int]]:
        """vLLM's num_speculative_tokens_per_batch_size."""
        return [[band.start, band.end, band.k] for band in self.bands]

    def speculative_config(self) -> dict[str, Any] | None:
        """The winning arm's config with the schedule; None when no band speculates (serve plain)."""
        if self.max_k == 0:
            return None
        arm = self.arm_for(self.max_k)
        assert arm is not None
        config = {key: value for key, value in self.configs[arm].items() if key not in _K_KEYS}
        config["num_speculative_tokens"] = self.max_k
        config["num_speculative_tokens_per_batch_size"] = self.schedule()
        return config

    def policy_arm(self, name: str | None = None) -> dict[str, Any] | None:
        """A ledger arm (role policy) that runs this schedule, for engines that honour it."""
        config = self.speculative_config()
        if config is None:
            return None
        temp = "" if self.temperature is None else f" T={self.temperature:g}"
        arm: dict[str, Any] = {
            "name": name or f"policy-{self.drafter}",
            "role": "policy",
            "description": f"schedule derived by `specledger policy` from {self.ledger_id} ({self.workload}{temp})",
            "speculative_config": config,
        }
        arm.update(self.arm_settings)
        return arm

    def routing(self) -> list[Route]:
        """The schedule as endpoints: k > 0 bands to the arm measured with that k, k = 0 to the baseline."""
        routes: list[Route] = []
        for band in self.bands:
            if band.k == 0:
                routes.append(Route(band.start, band.end, "plain", self.baseline, 0))
            else:
                routes.append(Route(band.start, band.end, "speculative", self.arm_for(band.k) or "?", band.k))
        return routes


def derive_policy(ledger: Ledger, workload: str, temperature: float | None, drafter: str) -> Policy:
    """The policy for one drafter at one (workload, temperature); ValueError if nothing is measured."""
    groups = drafter_groups(ledger)
    if drafter not in groups:
        raise ValueError(f"{ledger.file}: no drafter {drafter!r} (drafters: {', '.join(groups) or 'none'})")
    names = groups[drafter]
    baseline = ledger.baseline_arm_for(names[0])
    if baseline is None:
        raise ValueError(f"{ledger.file}: arm {names[0]!r} has no baseline to compare against")
    matched = ledger.matched_baseline_for(names[0])
    ks = {name: int(ledger.arm(name)["speculative_config"]["num_speculative_tokens"]) for name in names}
    wanted_t = None if temperature is None else float(temperature)
    choices: list[Choice] = []
    for point in ledger.points:
        _, t, c = Ledger.point_key(point)
        if point["workload"] != workload or t != wanted_t or c is None:
            continue
        results = point["arms"]
        base = Throughput.of(results.get(baseline, {}))
        if base is None:
            continue
        figures = {name: f for name in names if (f := Throughput.of(results.get(name, {}))) is not None}
        k = choose(base, {ks[name]: f for name, f in figures.items()})
        arm = next((name for name in names if ks[name] == k), None) if k else None
        matched_tps = Throughput.of(results.get(matched, {})) if matched else None
        choices.append(Choice(c, k, arm, base, figures, matched_tps))
    if not choices:
        temp = "null" if wanted_t is None else f"{wanted_t:g}"
        raise ValueError(f"{ledger.file}: no measured points for workload {workload!r} at temperature {temp} "
                         f"with a {baseline!r} throughput")
    choices.sort(key=lambda ch: ch.concurrency)
    first = ledger.arm(names[0])
    settings = {key: first[key] for key in ("engine_args", "env") if first.get(key)}
    return Policy(
        ledger_id=ledger.id, workload=workload, temperature=wanted_t, drafter=drafter, baseline=baseline,
        matched_baseline=matched, arms=ks, configs={n: ledger.arm(n)["speculative_config"] for n in names},
        arm_settings=settings, choices=tuple(choices),
        bands=tuple(bands_from_choices({ch.concurrency: ch.k for ch in choices})),
    )


def derive_policies(ledger: Ledger, workload: str | None = None, temperature: float | None = None,
                    drafter: str | None = None) -> list[Policy]:
    """Every (workload, temperature, drafter) the ledger measured, narrowed by the arguments given."""
    conditions: list[tuple[str, float | None]] = []
    for point in ledger.points:
        key = Ledger.point_key(point)
        if key[2] is None or (workload is not None and key[0] != workload):
            continue
        if temperature is not None and key[1] != float(temperature):
            continue
        if key[:2] not in conditions:
            conditions.append(key[:2])
    drafters = [drafter] if drafter is not None else list(drafter_groups(ledger))
    return [derive_policy(ledger, w, t, d) for w, t in conditions for d in drafters]


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def _temp(policy: Policy) -> str:
    return "T=unpublished" if policy.temperature is None else f"T={policy.temperature:g}"


def _method(policy: Policy) -> str:
    return str(next(iter(policy.configs.values()))["method"])


def _side(policy: Policy, choice: Choice) -> str:
    parts = [f"{policy.baseline} {choice.baseline.describe()}"]
    parts += [f"{name} k={policy.arms[name]} {t.describe()}" for name, t in choice.candidates.items()]
    return f"c={choice.concurrency}: " + ", ".join(parts) + f" -> {choice.reason(policy.baseline, policy.arms)}"


def render_policy(policy: Policy, engines: Sequence[tuple[str, Support]] = ()) -> str:
    """The human report: choices, schedule, vLLM JSON, boundaries, routing, engine support."""
    by_c = {ch.concurrency: ch for ch in policy.choices}
    arms = ", ".join(f"{name} k={k}" for name, k in policy.arms.items())
    lines = [f"== {policy.ledger_id}: {policy.workload} {_temp(policy)}, drafter {policy.drafter} ({arms}) "
             f"vs {policy.baseline} ==", "", "Measured (output tok/s, median [min..max]) and choice per concurrency:"]
    lines += [f"  {_side(policy, ch)}" for ch in policy.choices]
    c_max = policy.bands[-1].end
    lines += ["", "Schedule (batch size -> k; bands bounded by the sweep, see the boundary rule in "
                  "specledger.analysis.policy):"]
    for band in policy.bands:
        notes = [f"measured at c={','.join(map(str, band.measured))}"]
        if band.extrapolated_below:
            notes.append(f"1..{band.measured[0] - 1} extrapolated below the sweep")
        if band.end == c_max:
            notes.append(f"vLLM carries k={band.k} beyond {c_max} up to max_num_seqs (extrapolated)")
        lines.append(f"  {band.start}..{band.end}: k={band.k} ({'; '.join(notes)})")
    config = policy.speculative_config()
    lines += ["", "speculative_config (vLLM):"]
    if config is None:
        lines.append("  none: no k beats the baseline beyond the noise at any measured concurrency; "
                     "serve without a drafter")
    else:
        lines.append("  " + json.dumps(config))
    lines += ["", "Boundaries:"]
    if not policy.boundaries:
        lines.append("  none: one k for every batch size")
    for b in policy.boundaries:
        where = (f"between measured c={b.below} and c={b.above} (geometric midpoint {math.sqrt(b.below * b.above):.2f};"
                 f" batch sizes {b.below + 1}..{b.above - 1} not measured)" if b.between_measured
                 else f"between adjacent measured c={b.below} and c={b.above}")
        lines.append(f"  batch size {b.at}: k={b.k_below} -> k={b.k_above}, {where}")
        lines.append(f"    {_side(policy, by_c[b.below])}")
        lines.append(f"    {_side(policy, by_c[b.above])}")
    lines += ["", "Routing (when the engine drops the schedule; each endpoint runs a measured arm as measured):"]
    for route in policy.routing():
        upper = f"{route.end}" + (" and above" if route.end == c_max else "")
        if route.endpoint == "plain":
            lines.append(f"  concurrency {route.start}..{upper}: plain endpoint ({route.arm}, no drafter)")
        else:
            lines.append(f"  concurrency {route.start}..{upper}: speculative endpoint ({route.arm}, {_method(policy)} "
                         f"k={route.k})")
    if config is not None and policy.matched_baseline:
        zero = [ch for ch in policy.choices if ch.k == 0 and ch.matched is not None]
        if zero:
            figures = ", ".join(f"c={ch.concurrency} {ch.matched.median:.1f} vs {ch.baseline.median:.1f}"
                                for ch in zero if ch.matched is not None)
            lines.append(f"  note: a policy arm's k=0 bands still run the speculative engine path, closer to "
                         f"{policy.matched_baseline} than to {policy.baseline} ({figures} tok/s); routing avoids that")
    lines += ["", "Engine support for the schedule:"]
    if not engines:
        lines.append("  no engine given")
    for label, support in engines:
        verdict = {"honoured": "HONOURED", "partly": "PARTLY HONOURED", "dropped": "DROPPED",
                   "unknown": "UNKNOWN"}[support.status]
        if config is None:
            action = "nothing to schedule: serve plain"
        elif support.honoured:
            action = "use the schedule (verify it as a policy arm)"
        else:
            action = "use the routing recommendation"
        lines.append(f"  {label}: {verdict}: {support.summary}; {action}")
    return "\n".join(lines)


def policy_document(policy: Policy, engines: Sequence[tuple[str, Support]] = ()) -> dict[str, Any]:
    """The same as JSON-ready data (what `specledger policy --json` prints)."""

    def figures(t: Throughput | None) -> dict[str, Any] | None:
        if t is None:
            return None
        shown: dict[str, Any] = {"median": t.median, "min": t.low, "max": t.high}
        if t.multiplier_ci95 is not None:
            shown["multiplier_ci95"] = list(t.multiplier_ci95)
        return shown

    return {
        "ledger": policy.ledger_id,
        "workload": policy.workload,
        "temperature": policy.temperature,
        "drafter": policy.drafter,
        "baseline": policy.baseline,
        "arms": dict(policy.arms),
        "choices": [{"concurrency": ch.concurrency, "k": ch.k, "arm": ch.arm,
                     "output_tokens_per_s": {policy.baseline: figures(ch.baseline),
                                             **{n: figures(t) for n, t in ch.candidates.items()}}}
                    for ch in policy.choices],
        "schedule": policy.schedule(),
        "speculative_config": policy.speculative_config(),
        "boundaries": [{"at": b.at, "below": b.below, "above": b.above, "k_below": b.k_below, "k_above": b.k_above,
                        "between_measured": b.between_measured} for b in policy.boundaries],
        "routing": [{"start": r.start, "end": r.end, "endpoint": r.endpoint, "arm": r.arm, "k": r.k}
                    for r in policy.routing()],
        "policy_arm": policy.policy_arm(),
        "engine_support": [{"engine": label, "status": s.status, "summary": s.summary, "evidence": list(s.evidence)}
                           for label, s in engines],
    }
