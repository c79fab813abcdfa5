"""Consistency findings for a ledger: do its figures agree with each other at the rounding it states?

A ledger carries both raw figures (medians, counters, KV tokens) and figures derived from them
(multipliers, acceptance length and rate, sessions, crossings, prose claims such as "0.3x").
The audit recomputes each derived figure from the raw ones and checks that rounding the exact
value to the stated decimals gives the stated value. Where the raw figures are themselves
rounded, it works with the interval they stand for (value +- half a unit), so a published
rounding is only called wrong when no value consistent with the inputs could produce it.

A protocol v3 point (`protocol_version: 3`) states its multiplier as a ratio of *means* of paired
repeats (specledger.stats), so its multipliers are checked against the means; earlier points keep
the ratio of medians. The `resolution` finding says which multiplier tolerance the committed v3
intervals can resolve at all with the protocol's most repeats.

Severity: in measured (and planned) ledgers an inconsistency is an `error`, since this suite
wrote the figures; in reference ledgers it is a `warning`, since the ledger faithfully encodes
a publication that disagrees with itself. "This rounding holds" is `info`. No vLLM here.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specledger import stats
from specledger.analysis import theory
from specledger.ledger import Ledger, LedgerError, figures, iter_ledger_paths, load_ledger
from specledger.ledger.figures import (
    decimals_of,
    decimals_word,
    eps,
    half_unit,
    is_v3,
    multiplier_centres,
    multiplier_interval,
    ratio_interval,
    rounds_to,
)
from specledger.ledger.model import Problem, json_path

__all__ = [
    "SEVERITIES",
    "Finding",
    "at_least",
    "audit_ledger",
    "audit_paths",
]

Severity = Literal["error", "warning", "info"]
#: Severities from least to most serious (index = rank).
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")
#: How far (in log2 of concurrency) a stated critical concurrency may sit from the recomputed one.
CRITICAL_LOG2_TOLERANCE = 0.05

Parts = list[str | int]


@dataclass(frozen=True)
class Finding:
    """One audit observation, located like a load Problem (file + JSON path of the value)."""

    severity: Severity
    file: str
    json_path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.json_path}: {self.severity}: {self.message} [{self.code}]"


# --------------------------------------------------------------------------------------------
# rounding arithmetic
# --------------------------------------------------------------------------------------------


def _num(x: float) -> str:
    """A figure as the ledger writes it: 2306 for an int, 3.0 and 88.7 for floats (shortest repr)."""
    return str(x) if isinstance(x, int) else repr(float(x))


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


# --------------------------------------------------------------------------------------------
# the audit
# --------------------------------------------------------------------------------------------


def _where(point: Mapping[str, Any]) -> str:
    """A point's conditions for a message: copy, T=0.0, c=16."""
    return f"{point['workload']}, T={point.get('temperature')}, c={point.get('concurrency')}"


def _pct_up(share: float) -> int:
    """The whole percent strictly above `share` (the smallest round tolerance a half-width stays under)."""
    return math.floor(share * 100 + 1e-9) + 1


def _cv(values: Sequence[float]) -> float | None:
    """Coefficient of variation of repeats (None below two repeats or at a zero mean)."""
    if len(values) < 2 or statistics.fmean(values) <= 0:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def _noise_source(arm: str, cv_throughput: float, cv_engine: float | None) -> str:
    """Where the repeat noise lives, when the ledger timed requests inside the engine too.

    Engine-core time per request varying as much as throughput puts the noise in the engine's
    own steps (kernels, scheduling, host work per step); engine time that holds still while
    throughput moves puts it outside the engine core (front end, load generator, machine).
    """
    if cv_engine is None:
        return ""
    if cv_engine >= 0.7 * cv_throughput:
        where = "so the noise is in the engine's own steps"
    elif cv_engine <= 0.3 * cv_throughput:
        where = "so most of the noise is outside the engine core (front end, load generator, machine)"
    else:
        where = "so the noise is partly in the engine's steps, partly outside the engine core"
    return (f"; {arm}'s engine-core time per request (vllm:request_inference_time_seconds) varies by "
            f"{cv_engine:.1%} against {cv_throughput:.1%} for its throughput, {where}")


