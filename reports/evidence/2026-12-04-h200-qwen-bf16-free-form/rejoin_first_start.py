"""Join this visit's one start of free-form c=2, 8, 16 and 64 to the ledger (run once, from the project root).

Why: the visit's recording stored each point new to the ledger once per arm, and every store after the first joined
the point's one start to itself (`SuiteSession._point_to_store`, fixed in 1ef495e): the ledger it wrote,
`run/ledger-as-written-not-of-record.json`, holds each new point as `replication.add_start(P, P)`, start 1 a copy
of start 0. This takes the first start back out by code: the per-window lists' first half, the counts that add up
(requests, tokens, seconds, acceptance and lossless counts) halved, and every figure recomputed with the functions
a recording uses (`recording.throughput_figures`, `recording.arm_multipliers`, `counters.acceptance`). It then
proves the split exact: `replication.add_start(ledger, P, P)` must give the as-written point again, field for
field, intervals aside (they are pooled afresh). The points join the committed ledger as one start each, the run's
provenance with them, and `replication.pool_start_intervals` takes every interval with the spread pooled over the
points that truly have two or more starts. No committed point's measured figure moves.
    python reports/evidence/2026-12-04-h200-qwen-bf16-free-form/rejoin_first_start.py
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from specledger.ledger import Ledger, io
from specledger.measure import counters, recording, replication

HERE = Path(__file__).parent
PATH = Path("ledgers/h200-qwen2.5-coder-1.5b.json")
WRITTEN = HERE / "run" / "ledger-as-written-not-of-record.json"
NOTE = ("2026-12-04: free-form c=2, 8, 16 and 64 are one start each from the visit of 2026-12-04 12:56-13:13 UTC, "
        "whose recording joined each new point's start to itself (fixed in 1ef495e); the first start was taken back "
        "out by reports/evidence/2026-12-04-h200-qwen-bf16-free-form/rejoin_first_start.py, which checks that "
        "add_start of the result with itself gives the as-written point again. Their intervals use the pooled "
        "between-start spread of the points with two or more starts.")
_COUNTS = ("drafts", "draft_tokens", "accepted_tokens")


def _half(value: int | float, what: str) -> int | float:
    if isinstance(value, int):
        if value % 2:
            raise SystemExit(f"{what}: {value} is odd, so the point is not a start joined to itself")
        return value // 2
    return value / 2


def _without_intervals(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_intervals(v) for k, v in value.items() if "ci95" not in k}
    if isinstance(value, list):
        return [_without_intervals(v) for v in value]
    return value


def first_start(ledger: Ledger, doubled: dict[str, Any]) -> dict[str, Any]:
    """The one start P of a point written as ``add_start(P, P)``."""
    label = f"{doubled['workload']}:{doubled['temperature']:g}:{doubled['concurrency']}"
    point = copy.deepcopy(doubled)
    n = None
    tps: dict[str, list[float]] = {}
    for name, arm in point["arms"].items():
        starts = arm["window"]["start"]
        n = len(starts) // 2
        if starts != [0] * n + [1] * n:
            raise SystemExit(f"{label} {name}: window.start {starts} is not one start joined to itself")
        tps[name] = [float(v) for v in arm["output_tokens_per_s"]["repeats"][:n]]
        if tps[name] != [float(v) for v in arm["output_tokens_per_s"]["repeats"][n:]]:
            raise SystemExit(f"{label} {name}: start 1's repeats differ from start 0's")
    for name, arm in point["arms"].items():
        arm["output_tokens_per_s"] = recording.throughput_figures(tps[name], None,
                                                                  ledger.rounding["output_tokens_per_s"])
        for key in ("requests", "output_tokens"):
            arm[key] = _half(int(arm[key]), f"{label} {name} {key}")
        arm["duration_s"] = round(arm["duration_s"] / 2, 3)
        arm["window"] = {key: values[:n] for key, values in arm["window"].items()}
        if "request_time_s" in arm:
            arm["request_time_s"] = {key: values[:len(values) // 2] for key, values in arm["request_time_s"].items()}
        for field_name in ("multiplier", "multiplier_vs_matched"):
            for key in (field_name, f"{field_name}_ci95", f"{field_name}_by_start"):
                arm.pop(key, None)
        if ledger.arm(name)["role"] in ("speculative", "policy"):
            arm.update(recording.arm_multipliers(ledger, name, tps, None))
            acc = arm.get("acceptance")
            if acc:
                k = (ledger.arm(name).get("speculative_config") or {}).get("num_speculative_tokens")
                halved = {key: _half(int(acc[key]), f"{label} {name} {key}") for key in _COUNTS}
                halved["accepted_per_position"] = [_half(int(v), f"{label} {name} per position")
                                                   for v in acc["accepted_per_position"]]
                one = counters.acceptance(halved, k)
                one.update({"from": acc["from"], "requests": _half(int(acc["requests"]), f"{label} {name} requests"),
                            "seconds": round(acc["seconds"] / 2, 2)})
                arm["acceptance"] = recording.rounded_acceptance(one, ledger.rounding)
                arm["speculative_tokens_per_step"] = round(one["draft_tokens"] / one["drafts"], 3)
        if arm.get("lossless"):
            loss = arm["lossless"]
            compared = _half(int(loss["requests_compared"]), f"{label} {name} requests_compared")
            identical = _half(int(loss["identical"]), f"{label} {name} identical")
            arm["lossless"] = {"requests_compared": compared, "identical": identical,
                               "identical_share": round(identical / compared, 4) if compared else 1.0,
                               "first_divergence": loss.get("first_divergence")}
    point["repeats_added"] = _half(int(point.get("repeats_added", 0)), f"{label} repeats_added")
    point["latency_from_start"] = 0
    again = replication.add_start(ledger, point, point)
    if _without_intervals(again) != _without_intervals(doubled):
        raise SystemExit(f"{label}: add_start of the first start with itself does not give the written point")
    return point


if __name__ == "__main__":
    ledger = io.load_ledger(PATH)
    written = json.loads(WRITTEN.read_text())
    have = {(p["workload"], p["temperature"], p["concurrency"]) for p in ledger.data["points"]}
    added = []
    for doubled in written["points"]:
        key = (doubled["workload"], doubled["temperature"], doubled["concurrency"])
        if key in have:
            continue
        point = first_start(ledger, doubled)
        ledger.data["points"].append(point)
        added.append(point)
        arms = ", ".join(f"{name} {arm.get('multiplier', arm['output_tokens_per_s']['mean'])}"
                         for name, arm in point["arms"].items())
        print(f"{key}: {arms}")
    if not added:
        raise SystemExit("nothing to join: the points are in the ledger already")
    ledger.data["points"].sort(key=lambda p: (p["workload"], p["temperature"], p["concurrency"]))
    ledger.data["provenance"] = written["provenance"]
    if NOTE not in ledger.data["notes"]:
        ledger.data["notes"].append(NOTE)
    replication.pool_start_intervals(ledger)
    io.write_ledger(PATH, ledger.data, overwrite=True)
    print(json.dumps(ledger.data["start_spread"]["ngram"]))
