"""Per point: throughput summaries against their repeats, multipliers against their medians or means,
v3 intervals around what they bound, acceptance against its counters and the draft length k."""

from __future__ import annotations

import statistics
from typing import Any

from specledger.analysis.audit.base import Auditor, Parts, num
from specledger.ledger import figures
from specledger.ledger.figures import (
    decimals_word,
    engine_starts,
    eps,
    is_v3,
    multiplier_centres,
    ratio_interval,
    rounds_to,
    throughput_centre,
)


def check_points(a: Auditor) -> None:
    """Every arm of every point: its throughput summary, multipliers, v3 intervals, acceptance and timers."""
    for i, point in enumerate(a.ledger.points):
        rounding = a.ledger.rounding_for(point)
        for arm_name, result in point["arms"].items():
            parts: Parts = ["points", i, "arms", arm_name]
            thr = result.get("output_tokens_per_s")
            if thr is not None:
                throughput(a, [*parts, "output_tokens_per_s"], thr, rounding["output_tokens_per_s"],
                           engine_starts(result))
            for field, base in a.ledger.multiplier_bases(arm_name):
                if field in result:
                    multiplier(a, [*parts, field], point, arm_name, base, result[field], rounding)
            if is_v3(point):
                intervals(a, parts, result)
            low_high = result.get("multiplier_range")
            if low_high is not None and low_high[0] > low_high[1]:
                a.add([*parts, "multiplier_range"], "range-order", f"range {low_high} runs backwards")
            k = a.k_of(arm_name)
            if "acceptance" in result:
                acceptance(a, [*parts, "acceptance"], result["acceptance"], k, rounding)
            n_repeats = len((result.get("output_tokens_per_s") or {}).get("repeats") or [])
            for timer, times in (result.get("request_time_s") or {}).items():
                if n_repeats and len(times) != n_repeats:
                    a.add([*parts, "request_time_s", timer], "repeats",
                             f"{len(times)} request times for {n_repeats} throughput repeats")
            per_step = result.get("speculative_tokens_per_step")
            if per_step is not None and k is not None and per_step > k + eps(k):
                a.add(
                    [*parts, "speculative_tokens_per_step"],
                    "draft-length",
                    f"{num(per_step)} draft tokens per step exceeds num_speculative_tokens {k}",
                )


def intervals(a: Auditor, parts: Parts, result: dict[str, Any]) -> None:
    """A v3 interval holds the value it bounds (both rounded alike, so rounding cannot push it out)."""
    thr = result.get("output_tokens_per_s") or {}
    for field_parts, interval, value, what in (
        (["output_tokens_per_s", "ci95"], thr.get("ci95"), thr.get("mean"), "mean"),
        (["multiplier_ci95"], result.get("multiplier_ci95"), result.get("multiplier"), "multiplier"),
        (["multiplier_vs_matched_ci95"], result.get("multiplier_vs_matched_ci95"),
         result.get("multiplier_vs_matched"), "multiplier_vs_matched"),
    ):
        if interval is None or value is None or len(interval) != 2:
            continue
        low, high = interval
        if not low - eps(low) <= value <= high + eps(high):
            a.add([*parts, *field_parts], "interval",
                     f"interval {num(low)}..{num(high)} does not hold the {what} {num(value)} it bounds")


