"""Spec-decode counters: deltas of vLLM's cumulative counters, and the acceptance figures they give.

vLLM's counters are process-global and cumulative, so every measurement is a
difference of two snapshots. Acceptance length is tokens per verification step:
1 + accepted / drafts (the 1 is the token the target emits itself). The rate is a
fraction: vLLM's own ``bench serve`` prints it in percent. vLLM's per-request timers
(histograms) are read the same way, as deltas of their sums and counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specledger.ledger import figures

COUNTS = ("drafts", "draft_tokens", "accepted_tokens")
#: Per-request histograms whose (sum, count) deltas time a run inside the engine: the engine
#: core's own timestamps (scheduled to last token), and the front end's arrival to finish.
REQUEST_TIMERS = {
    "vllm:request_inference_time_seconds": "engine",
    "vllm:e2e_request_latency_seconds": "end_to_end",
}


def delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """after - before, per counter and per position; a counter that went down is an error, not a zero."""
    out: dict[str, Any] = {}
    for key in COUNTS:
        d = int(after.get(key, 0)) - int(before.get(key, 0))
        if d < 0:
            raise ValueError(f"counter {key} went down ({before.get(key)} -> {after.get(key)}): "
                             "was the engine restarted between snapshots?")
        out[key] = d
    b, a = list(before.get("accepted_per_position", [])), list(after.get("accepted_per_position", []))
    b += [0] * (len(a) - len(b))
    per_pos = [int(x) - int(y) for x, y in zip(a, b, strict=False)]
    if any(v < 0 for v in per_pos):
        raise ValueError("per-position accepted counter went down between snapshots")
    out["accepted_per_position"] = per_pos
    return out


def add(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Sum two deltas (repeats of one point)."""
    out = {key: int(a.get(key, 0)) + int(b.get(key, 0)) for key in COUNTS}
    pa, pb = list(a.get("accepted_per_position", [])), list(b.get("accepted_per_position", []))
    n = max(len(pa), len(pb))
    pa += [0] * (n - len(pa))
    pb += [0] * (n - len(pb))
    out["accepted_per_position"] = [x + y for x, y in zip(pa, pb, strict=True)]
    return out


def request_times(before: Mapping[str, Sequence[float]], after: Mapping[str, Sequence[float]]
                  ) -> dict[str, float]:
    """Mean seconds per request of each timer over a run, from cumulative [sum, count] pairs.

    Why: a run's wall time mixes the engine's steps with the front end and the load generator;
    the engine core's own per-request time tells which of them a noisy repeat came from.
    Timers that finished no request in the run are left out.
    """
    out: dict[str, float] = {}
    for name, (sum_after, count_after) in after.items():
        sum_before, count_before = before.get(name, (0.0, 0.0))
        count = count_after - count_before
        if count < 0 or sum_after < sum_before:
            raise ValueError(f"request timer {name} went down between snapshots: was the engine restarted?")
        if count > 0:
            out[name] = (sum_after - sum_before) / count
    return out


def acceptance(counts: Mapping[str, Any], k: int | None = None) -> dict[str, Any] | None:
    """Acceptance length, rate and per-position rates from summed deltas; None when nothing was drafted."""
    drafts = int(counts.get("drafts", 0))
    if drafts == 0:
        return None
    draft_tokens = int(counts.get("draft_tokens", 0))
    accepted = int(counts.get("accepted_tokens", 0))
    per_pos = [int(v) for v in counts.get("accepted_per_position", [])]
    if k is not None:
        per_pos = (per_pos + [0] * k)[:k] if len(per_pos) <= k else per_pos
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_position": per_pos,
        "acceptance_length": figures.acceptance_length(accepted, drafts),
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "per_position": [v / drafts for v in per_pos],
    }
