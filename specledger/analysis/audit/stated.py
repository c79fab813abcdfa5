"""What a ledger states in words: its `claims` (a figure, rounded, with the raw figures behind it) and
its `workload_mix` shares."""

from __future__ import annotations

import math
from typing import Any

from specledger.analysis import theory
from specledger.analysis.audit.base import Auditor, Parts, num
from specledger.analysis.audit.kv import kv_change_interval
from specledger.ledger import Ledger, figures
from specledger.ledger.figures import decimals_word, half_unit, multiplier_interval, rounds_to


class _Unpinned(Exception):
    """A claim names something the ledger does not pin down."""


def check_claims(a: Auditor) -> None:
    """Every claim the ledger states must be a rounding of the figure behind it."""
    for j, claim in enumerate(a.ledger.data.get("claims", [])):
        parts: Parts = ["claims", j]
        try:
            lo, hi, how = claim_interval(a, claim)
        except _Unpinned as e:
            a.add(parts, "claim", f"{claim['text']!r}: {e}")
            continue
        decimals = claim["decimals"]
        holds = rounds_to(claim["value"], lo, hi, decimals)
        verb = "holds" if holds else "does not hold"
        a.verdict(
            [*parts, "value"],
            "claim",
            holds,
            f"{how}, stated as {claim['text']}: {verb} at {decimals_word(decimals)}",
            info=True,
        )


def claim_arm(a: Auditor, claim: dict[str, Any]) -> str:
    """The arm a claim names, or the ledger's only speculative arm."""
    if "arm" in claim:
        return claim["arm"]
    arms = a.ledger.speculative_arms()
    if len(arms) != 1:
        raise _Unpinned(f"names no arm, and the ledger has {len(arms)} speculative arms")
    return arms[0]["name"]


def claim_point(a: Auditor, claim: dict[str, Any], arm: str) -> dict[str, Any]:
    """The one point the claim names (fields it leaves out match anything) that has the arm."""
    matches = [
        p
        for p in a.ledger.points
        if arm in p["arms"]
        and all(
            field not in claim
            or (p[field] if field != "temperature" else Ledger.point_key(p)[1]) == claim[field]
            for field in ("workload", "temperature", "concurrency")
        )
    ]
    if len(matches) != 1:
        raise _Unpinned(
            f"matches {len(matches)} points for arm {arm!r}; name workload, temperature, concurrency"
        )
    return matches[0]


def claim_interval(a: Auditor, claim: dict[str, Any]) -> tuple[float, float, str]:
    """(lo, hi, explanation) of the exact value behind a claim, from the most raw figures present."""
    metric, arm = claim["metric"], claim_arm(a, claim)
    if metric in ("sessions", "kv_cache_change"):
        arm_data = a.ledger.arm(arm)
        context = claim.get("context_tokens")
        if metric == "kv_cache_change":
            found = kv_change_interval(a, arm_data, context)
            if found is None:
                raise _Unpinned(
                    f"arm {arm!r} and its baseline have no KV tokens or sessions at a shared context"
                )
            return found
        entries = [
            s for s in arm_data.get("sessions") or [] if context is None or s["context_tokens"] == context
        ]
        if len(entries) != 1:
            raise _Unpinned(f"arm {arm!r} has {len(entries)} sessions entries at context {context}")
        tokens = (arm_data.get("kv_cache") or {}).get("tokens")
        ctx = entries[0]["context_tokens"]
        if tokens is not None:
            exact = theory.sessions(tokens, ctx)
            return exact, exact, f"{tokens}/{ctx} = {exact:.3f} sessions"
        return stated_interval(entries[0]["sessions"], a.ledger.rounding["sessions"], "sessions")

    point = claim_point(a, claim, arm)
    rounding = a.ledger.rounding_for(point)
    result = point["arms"][arm]
    if metric == "multiplier":
        d = rounding["output_tokens_per_s"]
        found = multiplier_interval(point, arm, a.ledger.baseline_arm_for(arm), d)
        if found is not None:
            lo, hi, (spec, base_centre, _) = found
            return lo, hi, f"{spec:.{d}f}/{base_centre:.{d}f} = {spec / base_centre:.3f}"
        if "multiplier" in result:
            return stated_interval(result["multiplier"], rounding["multiplier"], "multiplier")
        raise _Unpinned(f"point has neither medians nor a multiplier for arm {arm!r}")
    if metric == "acceptance_length":
        acc = result.get("acceptance", {})
        if acc.get("drafts") and acc.get("accepted_tokens") is not None:
            exact = figures.acceptance_length(acc["accepted_tokens"], acc["drafts"])
            return exact, exact, f"1 + {acc['accepted_tokens']}/{acc['drafts']} = {exact:.3f}"
        if "acceptance_length" in acc:
            return stated_interval(
                acc["acceptance_length"], rounding["acceptance_length"], "acceptance length"
            )
        raise _Unpinned(f"point has no acceptance length for arm {arm!r}")
    median = result.get("output_tokens_per_s", {}).get("median")
    if median is None:
        raise _Unpinned(f"point has no output tokens/s for arm {arm!r}")
    return stated_interval(median, rounding["output_tokens_per_s"], "median output tokens/s")


def stated_interval(value: float, decimals: int, what: str) -> tuple[float, float, str]:
    """The values a stated figure stands for: itself +- half a unit of its rounding."""
    h = half_unit(decimals)
    return (
        value - h,
        value + h,
        f"{what} {num(value)} (rounded to {decimals_word(decimals)}: {value - h:g}..{value + h:g})",
    )


def check_mix(a: Auditor) -> None:
    """A workload mix's shares sum to 1."""
    mix = a.ledger.data.get("workload_mix")
    if not mix:
        return
    total = math.fsum(mix["shares"].values())
    if abs(total - 1.0) > 1e-6:
        a.add(["workload_mix", "shares"], "mix", f"shares sum to {total:.6g}, not 1")
