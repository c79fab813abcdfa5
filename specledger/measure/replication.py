"""Add a run's engine start to a point a ledger already has (``--ledger-add-start``): starts gathered across runs.

Why: a point's windows from one engine start share that start's host state, and on lent H200 VMs the host moved
the multiplier between starts by more than one start's interval (reports/evidence/2026-12-03-h200-affinity-ab).
``--ledger-starts N`` spreads a point over N starts of one run, on one machine. A GPU visit has room for one start
of a whole curve, though, and starts on other machines of the same kind are what a nightly run will meet; so a
recording may instead add its start to the points the ledger has, and the point's figures are taken over all of
its starts (``stats.replicated_estimate``). A point recorded before starts were kept counts as one start.

Only what the ledger stores can be combined. Repeats and their per-window figures are concatenated; throughput,
multipliers and their intervals are recomputed over the starts (``recording.throughput_figures``,
``recording.multiplier_figures``, the one home of both) from the repeats as the ledger keeps them, rounded, so an
earlier start's multiplier may move in its last digits (at 10 tok/s, kept to 0.1, by up to half a percent);
request counts, tokens and seconds add up; acceptance counts from passes over the same prompts add up; lossless
counts add up. Latency percentiles and the warm-up cannot be combined from percentiles, so they are the added
start's (the newest host state), and the point's ``latency_from_start`` says which start that is.

Two or three starts per point give a t interval with one or two degrees of freedom. Every point of a visit shares
that visit's host state, so the between-start spread is pooled over the ledger's points, per arm and figure
(``pool_start_intervals``): every interval of that arm and figure then has the pooled degrees of freedom, a point
of one start included, and the ledger keeps the spread (``start_spread``) for verification.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from specledger.errors import SpecledgerError
from specledger.ledger import Ledger, figures
from specledger.measure import counters, recording


class StartMismatch(SpecledgerError, ValueError):
    """The added start cannot join the point: another protocol version or other arms."""


def _acceptance(old_arm: Mapping[str, Any], new_arm: Mapping[str, Any], k: int | None,
                ledger: Ledger) -> dict[str, Any] | None:
    """Counts of passes over the same prompts, added; otherwise the added start's.

    The committed counts may already sum several starts' passes (`figures.passes_over_the_same_prompts`): comparing
    them for equality dropped every earlier pass from a point's third start on (2026-12-03, copy c=1, 8 and 16 of
    the Qwen ledger)."""
    old, new = old_arm.get("acceptance"), new_arm.get("acceptance")
    if not old or not new:
        return copy.deepcopy(dict(new)) if new else None
    if not figures.passes_over_the_same_prompts(old, new, one_starts=figures.arm_start_count(old_arm),
                                                other_starts=figures.arm_start_count(new_arm)):
        return copy.deepcopy(dict(new))
    acc = counters.acceptance(counters.add(old, new), k)
    if acc is None:
        return copy.deepcopy(dict(new))
    acc.update({"from": "pass", "requests": int(old["requests"]) + int(new["requests"]),
                "seconds": round(float(old.get("seconds", 0.0)) + float(new.get("seconds", 0.0)), 2)})
    return recording.rounded_acceptance(acc, ledger.rounding)


def _lossless(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not old or not new:
        return copy.deepcopy(dict(new)) if new else None
    compared = int(old["requests_compared"]) + int(new["requests_compared"])
    identical = int(old["identical"]) + int(new["identical"])
    return {"requests_compared": compared, "identical": identical,
            "identical_share": round(identical / compared, 4) if compared else 1.0,
            "first_divergence": old.get("first_divergence") or new.get("first_divergence")}


def add_start(ledger: Ledger, committed: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    """The committed point with the measured point's windows added as its next engine start(s)."""
    label = f"{committed['workload']}:{committed['temperature']:g}:{committed['concurrency']}"
    if int(committed.get("protocol_version", 1)) != int(measured.get("protocol_version", 1)):
        raise StartMismatch(f"{ledger.path}: point {label}: committed with protocol "
                            f"v{committed.get('protocol_version', 1)}, measured with v{measured['protocol_version']}: "
                            "a start of another protocol cannot join it (record the point anew)")
    if set(committed["arms"]) != set(measured["arms"]):
        raise StartMismatch(f"{ledger.path}: point {label}: committed arms {sorted(committed['arms'])}, measured "
                            f"{sorted(measured['arms'])}: every start measures every arm")
    first = next(iter(committed["arms"]))
    old_starts = figures.engine_starts(committed["arms"][first])
    offset = max(old_starts) + 1
    new_starts = [offset + s for s in figures.engine_starts(measured["arms"][first])]
    starts = old_starts + new_starts
    rounding = ledger.rounding
    tps = {name: [float(v) for v in committed["arms"][name]["output_tokens_per_s"]["repeats"]]
           + [float(v) for v in measured["arms"][name]["output_tokens_per_s"]["repeats"]] for name in committed["arms"]}
    arms: dict[str, Any] = {}
    for name, old in committed["arms"].items():
        new = measured["arms"][name]
        if figures.engine_starts(old) != old_starts:
            raise StartMismatch(f"{ledger.path}: point {label}: arm {name} has other engine starts than {first}")
        result: dict[str, Any] = copy.deepcopy(dict(new))
        result["output_tokens_per_s"] = recording.throughput_figures(tps[name], starts, rounding["output_tokens_per_s"])
        for key in ("requests", "output_tokens"):
            result[key] = int(old.get(key, 0)) + int(new.get(key, 0))
        result["duration_s"] = round(float(old.get("duration_s", 0.0)) + float(new.get("duration_s", 0.0)), 3)
        old_w, new_w = old.get("window") or {}, new.get("window") or {}
        result["window"] = {key: list(old_w[key]) + list(new_w[key]) for key in old_w
                            if key in new_w and key != "start"}
        result["window"]["start"] = starts
        old_t, new_t = old.get("request_time_s") or {}, new.get("request_time_s") or {}
        timed = {key: list(old_t[key]) + list(new_t[key]) for key in old_t if key in new_t}
        result.pop("request_time_s", None)
        if timed:
            result["request_time_s"] = timed
        for field_name in ("multiplier", "multiplier_vs_matched"):
            for key in (field_name, f"{field_name}_ci95", f"{field_name}_by_start"):
                result.pop(key, None)
        arm = ledger.arm(name)
        if arm["role"] in ("speculative", "policy"):
            result.update(recording.arm_multipliers(ledger, name, tps, starts))
            k = (arm.get("speculative_config") or {}).get("num_speculative_tokens")
            acc = _acceptance(old, new, k, ledger)
            result.pop("acceptance", None)
            if acc is not None:
                result["acceptance"] = acc
                result["speculative_tokens_per_step"] = round(acc["draft_tokens"] / acc["drafts"], 3)
        lossless = _lossless(old.get("lossless"), new.get("lossless"))
        result.pop("lossless", None)
        if lossless is not None:
            result["lossless"] = lossless
        arms[name] = result
    point = copy.deepcopy(dict(measured))
    point["arms"] = arms
    point["repeats_added"] = int(committed.get("repeats_added", 0)) + int(measured.get("repeats_added", 0))
    point["latency_from_start"] = max(new_starts)
    if committed.get("busy") or measured.get("busy"):
        point["busy"] = True
    return point