class _Audit:
    """Walks one ledger and collects findings; `bad` is the severity of an inconsistency here."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.reference = ledger.status == "reference"
        self.bad: Severity = "warning" if self.reference else "error"
        self.findings: list[Finding] = []

    def add(self, parts: Parts, code: str, message: str, severity: Severity | None = None) -> None:
        self.findings.append(Finding(severity or self.bad, self.ledger.file, json_path(parts), code, message))

    def verdict(self, parts: Parts, code: str, holds: bool, message: str, *, info: bool) -> None:
        """Report a rounding check: a failure always, a success as info when asked."""
        if not holds:
            self.add(parts, code, message)
        elif info:
            self.add(parts, code, message, "info")

    def k_of(self, arm_name: str) -> int | None:
        """Draft length k from the arm's speculative_config, when known."""
        try:
            config = self.ledger.arm(arm_name).get("speculative_config") or {}
        except KeyError:
            return None
        k = config.get("num_speculative_tokens")
        return k if isinstance(k, int) else None

    # -- points -----------------------------------------------------------------------------

    def points(self) -> None:
        for i, point in enumerate(self.ledger.points):
            rounding = self.ledger.rounding_for(point)
            for arm_name, result in point["arms"].items():
                parts: Parts = ["points", i, "arms", arm_name]
                throughput = result.get("output_tokens_per_s")
                if throughput is not None:
                    self.throughput(
                        [*parts, "output_tokens_per_s"], throughput, rounding["output_tokens_per_s"]
                    )
                for field, base in (
                    ("multiplier", self.ledger.baseline_arm_for(arm_name)),
                    ("multiplier_vs_matched", self.ledger.matched_baseline_for(arm_name)),
                ):
                    if field in result:
                        self.multiplier([*parts, field], point, arm_name, base, result[field], rounding)
                if is_v3(point):
                    self.intervals(parts, result)
                low_high = result.get("multiplier_range")
                if low_high is not None and low_high[0] > low_high[1]:
                    self.add([*parts, "multiplier_range"], "range-order", f"range {low_high} runs backwards")
                k = self.k_of(arm_name)
                if "acceptance" in result:
                    self.acceptance([*parts, "acceptance"], result["acceptance"], k, rounding)
                n_repeats = len((result.get("output_tokens_per_s") or {}).get("repeats") or [])
                for timer, times in (result.get("request_time_s") or {}).items():
                    if n_repeats and len(times) != n_repeats:
                        self.add([*parts, "request_time_s", timer], "repeats",
                                 f"{len(times)} request times for {n_repeats} throughput repeats")
                per_step = result.get("speculative_tokens_per_step")
                if per_step is not None and k is not None and per_step > k + eps(k):
                    self.add(
                        [*parts, "speculative_tokens_per_step"],
                        "draft-length",
                        f"{_num(per_step)} draft tokens per step exceeds num_speculative_tokens {k}",
                    )

    def intervals(self, parts: Parts, result: dict[str, Any]) -> None:
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
                self.add([*parts, *field_parts], "interval",
                         f"interval {_num(low)}..{_num(high)} does not hold the {what} {_num(value)} it bounds")

    def throughput(self, parts: Parts, thr: dict[str, Any], decimals: int) -> None:
        """median/min/max (and mean) agree with the repeats, ordered.

        The repeats are stored rounded, as is each summary of the exact values, so the slack is what
        rounding allows and no more: none for min, max and the median of an odd count (each is one of
        the repeats, rounded alike), half a unit for the median of an even count (a mean of two),
        one unit for the mean (its own rounding and that of the repeats).
        """
        median, low, high, repeats = thr.get("median"), thr.get("min"), thr.get("max"), thr.get("repeats")
        unit = 10.0**-decimals
        if repeats:
            for field, exact, slack in (
                ("median", statistics.median(repeats), 0.0 if len(repeats) % 2 else unit / 2),
                ("min", min(repeats), 0.0),
                ("max", max(repeats), 0.0),
                ("mean", statistics.fmean(repeats), unit),
            ):
                stated = thr.get(field)
                if stated is not None and abs(stated - exact) > slack + eps(exact) + eps(unit):
                    self.add(
                        [*parts, field],
                        "repeats",
                        f"{field} {_num(stated)} disagrees with the {field} of the repeats, {_num(exact)}",
                    )
        if low is not None and median is not None and low > median + eps(median):
            self.add([*parts, "min"], "order", f"min {_num(low)} is above the median {_num(median)}")
        if high is not None and median is not None and median > high + eps(high):
            self.add([*parts, "max"], "order", f"max {_num(high)} is below the median {_num(median)}")

    def multiplier(
        self,
        parts: Parts,
        point: dict[str, Any],
        arm_name: str,
        base: str | None,
        stated: float,
        rounding: dict[str, int],
    ) -> None:
        """A stated multiplier must be a rounding of (arm median / baseline median); of means for v3."""
        centres = multiplier_centres(point, arm_name, base)
        if centres is None:
            return
        spec, base_centre, centre = centres
        decimals, tps = rounding["multiplier"], rounding["output_tokens_per_s"]
        if base_centre <= 0:
            self.add(
                parts, "multiplier-ratio", f"baseline arm {base!r} has {centre} {_num(base_centre)}: no ratio"
            )
            return
        lo, hi = ratio_interval(spec, tps, base_centre, tps)
        holds = rounds_to(stated, lo, hi, decimals)
        message = f"{spec:.{tps}f}/{base_centre:.{tps}f} = {spec / base_centre:.3f}, stated as {_num(stated)}: "
        if holds:
            message += f"holds at {decimals_word(decimals)}"
        else:
            message += (
                f"does not hold at {decimals_word(decimals)} "
                f"({centre}s rounded to {decimals_word(tps)} allow {lo:.4f}..{hi:.4f})"
            )
        self.verdict(parts, "multiplier-ratio", holds, message, info=self.reference)

    def acceptance(self, parts: Parts, acc: dict[str, Any], k: int | None, rounding: dict[str, int]) -> None:
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
                self.add(
                    [*parts, "acceptance_length"],
                    "acceptance-bound",
                    f"acceptance length {_num(length)} exceeds k+1 = {k + 1} (num_speculative_tokens {k})",
                )
            for j, bound in enumerate(length_range or []):
                if bound > k + 1 + eps(k):
                    self.add(
                        [*parts, "acceptance_length_range", j],
                        "acceptance-bound",
                        f"acceptance length {_num(bound)} exceeds k+1 = {k + 1}",
                    )
            if drafts and draft_tokens is not None and draft_tokens > k * drafts:
                self.add(
                    [*parts, "draft_tokens"],
                    "draft-length",
                    f"{draft_tokens} draft tokens over {drafts} drafts is {draft_tokens / drafts:.3f} "
                    f"per draft, more than num_speculative_tokens {k}",
                )
            for field, values in (("per_position", fractions), ("accepted_per_position", counts)):
                if values is not None and len(values) > k:
                    self.add(
                        [*parts, field],
                        "draft-length",
                        f"{len(values)} positions, but num_speculative_tokens is {k}",
                    )
        if length_range and length_range[0] > length_range[1]:
            self.add(
                [*parts, "acceptance_length_range"], "range-order", f"range {length_range} runs backwards"
            )

        if drafts is not None and accepted is not None and length is not None:
            if drafts == 0:
                if accepted:
                    self.add(
                        [*parts, "accepted_tokens"], "counts", f"{accepted} accepted tokens but 0 drafts"
                    )
            else:
                exact = figures.acceptance_length(accepted, drafts)
                self.verdict(
                    [*parts, "acceptance_length"],
                    "acceptance-length-counts",
                    rounds_to(length, exact, exact, d_len),
                    f"1 + {accepted}/{drafts} = {exact:.4f}, stated as {_num(length)} "
                    f"(rounding: {decimals_word(d_len)})",
                    info=False,
                )
        if draft_tokens and accepted is not None and rate is not None:
            exact = accepted / draft_tokens
            self.verdict(
                [*parts, "acceptance_rate"],
                "acceptance-rate-counts",
                rounds_to(rate, exact, exact, d_rate),
                f"{accepted}/{draft_tokens} = {exact:.5f}, stated as {_num(rate)} "
                f"(rounding: {decimals_word(d_rate)})",
                info=False,
            )
        if accepted is not None and draft_tokens is not None and accepted > draft_tokens:
            self.add(
                [*parts, "accepted_tokens"],
                "counts",
                f"{accepted} accepted tokens exceed {draft_tokens} draft tokens",
            )
        if counts is not None:
            self.per_position_counts(parts, counts, fractions, drafts, accepted, d_rate)
        elif fractions:
            # Without counters an increase may be the publication's rounding: a warning at most.
            for i in range(1, len(fractions)):
                if fractions[i] > fractions[i - 1]:
                    self.add(
                        [*parts, "per_position", i],
                        "per-position-increasing",
                        f"acceptance at position {i} ({_num(fractions[i])}) exceeds position {i - 1} "
                        f"({_num(fractions[i - 1])})",
                        "warning",
                    )

    def per_position_counts(
        self,
        parts: Parts,
        counts: list[int],
        fractions: list[float] | None,
        drafts: int | None,
        accepted: int | None,
        d_rate: int,
    ) -> None:
        """Counts per position: sum to accepted, never increase, and give the stated fractions.

        Verification accepts a prefix of each draft, so position i+1 is only ever accepted
        after position i: a count that increases is impossible, not noise.
        """
        if accepted is not None and sum(counts) != accepted:
            self.add(
                [*parts, "accepted_per_position"],
                "counts",
                f"accepted_per_position sums to {sum(counts)}, accepted_tokens is {accepted}",
            )
        for i in range(1, len(counts)):
            if counts[i] > counts[i - 1]:
                self.add(
                    [*parts, "accepted_per_position", i],
                    "per-position-increasing",
                    f"{counts[i]} accepted at position {i} but only {counts[i - 1]} at position {i - 1}: "
                    "a draft token is accepted only after every token before it",
                )
        if fractions is not None and len(fractions) != len(counts):
            self.add(
                [*parts, "per_position"],
                "counts",
                f"{len(fractions)} per-position fractions for {len(counts)} per-position counts",
            )
        if not drafts:
            return
        for i, count in enumerate(counts):
            if count > drafts:
                self.add(
                    [*parts, "accepted_per_position", i],
                    "counts",
                    f"{count} accepted at position {i} of {drafts} drafts",
                )
            if fractions is not None and i < len(fractions):
                exact = count / drafts
                self.verdict(
                    [*parts, "per_position", i],
                    "per-position-counts",
                    rounds_to(fractions[i], exact, exact, d_rate),
                    f"{count}/{drafts} = {exact:.5f}, stated as {_num(fractions[i])} "
                    f"(rounding: {decimals_word(d_rate)})",
                    info=False,
                )

    # -- KV cache and sessions --------------------------------------------------------------

    def kv_cache(self) -> None:
        d_sessions = self.ledger.rounding["sessions"]
        for i, arm in enumerate(self.ledger.arms):
            kv = arm.get("kv_cache") or {}
            tokens = kv.get("tokens")
            blocks, block_size = kv.get("num_blocks"), kv.get("block_size")
            if (
                tokens is not None
                and blocks is not None
                and block_size is not None
                and tokens != blocks * block_size
            ):
                self.add(
                    ["arms", i, "kv_cache", "tokens"],
                    "kv-tokens",
                    f"{tokens} tokens, but {blocks} blocks x {block_size} = {blocks * block_size}",
                )
            if tokens is not None:
                for j, entry in enumerate(arm.get("sessions") or []):
                    exact = theory.sessions(tokens, entry["context_tokens"])
                    self.verdict(
                        ["arms", i, "sessions", j, "sessions"],
                        "sessions",
                        rounds_to(entry["sessions"], exact, exact, d_sessions),
                        f"{tokens}/{entry['context_tokens']} = {exact:.4f} sessions, stated as "
                        f"{_num(entry['sessions'])} (rounding: {decimals_word(d_sessions)})",
                        info=False,
                    )
            if "change_vs_baseline" in kv:
                self.kv_change(i, arm, kv["change_vs_baseline"], d_sessions)

    def kv_change_interval(
        self, arm: dict[str, Any], context: int | None = None
    ) -> tuple[float, float, str] | None:
        """Exact-ish relative KV change against the baseline arm: from tokens, else from sessions.

        Returns (lo, hi, how) or None when neither the tokens nor sessions at a shared context exist.
        """
        base_name = self.ledger.baseline_arm_for(arm["name"])
        if base_name is None:
            return None
        base = self.ledger.arm(base_name)
        tokens, base_tokens = (
            (arm.get("kv_cache") or {}).get("tokens"),
            (base.get("kv_cache") or {}).get("tokens"),
        )
        if tokens is not None and base_tokens:
            exact = tokens / base_tokens - 1
            return exact, exact, f"{tokens}/{base_tokens} - 1 = {exact:.4f}"
        mine = {s["context_tokens"]: s["sessions"] for s in arm.get("sessions") or []}
        theirs = {s["context_tokens"]: s["sessions"] for s in base.get("sessions") or []}
        shared = [c for c in mine if c in theirs and (context is None or c == context)]
        if not shared or not theirs[shared[0]]:
            return None
        ctx, d = shared[0], self.ledger.rounding["sessions"]
        lo, hi = ratio_interval(mine[ctx], d, theirs[ctx], d)
        ratio = mine[ctx] / theirs[ctx]
        how = (
            f"sessions at {ctx} tokens {_num(mine[ctx])}/{_num(theirs[ctx])} = {ratio:.3f} "
            f"(change {ratio - 1:+.3f}; rounding allows {lo - 1:+.4f}..{hi - 1:+.4f})"
        )
        return lo - 1, hi - 1, how

    def kv_change(self, i: int, arm: dict[str, Any], stated: float, d_sessions: int) -> None:
        found = self.kv_change_interval(arm)
        if found is None:
            return
        lo, hi, how = found
        decimals = decimals_of(stated)
        holds = rounds_to(stated, lo, hi, decimals)
        verb = "holds" if holds else "does not hold"
        self.verdict(
            ["arms", i, "kv_cache", "change_vs_baseline"],
            "kv-change",
            holds,
            f"{how}, stated as {_num(stated)}: {verb} at {decimals_word(decimals)}",
            info=self.reference,
        )

    # -- critical concurrency ---------------------------------------------------------------

    def curve(self, arm: str, workload: str, temperature: Any) -> tuple[list[int], list[float]]:
        """(concurrencies, multipliers) for one arm/workload/temperature; concurrency null skipped."""
        points = [p for p in self.ledger.points if p["workload"] == workload and p["concurrency"] is not None]
        if temperature is not _ANY:
            points = [p for p in points if p["temperature"] == temperature]
        pairs = []
        for p in points:
            m = figures.multiplier(self.ledger, p, arm)
            if m is not None:
                pairs.append((p["concurrency"], m))
        pairs.sort()
        return [c for c, _ in pairs], [m for _, m in pairs]

    def critical(self) -> None:
        for j, stated in enumerate(self.ledger.data.get("critical_concurrency", [])):
            parts: Parts = ["critical_concurrency", j]
            temperature = stated.get("temperature", _ANY)
            if temperature is _ANY:
                temps = {p["temperature"] for p in self.ledger.points if p["workload"] == stated["workload"]}
                if len(temps) > 1:
                    self.add(
                        parts,
                        "critical",
                        f"no temperature given, but the points have several: {sorted(temps, key=str)}",
                    )
                    continue
            concurrencies, multipliers = self.curve(stated["arm"], stated["workload"], temperature)
            if not concurrencies:
                self.add(
                    parts, "critical", "no points with a concurrency and a multiplier to check it against"
                )
                continue
            crossing = theory.critical_concurrency(concurrencies, multipliers)
            computed_crosses = crossing.kind == "crosses"
            ok = True
            if stated["crosses"] != computed_crosses:
                ok = False
                self.add(
                    [*parts, "crosses"],
                    "critical",
                    f"stated crosses={str(stated['crosses']).lower()}, the points say: {crossing.describe()}",
                )
            between = stated.get("between")
            if between is not None and (crossing.between is None or tuple(between) != crossing.between):
                ok = False
                self.add(
                    [*parts, "between"],
                    "critical",
                    f"stated between {between}, the points say: {crossing.describe()}",
                )
            value = stated.get("value")
            if value is not None:
                if crossing.value is None:
                    ok = False
                    self.add(
                        [*parts, "value"],
                        "critical",
                        f"stated value {_num(value)}, the points say: {crossing.describe()}",
                    )
                elif abs(math.log2(value) - math.log2(crossing.value)) > CRITICAL_LOG2_TOLERANCE:
                    ok = False
                    self.add(
                        [*parts, "value"],
                        "critical",
                        f"stated {_num(value)}, the points say {crossing.describe()}: "
                        f"more than {CRITICAL_LOG2_TOLERANCE} apart in log2 concurrency",
                    )
            if ok and self.reference:
                self.add(parts, "critical", f"holds: {crossing.describe()}", "info")

    # -- claims -----------------------------------------------------------------------------

    def claims(self) -> None:
        for j, claim in enumerate(self.ledger.data.get("claims", [])):
            parts: Parts = ["claims", j]
            try:
                lo, hi, how = self.claim_interval(claim)
            except _Unpinned as e:
                self.add(parts, "claim", f"{claim['text']!r}: {e}")
                continue
            decimals = claim["decimals"]
            holds = rounds_to(claim["value"], lo, hi, decimals)
            verb = "holds" if holds else "does not hold"
            self.verdict(
                [*parts, "value"],
                "claim",
                holds,
                f"{how}, stated as {claim['text']}: {verb} at {decimals_word(decimals)}",
                info=True,
            )

    def claim_arm(self, claim: dict[str, Any]) -> str:
        if "arm" in claim:
            return claim["arm"]
        arms = self.ledger.speculative_arms()
        if len(arms) != 1:
            raise _Unpinned(f"names no arm, and the ledger has {len(arms)} speculative arms")
        return arms[0]["name"]

    def claim_point(self, claim: dict[str, Any], arm: str) -> dict[str, Any]:
        """The one point the claim names (fields it leaves out match anything) that has the arm."""
        matches = [
            p
            for p in self.ledger.points
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

    def claim_interval(self, claim: dict[str, Any]) -> tuple[float, float, str]:
        """(lo, hi, explanation) of the exact value behind a claim, from the most raw figures present."""
        metric, arm = claim["metric"], self.claim_arm(claim)
        if metric in ("sessions", "kv_cache_change"):
            arm_data = self.ledger.arm(arm)
            context = claim.get("context_tokens")
            if metric == "kv_cache_change":
                found = self.kv_change_interval(arm_data, context)
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
            return self.stated_interval(entries[0]["sessions"], self.ledger.rounding["sessions"], "sessions")

        point = self.claim_point(claim, arm)
        rounding = self.ledger.rounding_for(point)
        result = point["arms"][arm]
        if metric == "multiplier":
            d = rounding["output_tokens_per_s"]
            found = multiplier_interval(point, arm, self.ledger.baseline_arm_for(arm), d)
            if found is not None:
                lo, hi, (spec, base_centre, _) = found
                return lo, hi, f"{spec:.{d}f}/{base_centre:.{d}f} = {spec / base_centre:.3f}"
            if "multiplier" in result:
                return self.stated_interval(result["multiplier"], rounding["multiplier"], "multiplier")
            raise _Unpinned(f"point has neither medians nor a multiplier for arm {arm!r}")
        if metric == "acceptance_length":
            acc = result.get("acceptance", {})
            if acc.get("drafts") and acc.get("accepted_tokens") is not None:
                exact = figures.acceptance_length(acc["accepted_tokens"], acc["drafts"])
                return exact, exact, f"1 + {acc['accepted_tokens']}/{acc['drafts']} = {exact:.3f}"
            if "acceptance_length" in acc:
                return self.stated_interval(
                    acc["acceptance_length"], rounding["acceptance_length"], "acceptance length"
                )
            raise _Unpinned(f"point has no acceptance length for arm {arm!r}")
        median = result.get("output_tokens_per_s", {}).get("median")
        if median is None:
            raise _Unpinned(f"point has no output tokens/s for arm {arm!r}")
        return self.stated_interval(median, rounding["output_tokens_per_s"], "median output tokens/s")

    @staticmethod
    def stated_interval(value: float, decimals: int, what: str) -> tuple[float, float, str]:
        h = half_unit(decimals)
        return (
            value - h,
            value + h,
            f"{what} {_num(value)} (rounded to {decimals_word(decimals)}: {value - h:g}..{value + h:g})",
        )

    # -- mix --------------------------------------------------------------------------------

    def mix(self) -> None:
        mix = self.ledger.data.get("workload_mix")
        if not mix:
            return
        total = math.fsum(mix["shares"].values())
        if abs(total - 1.0) > 1e-6:
            self.add(["workload_mix", "shares"], "mix", f"shares sum to {total:.6g}, not 1")

    # -- noise against tolerance -------------------------------------------------------------

    def noise(self) -> None:
        """Can this ledger's multiplier tolerance be verified at all with its own repeat noise?

        Pools each arm's repeat-to-repeat coefficient of variation over the points (three
        repeats say little alone), predicts how far a faithful re-run's multiplier strays,
        and warns when the tolerance would fail points of an unchanged machine. That is the
        question of a fixed band (protocols before v3); a v3 point states its CI and is verified
        by the CI of the change, which `resolution` judges, so v3 points are left to it.
        """
        tol = (self.ledger.data.get("tolerances") or {}).get("multiplier_rel")
        if self.reference or not tol:
            return
        cvs: dict[str, list[float]] = {}
        engine_cvs: dict[str, list[float]] = {}
        counts: list[int] = []
        for point in self.ledger.points:
            if point.get("protocol_version", 1) >= 3:
                continue
            for arm_name, result in point["arms"].items():
                repeats = (result.get("output_tokens_per_s") or {}).get("repeats") or []
                cv = _cv(repeats)
                if cv is not None:
                    cvs.setdefault(arm_name, []).append(cv)
                    counts.append(len(repeats))
                engine = _cv((result.get("request_time_s") or {}).get("engine") or [])
                if engine is not None:
                    engine_cvs.setdefault(arm_name, []).append(engine)
        if not counts:
            return
        n = int(statistics.median(counts))

        def pooled(arm: str | None, table: Mapping[str, list[float]] = cvs) -> float | None:
            values = table.get(arm) if arm else None
            return math.sqrt(statistics.fmean(v * v for v in values)) if values else None

        for i, arm in enumerate(self.ledger.arms):
            base = self.ledger.baseline_arm_for(arm["name"]) if arm["role"] in ("speculative", "policy") else None
            cv_spec, cv_base = pooled(arm["name"]), pooled(base) if base else None
            if cv_spec is None or cv_base is None:
                continue
            sd = theory.rerun_multiplier_sd(cv_spec, cv_base, n)
            p = theory.within_tolerance_probability(sd, tol)
            if p >= 0.9:
                continue
            need = theory.repeats_for_tolerance(cv_spec, cv_base, tol)
            rotating = (self.ledger.data.get("sweep") or {}).get("repeat_prompts", "rotate") != "same"
            caveat = (" (an upper bound: with rotating prompts the repeat spread also carries the prompt mix,"
                      " which a re-run repeats)") if rotating else ""
            self.add(["arms", i], "noise",
                     f"multiplier tolerance ±{tol:.0%} is tighter than this protocol's noise: repeats vary by "
                     f"{cv_spec:.1%} ({arm['name']}) and {cv_base:.1%} ({base}) (pooled CV), so a re-run of an "
                     f"unchanged machine moves the multiplier by SD {sd:.1%} with {n} repeats and stays within "
                     f"±{tol:.0%} at only {p:.0%} of points; {need} repeats give 95%{caveat}"
                     f"{_noise_source(arm['name'], cv_spec, pooled(arm['name'], engine_cvs))}",
                     "info" if rotating else "warning")

    # -- which tolerances the v3 intervals can resolve -----------------------------------------

    def resolution(self) -> None:
        """Can a verification settle ±multiplier_rel at all, given the committed v3 intervals?

        A verdict holds only when the change's whole interval fits inside the tolerance, and the
        committed interval's width enters that interval however many fresh repeats there are
        (stats.predicted_change_half_width). So per speculative arm: the committed multiplier
        half-widths over the v3 points (median and worst), and whether the tolerance can be
        resolved at protocol.repeats.max fresh repeats, else the smallest tolerance that can.
        """
        tol = self.ledger.tolerances["multiplier_rel"]
        protocol = self.ledger.data.get("protocol") or {}
        max_repeats = (protocol.get("repeats") or {}).get("max")
        for i, arm in enumerate(self.ledger.arms):
            if arm["role"] not in ("speculative", "policy"):
                continue
            # (committed half-width, predicted change half-width, committed repeats, resolvable, point)
            rows: list[tuple[float, float, int, bool, dict[str, Any]]] = []
            for point in self.ledger.points:
                result = point["arms"].get(arm["name"]) or {}
                interval, m = result.get("multiplier_ci95"), result.get("multiplier")
                n = len((result.get("output_tokens_per_s") or {}).get("repeats") or [])
                if not is_v3(point) or interval is None or not m or m <= 0 or n < 2:
                    continue
                h = (interval[1] - interval[0]) / 2 / m
                fresh = max_repeats or n  # no protocol stated: a verification repeats what was recorded
                rows.append((h, stats.predicted_change_half_width(h, n, fresh), n,
                             stats.resolvable(h, n, fresh, tol), point))
            if not rows:
                continue
            fresh = max_repeats or max(n for _, _, n, _, _ in rows)
            ok = sum(row[3] for row in rows)
            h_median = statistics.median(row[0] for row in rows)
            p_median = statistics.median(row[1] for row in rows)
            h_worst, p_worst, n_worst, _, worst = max(rows, key=lambda row: row[1])
            message = (f"committed multiplier 95% CI half-width ±{h_median:.1%} at the median of {len(rows)} v3 "
                       f"points, ±{h_worst:.1%} at the worst ({_where(worst)}; {n_worst} repeats); a verification "
                       f"with {fresh} fresh repeats predicts the change known to ±{p_median:.1%} (median point) "
                       f"and ±{p_worst:.1%} (worst), against a tolerance of ±{tol:.0%}: ")
            if ok == len(rows):
                self.add(["arms", i], "resolution", message + "resolvable at every point", "info")
                continue
            self.add(["arms", i], "resolution",
                     message + f"resolvable at only {ok} of {len(rows)} points (elsewhere a re-run of an unchanged "
                     f"machine comes out inconclusive); ±{_pct_up(p_worst)}% would be resolvable at every point "
                     f"(±{_pct_up(p_median)}% at the median one), or record with more repeats",
                     "warning")

    def run(self) -> list[Finding]:
        self.points()
        self.kv_cache()
        self.critical()
        self.claims()
        self.mix()
        self.noise()
        self.resolution()
        return self.findings


class _Unpinned(Exception):
    """A claim or crossing names something the ledger does not pin down."""


_ANY = object()


def audit_ledger(ledger: Ledger) -> list[Finding]:
    """Every consistency finding for one loaded ledger, in ledger order."""
    return _Audit(ledger).run()


def audit_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Finding], list[Problem]]:
    """Load and audit every ledger under `paths` (directories expand to *.json).

    A ledger that fails to load contributes its problems instead of findings; the rest are
    still audited. A path that does not exist raises FileNotFoundError.
    """
    findings: list[Finding] = []
    problems: list[Problem] = []
    for path in iter_ledger_paths(paths):
        try:
            ledger = load_ledger(path)
        except LedgerError as e:
            problems.extend(e.problems)
            continue
        findings.extend(audit_ledger(ledger))
    return findings, problems


def at_least(findings: Sequence[Finding], severity: Severity) -> list[Finding]:
    """The findings at or above `severity`."""
    rank = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= rank]
