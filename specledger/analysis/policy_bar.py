"""The bars a policy arm (a speculation schedule, ``num_speculative_tokens_per_batch_size``, run as one arm) is held
to at a point: apart from ``verdict`` because they judge a schedule, not a change against a committed figure.

Why three bars on protocol v3 points:

- **Against the best fixed arm.** A schedule exists to be at least as fast as the best fixed choice at every load
  (the baseline, or a fixed-k drafter). Its throughput over that arm's is a paired ratio: the two arms' windows are
  interleaved in the same engine start, so they share its host state, as a multiplier does. The bar fails only where
  the whole 95% interval of that ratio lies below 1 minus the ledger's ``multiplier_rel`` tolerance: the schedule is
  known to lose by more than the tolerance. Running the same k as the best arm, it holds.
- **Against the baseline, the collapse check.** vLLM #49548 reports aggregate throughput collapsing once
  concurrency crosses a schedule's threshold (232 to 24-157 tok/s). Where the best fixed arm is a drafter, the first
  bar does not look at the baseline; this one does, with the same rule.
- **The counters: does the engine run the schedule?** A setting that silently does nothing (vLLM #25112) would pass
  both speed bars wherever the fixed drafter wins. The acceptance passes of the policy arm and of its fixed twin
  (the same drafter at a fixed k) cover the same prompts at the same concurrency, so their draft tokens compare
  directly: in a k=0 band the policy arm must draft at most half as many tokens as the twin, in a k>0 band at least
  half. Not zero: at the end of a pass fewer requests are in flight than the concurrency, and the batch size, not
  the concurrency, picks k (on the CPU engine at c=4 under a k=0 band from 4: 22 draft tokens against the fixed
  arm's 293).

Points of protocol v1/v2 keep the bar they were recorded under (``legacy_bar``): the median must reach the best
fixed arm's median minus both arms' repeat ranges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specledger import stats
from specledger.analysis.policy import drafter_key
from specledger.analysis.verdict import Check
from specledger.ledger import Ledger, figures
from specledger.ledger.model import LEGACY_ACCEPTANCE

__all__ = ["DRAFT_SHARE_EDGE", "RatioBar", "legacy_bar", "policy_checks", "scheduled_k"]

#: The policy arm's draft tokens over its fixed twin's: at most this in a k=0 band, at least this in a k>0 band.
DRAFT_SHARE_EDGE = 0.5


@dataclass(frozen=True)
class RatioBar(Check):
    """A paired throughput ratio with its 95% interval: fails only where the whole interval lies below ``low``."""

    ratio_low: float = math.nan
    ratio_high: float = math.nan

    @property
    def ok(self) -> bool:
        return self.ratio_high >= self.low

    def line(self) -> str:
        """The bar's verdict; an ok one whose whole interval lies below 1 says so, since a schedule known to lose
        to a fixed arm (H100, c=5: 0.819 of ngram's tokens/s at ngram's own k) is news even inside the tolerance."""
        verdict = "ok" if self.ok else "OUT OF TOLERANCE"
        if self.ok and self.ratio_high < 1:
            verdict += (f" (a resolved loss of {1 - self.ratio_high:.1%}..{1 - self.ratio_low:.1%}, "
                        "within the tolerance)")
        return (f"{self.metric}: {self.measured:.3f} ({self.ratio_low:.3f}..{self.ratio_high:.3f}) of "
                f"{self.reference}; fails only where the whole 95% interval lies below {self.low:.3f} "
                f"({self.tolerance}) {verdict}")


def scheduled_k(speculative_config: Mapping[str, Any], batch_size: int) -> int:
    """The draft length vLLM runs at this batch size: the band that holds it; beyond the last band, the last band's
    k (vLLM carries it up to max_num_seqs); without a schedule, num_speculative_tokens."""
    bands = speculative_config.get("num_speculative_tokens_per_batch_size") or []
    for start, end, k in bands:
        if start <= batch_size <= end:
            return int(k)
    if bands and batch_size > max(end for _, end, _ in bands):
        return int(max(bands, key=lambda band: band[1])[2])
    return int(speculative_config.get("num_speculative_tokens", 0))


def _repeats(point: Mapping[str, Any], name: str) -> list[float] | None:
    values = ((point["arms"].get(name) or {}).get("output_tokens_per_s") or {}).get("repeats")
    return [float(v) for v in values] if values else None


def _ratio(mine: list[float], theirs: list[float], starts: Sequence[int]) -> stats.Estimate:
    """mine / theirs, paired repeats: over engine starts where there are two or more, else the paired bootstrap of
    the repeats (the same estimators as the multiplier, ``recording.multiplier_figures``)."""
    if len(set(starts)) >= 2:
        return stats.replicated_estimate(stats.start_multipliers(mine, theirs, starts))
    return stats.multiplier_estimate(mine, theirs)


def _ratio_bar(metric: str, est: stats.Estimate, tolerance: float, against: str) -> RatioBar:
    return RatioBar(metric, 1.0, est.value, 1.0 - tolerance, math.inf, f"{tolerance:.0%} tolerance",
                    reference=against, ratio_low=est.low, ratio_high=est.high)


def _fixed_twin(ledger: Ledger, arm: str) -> str | None:
    """The fixed-k speculative arm with the policy arm's drafter (``policy.drafter_key``: all but k alike)."""
    mine = ledger.arm(arm)
    if not mine.get("speculative_config"):
        return None
    drafter = drafter_key(mine)
    return next((str(other["name"]) for other in ledger.arms
                 if other["role"] == "speculative" and other.get("speculative_config")
                 and drafter_key(other) == drafter), None)