def upsert_point(ledger: Ledger, key: tuple[str, float, int], point: dict[str, Any]) -> None:
    """Put ``point`` in place of the ledger's point at ``key`` (or beside the others), in point order, and take
    every interval again with the between-start spread pooled over the points (``pool_start_intervals``): what a
    recording's store does to the ledger's points, in one place for the store and its tests."""
    data = ledger.data
    points = [p for p in data.get("points", []) if (p["workload"], p.get("temperature"), p.get("concurrency")) != key]
    points.append(point)
    points.sort(key=lambda p: (p["workload"], p["temperature"], p["concurrency"]))
    data["points"] = points
    pool_start_intervals(ledger)


def pool_start_intervals(ledger: Ledger) -> None:
    """Pool each arm's between-start spread over the ledger's points and take every interval of that arm with it.

    Writes ``start_spread`` (or drops it when no point has two starts) and rewrites the ``ci95`` of each pooled
    figure at every point; the centres stay as measured. Derived figures only: run again, it gives the same."""
    data = ledger.data
    spreads = figures.pooled_start_spreads(ledger)
    data.pop("start_spread", None)
    if not spreads:
        return
    data["start_spread"] = {name: {f: figures.start_spread_json(s) for f, s in by_figure.items()}
                            for name, by_figure in spreads.items()}
    for point, name, field_name, interval in figures.pooled_intervals(ledger, spreads):
        *outer, key = figures.interval_field(field_name)
        holder = point["arms"][name]
        for part in outer:
            holder = holder[part]
        holder[key] = interval