def throughput(a: Auditor, parts: Parts, thr: dict[str, Any], decimals: int,
               starts: list[int] | None = None) -> None:
    """median/min/max (and mean) agree with the repeats, ordered.

    The repeats are stored rounded, as is each summary of the exact values, so the slack is what
    rounding allows and no more: none for min, max and the median of an odd count (each is one of
    the repeats, rounded alike), half a unit for the median of an even count (a mean of two),
    one unit for the mean (its own rounding and that of the repeats). Over two or more engine starts the mean is
    the geometric mean of the starts' means (``throughput_centre``).
    """
    median, low, high, repeats = thr.get("median"), thr.get("min"), thr.get("max"), thr.get("repeats")
    unit = 10.0**-decimals
    if repeats:
        for field, exact, slack in (
            ("median", statistics.median(repeats), 0.0 if len(repeats) % 2 else unit / 2),
            ("min", min(repeats), 0.0),
            ("max", max(repeats), 0.0),
            ("mean", throughput_centre(thr, True, starts), unit),
        ):
            stated = thr.get(field)
            if stated is not None and abs(stated - exact) > slack + eps(exact) + eps(unit):
                a.add(
                    [*parts, field],
                    "repeats",
                    f"{field} {num(stated)} disagrees with the {field} of the repeats, {num(exact)}",
                )
    if low is not None and median is not None and low > median + eps(median):
        a.add([*parts, "min"], "order", f"min {num(low)} is above the median {num(median)}")
    if high is not None and median is not None and median > high + eps(high):
        a.add([*parts, "max"], "order", f"max {num(high)} is below the median {num(median)}")


def multiplier(
    a: Auditor, parts: Parts, point: dict[str, Any], arm_name: str, base: str | None, stated: float,
    rounding: dict[str, int],
) -> None:
    """A stated multiplier must be a rounding of (arm median / baseline median); of means for v3."""
    centres = multiplier_centres(point, arm_name, base)
    if centres is None:
        return
    spec, base_centre, centre = centres
    decimals, tps = rounding["multiplier"], rounding["output_tokens_per_s"]
    if base_centre <= 0:
        a.add(
            parts, "multiplier-ratio", f"baseline arm {base!r} has {centre} {num(base_centre)}: no ratio"
        )
        return
    lo, hi = ratio_interval(spec, tps, base_centre, tps)
    holds = rounds_to(stated, lo, hi, decimals)
    message = f"{spec:.{tps}f}/{base_centre:.{tps}f} = {spec / base_centre:.3f}, stated as {num(stated)}: "
    if holds:
        message += f"holds at {decimals_word(decimals)}"
    else:
        message += (
            f"does not hold at {decimals_word(decimals)} "
            f"({centre}s rounded to {decimals_word(tps)} allow {lo:.4f}..{hi:.4f})"
        )
    a.verdict(parts, "multiplier-ratio", holds, message, info=a.reference)


