"""Two ledgers at the same points: how one condition (the checkpoint, the KV-cache dtype, the card) moves each figure,
with the interval a verification would give it.

Why: the checkpoint axis is measured in other leases than its reference. On the lent H100 a second lease alone moved
ngram's multiplier at copy c=8 from 1.218 to 0.861 (reports/evidence/2026-12-06-h100-qwen-bf16-visit4), so an fp8
point set beside a bf16 point says nothing until the between-start spread is in the interval. The question "is the
other ledger's figure the reference's, within tolerance?" is a verification's with the other ledger as the fresh
run, so it is answered by the same function (``verdict.speed_verdicts``): over engine starts, with the reference's
pooled between-start spread where it keeps one, else over the windows of one start on each side (and then said so).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd

from specledger.analysis.verdict import acceptance_check, speed_verdicts
from specledger.ledger import Ledger
from specledger.ledger.figures import start_spread
from specledger.ledger.selection import point_label

__all__ = ["COMPARED_CONDITIONS", "compare_acceptance", "compare_ledgers", "condition_differences"]

#: The parts of a ledger that make its figures what they are; any difference between two compared ledgers is printed
#: beside the table, since the comparison is about one of them (and a second one confounds it).
COMPARED_CONDITIONS = ("target", "engine_args", "provenance.accelerator", "protocol", "sampling", "workloads")
_ARM_CONDITIONS = ("role", "speculative_config", "engine_args", "env", "baseline", "matched_baseline")


def _get(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from _leaves(inner, f"{path}.{key}")
    else:
        yield path, value


def _shared_arms(reference: Ledger, other: Ledger) -> list[str]:
    names = {a["name"] for a in other.arms}
    return [a["name"] for a in reference.arms if a["name"] in names]


def _shared_points(reference: Ledger, other: Ledger) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(label, reference's point, other's point) for each point both measured, in the reference's order."""
    for mine in reference.points:
        key = Ledger.point_key(mine)
        theirs = other.find_point(*key)
        if theirs is not None:
            yield point_label(key), mine, theirs


def condition_differences(reference: Ledger, other: Ledger) -> dict[str, tuple[Any, Any]]:
    """JSON path -> (reference's value, other's) for every condition the two ledgers do not share, the arms they
    both have included: the condition under comparison, and anything else that moved with it."""
    out: dict[str, tuple[Any, Any]] = {}
    pairs = [(p, _get(reference.data, p), _get(other.data, p)) for p in COMPARED_CONDITIONS]
    pairs += [(f"arms[{name}].{key}", reference.arm(name).get(key), other.arm(name).get(key))
              for name in _shared_arms(reference, other) for key in _ARM_CONDITIONS]
    for path, mine, theirs in pairs:
        if mine == theirs:
            continue
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            a, b = dict(_leaves(mine, path)), dict(_leaves(theirs, path))
            out.update({leaf: (a.get(leaf), b.get(leaf)) for leaf in sorted(a.keys() | b.keys())
                        if a.get(leaf) != b.get(leaf)})
        else:
            out[path] = (mine, theirs)
    return out


def compare_ledgers(reference: Ledger, other: Ledger) -> pd.DataFrame:
    """One row per shared point, shared arm and speed figure (the multiplier of speculative arms, every arm's
    tokens/s): each ledger's estimate with its 95% CI, the other's change against the reference with its CI, and
    the outcome against the reference's tolerance (holds, changed, inconclusive). ``over`` says what the interval
    spans: engine starts (with the reference's between-start spread where it pools one) or the windows of one
    start on each side, which leaves out what another lease would do."""
    rows = []
    arms = _shared_arms(reference, other)
    # Whether the reference pools a between-start spread for each arm's multiplier and tokens/s (the spread
    # speed_verdicts judges that figure with): once per ledger, not per point.
    pooled = {(arm, figure): start_spread(reference.data, arm, figure) is not None
              for arm in arms for figure in ("multiplier", "output_tokens_per_s")}
    for label, mine, theirs in _shared_points(reference, other):
        for arm in arms:
            for figure in speed_verdicts(reference, arm, committed=mine, measured=theirs):
                v = figure.verdict
                spread = pooled[arm, "multiplier" if figure.metric == "multiplier" else "output_tokens_per_s"]
                rows.append({
                    "point": label, "arm": arm, "figure": figure.metric,
                    "reference": round(figure.committed.value, 3),
                    "reference_ci95": (round(figure.committed.low, 3), round(figure.committed.high, 3)),
                    "other": round(figure.fresh.value, 3),
                    "other_ci95": (round(figure.fresh.low, 3), round(figure.fresh.high, 3)),
                    "change_pct": round(100 * v.change.value, 1),
                    "change_ci95_pct": (round(100 * v.change.low, 1), round(100 * v.change.high, 1)),
                    "outcome": v.outcome, "tolerance_pct": round(100 * v.tolerance, 1),
                    "over": "engine starts" + (" (pooled spread)" if spread else "")
                            if v.unit == "engine starts" else "windows of one start each",
                })
    return pd.DataFrame(rows)


def compare_acceptance(reference: Ledger, other: Ledger) -> pd.DataFrame:
    """One row per shared point and speculative arm: each ledger's acceptance length and the change against the
    reference's absolute bar, judged as a verification judges it (``verdict.acceptance_check``: the acceptance pass
    counts the same prompts on both sides, so the bar is exact). Where the two figures count different tokens the
    row says why and asserts nothing.

    Why apart from the speed table: acceptance length barely moves between leases (4.44-4.46 on every H100 start of
    copy), so a condition that moves it shows here while the tokens/s it costs are still hidden by the leases."""
    rows = []
    speculative = {a["name"] for a in reference.speculative_arms()}
    arms = [a for a in _shared_arms(reference, other) if a in speculative]
    bar_abs = float(reference.tolerances["acceptance_length_abs"])
    for label, mine, theirs in _shared_points(reference, other):
        for arm in arms:
            c_arm, m_arm = mine["arms"].get(arm) or {}, theirs["arms"].get(arm) or {}
            ref_len = (c_arm.get("acceptance") or {}).get("acceptance_length")
            other_len = (m_arm.get("acceptance") or {}).get("acceptance_length")
            if ref_len is None or other_len is None:
                continue
            ref_len, other_len = float(ref_len), float(other_len)
            check, why_not = acceptance_check(c_arm, m_arm, bar_abs)
            rows.append({
                "point": label, "arm": arm, "reference": round(ref_len, 3), "other": round(other_len, 3),
                "change": round(other_len - ref_len, 3),
                "bar": (round(check.low, 3), round(check.high, 3)) if check else None,
                "outcome": ("holds" if check.ok else "changed") if check else f"not asserted: {why_not}",
            })
    return pd.DataFrame(rows)