def _draft_share(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> float | None:
    """The policy arm's draft tokens over its twin's: over the same acceptance pass (same prompts) as counted; from
    windows (ledgers before the pass), per output token, since a window's drafts grow with its speed."""
    acc_mine, acc_theirs = mine.get("acceptance") or {}, theirs.get("acceptance") or {}
    source = acc_mine.get("from", LEGACY_ACCEPTANCE["from"])
    if not acc_theirs.get("draft_tokens") or source != acc_theirs.get("from", LEGACY_ACCEPTANCE["from"]):
        return None
    if source == "pass":
        if acc_mine.get("requests") != acc_theirs.get("requests"):
            return None
        return float(acc_mine.get("draft_tokens") or 0) / float(acc_theirs["draft_tokens"])
    if not mine.get("output_tokens") or not theirs.get("output_tokens"):
        return None
    return (float(acc_mine.get("draft_tokens") or 0) / float(mine["output_tokens"])) / (
        float(acc_theirs["draft_tokens"]) / float(theirs["output_tokens"]))


def _drafting_check(ledger: Ledger, arm: str, point: Mapping[str, Any]) -> Check | None:
    twin = _fixed_twin(ledger, arm)
    if twin is None:
        return None
    share = _draft_share(point["arms"].get(arm) or {}, point["arms"].get(twin) or {})
    if share is None:
        return None
    k = scheduled_k(ledger.arm(arm)["speculative_config"], int(point["concurrency"]))
    low, high = (0.0, DRAFT_SHARE_EDGE) if k == 0 else (DRAFT_SHARE_EDGE, math.inf)
    return Check(f"policy arm draft tokens / {twin}'s (schedule k={k} at c={point['concurrency']})", 1.0, share,
                 low, high, f"k={k}: {'at most' if k == 0 else 'at least'} {DRAFT_SHARE_EDGE:g} of the fixed "
                 "arm's (same pass, or per output token)", reference=f"{twin} (same drafter, fixed k)")


def legacy_bar(ledger: Ledger, arm: str, point: Mapping[str, Any]) -> Check | None:
    """Protocol v1/v2: the policy arm's median must reach the best fixed arm's median minus both repeat ranges.

    Why the sum: where the policy runs the same k as the best arm, a bar on one arm's range alone fails identical
    engines at one point in twenty with 3 repeats, and it did so in CI (policy 43.8 tok/s, best repeat 44.2,
    against ngram's worst 44.4, same k). `specledger policy` keeps k only where the ranges separate, so a schedule
    derived from a ledger holds this bar on that ledger's own figures."""
    arms = point["arms"]
    mine = (arms.get(arm) or {}).get("output_tokens_per_s") or {}
    rivals = [n for n in _rivals(ledger, point, arm)
              if (arms[n].get("output_tokens_per_s") or {}).get("median") is not None]
    if mine.get("median") is None or not rivals:
        return None
    best = max(rivals, key=lambda n: arms[n]["output_tokens_per_s"]["median"])
    tps = arms[best]["output_tokens_per_s"]
    best_range, my_range = _range(tps), _range(mine)
    floor = float(tps["median"]) - best_range - my_range
    return Check("policy arm tok/s (median)", float(tps["median"]), float(mine["median"]), floor, float("inf"),
                 f"{best}'s median minus both repeat ranges, {best_range:.1f} + {my_range:.1f}",
                 reference=f"{best} (best fixed) median")


def _range(tps: Mapping[str, Any]) -> float:
    """max - min of an arm's repeats (0 when only the median is known)."""
    median = float(tps["median"])
    return float(tps.get("max", median)) - float(tps.get("min", median))


def _rivals(ledger: Ledger, point: Mapping[str, Any], arm: str) -> list[str]:
    """The fixed choices: the baseline and the fixed-k drafters measured at this point."""
    return [a["name"] for a in ledger.arms
            if a["role"] in ("baseline", "speculative") and a["name"] in point["arms"] and a["name"] != arm]


def policy_checks(ledger: Ledger, arm: str, point: Mapping[str, Any]) -> list[Check]:
    """Every bar of a policy arm at one point (module docstring): on v3 the ratio to the best fixed arm, the
    collapse check against the baseline where the best is a drafter, and the drafting check; earlier, the legacy
    bar."""
    if not figures.is_v3(point):
        bar = legacy_bar(ledger, arm, point)
        return [bar] if bar is not None else []
    mine = _repeats(point, arm)
    if not mine:
        return []
    paired = {n: theirs for n in _rivals(ledger, point, arm)
              if (theirs := _repeats(point, n)) and len(theirs) == len(mine)}  # arm -> its repeats, paired with mine
    if not paired:
        return []
    starts = figures.engine_starts(point["arms"][arm])
    tolerance = float(ledger.tolerances["multiplier_rel"])
    best = max(paired, key=lambda n: sum(paired[n]))  # the highest mean: every rival has as many repeats
    checks: list[Check] = [_ratio_bar("policy arm tok/s / best fixed arm's", _ratio(mine, paired[best], starts),
                                      tolerance, f"{best} (best fixed)")]
    base = ledger.baseline_arm_for(arm)
    if base is not None and base != best and base in paired:
        checks.append(_ratio_bar("policy arm tok/s / baseline's (collapse check)", _ratio(mine, paired[base], starts),
                                 tolerance, f"{base} (baseline)"))
    drafting = _drafting_check(ledger, arm, point)
    if drafting is not None:
        checks.append(drafting)
    return checks