def acceptance(a: Auditor, parts: Parts, acc: dict[str, Any], k: int | None, rounding: dict[str, int]) -> None:
    """Acceptance length/rate/per-position agree with the counters and with k."""
    length, rate = acc.get("acceptance_length"), acc.get("acceptance_rate")
    drafts, draft_tokens, accepted = (
        acc.get("drafts"),
        acc.get("draft_tokens"),
        acc.get("accepted_tokens"),
    )
    counts, fractions = acc.get("accepted_per_position"), acc.get("per_position")
    length_range = acc.get("acceptance_length_range")
    d_len, d_rate = rounding["acceptance_length"], rounding["acceptance_rate"]

    if k is not None:
        if length is not None and length > k + 1 + eps(k):
            a.add(
                [*parts, "acceptance_length"],
                "acceptance-bound",
                f"acceptance length {num(length)} exceeds k+1 = {k + 1} (num_speculative_tokens {k})",
            )
        for j, bound in enumerate(length_range or []):
            if bound > k + 1 + eps(k):
                a.add(
                    [*parts, "acceptance_length_range", j],
                    "acceptance-bound",
                    f"acceptance length {num(bound)} exceeds k+1 = {k + 1}",
                )
        if drafts and draft_tokens is not None and draft_tokens > k * drafts:
            a.add(
                [*parts, "draft_tokens"],
                "draft-length",
                f"{draft_tokens} draft tokens over {drafts} drafts is {draft_tokens / drafts:.3f} "
                f"per draft, more than num_speculative_tokens {k}",
            )
        for field, values in (("per_position", fractions), ("accepted_per_position", counts)):
            if values is not None and len(values) > k:
                a.add(
                    [*parts, field],
                    "draft-length",
                    f"{len(values)} positions, but num_speculative_tokens is {k}",
                )
    if length_range and length_range[0] > length_range[1]:
        a.add(
            [*parts, "acceptance_length_range"], "range-order", f"range {length_range} runs backwards"
        )

    if drafts is not None and accepted is not None and length is not None:
        if drafts == 0:
            if accepted:
                a.add(
                    [*parts, "accepted_tokens"], "counts", f"{accepted} accepted tokens but 0 drafts"
                )
        else:
            exact = figures.acceptance_length(accepted, drafts)
            a.verdict(
                [*parts, "acceptance_length"],
                "acceptance-length-counts",
                rounds_to(length, exact, exact, d_len),
                f"1 + {accepted}/{drafts} = {exact:.4f}, stated as {num(length)} "
                f"(rounding: {decimals_word(d_len)})",
                info=False,
            )
    if draft_tokens and accepted is not None and rate is not None:
        exact = accepted / draft_tokens
        a.verdict(
            [*parts, "acceptance_rate"],
            "acceptance-rate-counts",
            rounds_to(rate, exact, exact, d_rate),
            f"{accepted}/{draft_tokens} = {exact:.5f}, stated as {num(rate)} "
            f"(rounding: {decimals_word(d_rate)})",
            info=False,
        )
    if accepted is not None and draft_tokens is not None and accepted > draft_tokens:
        a.add(
            [*parts, "accepted_tokens"],
            "counts",
            f"{accepted} accepted tokens exceed {draft_tokens} draft tokens",
        )
    if counts is not None:
        per_position_counts(a, parts, counts, fractions, drafts, accepted, d_rate)
    elif fractions:
        # Without counters an increase may be the publication's rounding: a warning at most.
        for i in range(1, len(fractions)):
            if fractions[i] > fractions[i - 1]:
                a.add(
                    [*parts, "per_position", i],
                    "per-position-increasing",
                    f"acceptance at position {i} ({num(fractions[i])}) exceeds position {i - 1} "
                    f"({num(fractions[i - 1])})",
                    "warning",
                )


def per_position_counts(
    a: Auditor, parts: Parts, counts: list[int], fractions: list[float] | None, drafts: int | None,
    accepted: int | None, d_rate: int,
) -> None:
    """Counts per position: sum to accepted, never increase, and give the stated fractions.

    Verification accepts a prefix of each draft, so position i+1 is only ever accepted
    after position i: a count that increases is impossible, not noise.
    """
    if accepted is not None and sum(counts) != accepted:
        a.add(
            [*parts, "accepted_per_position"],
            "counts",
            f"accepted_per_position sums to {sum(counts)}, accepted_tokens is {accepted}",
        )
    for i in range(1, len(counts)):
        if counts[i] > counts[i - 1]:
            a.add(
                [*parts, "accepted_per_position", i],
                "per-position-increasing",
                f"{counts[i]} accepted at position {i} but only {counts[i - 1]} at position {i - 1}: "
                "a draft token is accepted only after every token before it",
            )
    if fractions is not None and len(fractions) != len(counts):
        a.add(
            [*parts, "per_position"],
            "counts",
            f"{len(fractions)} per-position fractions for {len(counts)} per-position counts",
        )
    if not drafts:
        return
    for i, count in enumerate(counts):
        if count > drafts:
            a.add(
                [*parts, "accepted_per_position", i],
                "counts",
                f"{count} accepted at position {i} of {drafts} drafts",
            )
        if fractions is not None and i < len(fractions):
            exact = count / drafts
            a.verdict(
                [*parts, "per_position", i],
                "per-position-counts",
                rounds_to(fractions[i], exact, exact, d_rate),
                f"{count}/{drafts} = {exact:.5f}, stated as {num(fractions[i])} "
                f"(rounding: {decimals_word(d_rate)})",
                info=False,
            )
