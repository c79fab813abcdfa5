"""Protocol v3: warm-up until stable, steady-state windows, paired and interleaved repeats, one point.

Pairing is the point: every arm sees the same prompts in the same repeat, and arms alternate
within a point (A B C, then C B A), so drift of the machine (clocks, other tenants, a warming
cache) lands on every arm alike, and repeat r of one arm pairs with repeat r of another in the
multiplier's bootstrap (``specledger.stats``). Each repeat is one steady-state window
(``specledger.measure.driver``). Before a point, every arm warms up at that concurrency with windows
until two successive ones agree, since the first windows after a start or a concurrency change
run low (ngram on the H200 was still rising over 5 repeats at c=64 after an engine-start
warm-up). The window is sized from the warm-up: at least ``window.min_s`` seconds and at
least ``window.min_rounds`` request latencies, so c=1 and c=64 both see several rounds. The
latency is the slowest arm's (``window.sized_by: "slowest arm"``, the default), or each arm's
own (``"each arm"``): then a slow control arm (a draft model at 0.3x) no longer stretches the
fast arms' windows (on the H200's four-arm SmolLM2 ledger, 2.5 s windows instead of 3.1-5.6 s for
three of the four arms: about a third fewer GPU seconds per repeat). Repeats start at
``repeats.min`` and a caller's ``more`` rule (an inconclusive verdict, a recording whose CI is
still wide) adds pairs up to ``repeats.max``. Acceptance comes from one count-sized pass per
drafting arm (``acceptance_passes``), not from the time-sized windows.

Why `procedure` and not `protocol` (it was `specledger.measure` before the `measure/` layer): `protocol` is the
name the code base gives the ledger's protocol sections (`protocol = protocol_for(ledger)`, the `protocol`
argument of `window_for`), so `protocol.window_for(protocol, ...)` would shadow the module with its own argument.
The protocol is what the ledger states; this module is the procedure that carries it out for one point.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specledger.ledger import Ledger
from specledger.ledger.model import protocol_over_defaults, protocol_with_overrides
from specledger.ledger.selection import point_label
from specledger.measure import recording
from specledger.workloads import load_workload, resolve_fixture

Progress = Callable[[str], None]
DEFAULT_MAX_TOKENS = 128


@dataclass
class PointMeasurement:
    """One point, all arms: the ledger JSON for it plus per-repeat timings for benchmark output."""

    key: tuple[str, float, int]
    point: dict[str, Any]
    timings: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    wall_s: float = 0.0
    # the raw material of `point`, kept so that the windows of several engine starts can be built into one point
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    warmups: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    passes: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)


def _noop(_: str) -> None:
    return None


def protocol_for(ledger: Ledger) -> dict[str, Any]:
    """The ledger's v3 protocol over the defaults (sub-dicts merged, so a ledger can state one knob)."""
    return protocol_over_defaults(ledger.data.get("protocol"))


#: What a verification spends when its speed figures cannot be set against the ledger's (another machine,
#: or over HTTP): one warm-up window and one A-B/B-A pair of repeats. Acceptance and losslessness, the
#: figures it does assert, cover the same prompts as under the full protocol (a pass is count-sized, and
#: in "same" mode every window starts at prompt 0); tokens/s are still shown, with their wider CI. The
#: full repeats would buy a tighter interval of a figure nobody asserts: on a CPU five times slower than
#: the recording machine, ten minutes a point.
SHOWN_ONLY_PROTOCOL: Mapping[str, Mapping[str, Any]] = {"warmup": {"max_windows": 1},
                                                        "repeats": {"min": 2, "max": 2}}


def shown_only_protocol(protocol: Mapping[str, Any]) -> dict[str, Any]:
    """``protocol`` cut to SHOWN_ONLY_PROTOCOL's warm-up and repeats; every other knob is the ledger's."""
    return protocol_with_overrides(SHOWN_ONLY_PROTOCOL, base=protocol)


def prompts_for(ledger: Ledger, workload_name: str, root: Path | None = None) -> list[str]:
    """The workload's prompt texts, from its JSONL fixture (relative to the checkout root)."""
    workload = ledger.workload(workload_name)
    if not workload.get("fixture"):
        raise ValueError(f"{ledger.path}: workload {workload_name!r} has no fixture to measure with")
    prompts = [p.prompt for p in load_workload(resolve_fixture(workload["fixture"], root))]
    return prompts[: workload["num_prompts"]] if workload.get("num_prompts") else prompts


def sampling_for(ledger: Ledger, workload_name: str, temperature: float) -> dict[str, Any]:
    sampling = dict(ledger.data.get("sampling", {}))
    sampling.pop("description", None)
    workload = ledger.workload(workload_name)
    sweep = ledger.data.get("sweep", {})
    sampling["temperature"] = float(temperature)
    sampling["max_tokens"] = int(workload.get("max_tokens") or sweep.get("max_tokens") or DEFAULT_MAX_TOKENS)
    return sampling


def warm_up_arm(arm: Any, prompts: list[str], concurrency: int, sampling: Mapping[str, Any],
                protocol: Mapping[str, Any], settle_s: float = 0.0) -> dict[str, Any]:
    """Warm-up windows at this concurrency until two successive ones agree (or the cap); what it spent."""
    warm = protocol["warmup"]
    t0 = time.monotonic()
    rates: list[float] = []
    latency = None
    converged = False
    for _ in range(int(warm["max_windows"])):
        time.sleep(settle_s)
        res = arm.run(prompts=prompts, concurrency=concurrency, sampling=sampling,
                      window_s=float(protocol["window"]["min_s"]), first_index=len(prompts) // 2)
        rates.append(res["output_tokens_per_s"])
        latency = res.get("request_latency_median_s") or latency
        if len(rates) >= 2 and abs(rates[-1] - rates[-2]) <= float(warm["agree_rel"]) * max(rates[-2], 1e-9):
            converged = True
            break
    return {"windows": len(rates), "seconds": round(time.monotonic() - t0, 1),
            "output_tokens_per_s": [round(r, 1) for r in rates], "converged": converged,
            "request_latency_s": latency}


WINDOW_SIZED_BY = ("slowest arm", "each arm")


def window_for(protocol: Mapping[str, Any], latencies_s: Sequence[float | None]) -> float:
    """Window seconds: at least min_s, and min_rounds request latencies of the slowest arm."""
    known = [lat for lat in latencies_s if lat]
    rounds = float(protocol["window"]["min_rounds"]) * (max(known) if known else 0.0)
    return round(max(float(protocol["window"]["min_s"]), rounds), 2)


def windows_for(protocol: Mapping[str, Any], latencies_s: Mapping[str, float | None]) -> dict[str, float]:
    """Each arm's window seconds, as ``window.sized_by`` says: one window for all (the slowest arm's
    latency) or each arm's own."""
    sized_by = protocol["window"].get("sized_by", "slowest arm")
    if sized_by not in WINDOW_SIZED_BY:
        raise ValueError(f"protocol.window.sized_by must be one of {WINDOW_SIZED_BY}, not {sized_by!r}")
    if sized_by == "each arm":
        return {name: window_for(protocol, [lat]) for name, lat in latencies_s.items()}
    common = window_for(protocol, list(latencies_s.values()))
    return {name: common for name in latencies_s}


def first_index(repeat: int, concurrency: int, n_prompts: int, mode: str = "same") -> int:
    """Where repeat ``repeat`` starts in the prompt cycle: always 0 ("same": every repeat sends the same
    sequence, so the spread across repeats is timing noise alone), or one block of ``concurrency`` further
    each repeat ("rotate": the spread then carries the prompt mix too)."""
    if mode not in ("rotate", "same"):
        raise ValueError(f"repeat_prompts must be 'rotate' or 'same', not {mode!r}")
    return 0 if mode == "same" else (repeat * concurrency) % n_prompts


MoreRule = Callable[[dict[str, Any], int], bool]

#: Where a point's acceptance figures come from (protocol.acceptance.from): "pass", one pass over the
#: workload's prompts; "windows", the timed repeats (every v3 ledger recorded before the pass existed).
ACCEPTANCE_SOURCES = ("pass", "windows")


def acceptance_passes(ledger: Ledger, arms: Mapping[str, Any], prompts: list[str], concurrency: int,
                      sampling: Mapping[str, Any], protocol: Mapping[str, Any], progress: Progress = _noop,
                      *, label: str = "") -> dict[str, dict[str, Any]]:
    """One prompt pass per drafting arm at this concurrency, whose counters give the acceptance figures.

    Why: a window covers the prompts its time allows, so its acceptance length moved with speed (a
    record and a verify of one CPU point, same machine, disagreed by more than 0.1) and, at c=1, came
    from the first few prompts only. A pass covers ``protocol.acceptance.prompts`` prompts (all when
    unset), each to its end, at any speed. It runs after the warm-up, so compilation is not in it.
    """
    source = protocol["acceptance"]["from"]
    if source not in ACCEPTANCE_SOURCES:
        raise ValueError(f"protocol.acceptance.from must be one of {ACCEPTANCE_SOURCES}, not {source!r}")
    if source != "pass":
        return {}
    n = protocol["acceptance"].get("prompts")
    chosen = prompts[: int(n)] if n else prompts
    out: dict[str, dict[str, Any]] = {}
    for arm in ledger.speculative_arms():
        if arm["name"] in arms:
            out[arm["name"]] = arms[arm["name"]].prompt_pass(prompts=chosen, concurrency=concurrency, sampling=sampling)
            done = out[arm["name"]]
            progress(f"{label} acceptance pass {arm['name']}: {done['requests']} prompts in {done['seconds']:.1f} s")
    return out


def _host_note(window: Mapping[str, Any]) -> str:
    """`, host slice 12.4 ms, CPU steal 3.1%` for a progress line: the host's speed around the window, and steal when
    the hypervisor took a visible share of it (>= 0.5%), so a slow window can be told from a slow host as it runs."""
    host_ms, steal = window.get("host_slice_ms"), window.get("cpu_steal_share")
    return ((f", host slice {host_ms:.1f} ms" if host_ms is not None else "")
            + (f", CPU steal {steal:.1%}" if steal is not None and steal >= 0.005 else ""))


def measure_point(ledger: Ledger, arms: Mapping[str, Any], workload: str, temperature: float,
                  concurrency: int, *, root: Path | None = None, progress: Progress = _noop,
                  more: MoreRule | None = None, protocol: Mapping[str, Any] | None = None,
                  start: int | None = None, passes: Mapping[str, Mapping[str, Any]] | None = None
                  ) -> PointMeasurement:
    """Measure every arm at one (workload, temperature, concurrency): warm-up, then paired windows.

    ``more(point, repeats)`` is asked after the minimum repeats and after each added pair;
    while it says yes and the cap allows, two more repeats run (one A-B, one B-A).
    ``protocol`` replaces the ledger's (``shown_only_protocol``); by default it is the ledger's own.
    ``start`` tags every window with the engine start it ran in (``merge_starts``); ``passes`` are acceptance
    passes an earlier start of this point already ran (acceptance does not depend on the start: counted once).
    """
    protocol = protocol_for(ledger) if protocol is None else protocol
    sweep = ledger.data.get("sweep", {})
    prompts = prompts_for(ledger, workload, root)
    sampling = sampling_for(ledger, workload, temperature)
    settle_s = float(sweep.get("settle_s", 0.0))
    names = list(arms)
    label = point_label((workload, temperature, concurrency))
    t_start = time.monotonic()
    warmups: dict[str, dict[str, Any]] = {}
    for name in names:
        warmups[name] = warm_up_arm(arms[name], prompts, concurrency, sampling, protocol, settle_s)
        w = warmups[name]
        progress(f"{label} warm-up {name}: {w['windows']} windows, "
                 f"{w['seconds']:.0f} s, tok/s {w['output_tokens_per_s']}"
                 + ("" if w["converged"] or int(protocol["warmup"]["max_windows"]) < 2
                    else " (cap reached before two windows agreed)"))
    passes = dict(passes) if passes is not None else acceptance_passes(
        ledger, arms, prompts, concurrency, sampling, protocol, progress,
        label=label)
    window_s = windows_for(protocol, {name: w["request_latency_s"] for name, w in warmups.items()})
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    mode = sweep.get("repeat_prompts", "same")
    min_repeats, max_repeats = int(protocol["repeats"]["min"]), int(protocol["repeats"]["max"])

    def one_repeat(r: int, planned: int) -> None:
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            time.sleep(settle_s)
            res = arms[name].run(prompts=prompts, concurrency=concurrency, sampling=sampling, window_s=window_s[name],
                                 first_index=first_index(r, concurrency, len(prompts), mode))
            if start is not None:
                res = {**res, "start": start}
            runs[name].append(res)
            eta = (time.monotonic() - t_start) / max(1, sum(map(len, runs.values()))) \
                * (planned * len(names) - sum(map(len, runs.values())))
            progress(f"{label} repeat {r + 1}/{planned} {name}: "
                     f"{res['output_tokens_per_s']:.1f} tok/s in a {res['window_s']:.1f} s window "
                     f"({res['requests']} requests, {res['rounds'] or 0:.1f} rounds{_host_note(res)}); "
                     f"point ETA {eta:.0f} s")

    for r in range(min_repeats):
        one_repeat(r, min_repeats)
    point = recording.build_point(ledger, workload, temperature, concurrency, runs, warmups, passes)
    while more is not None and len(runs[names[0]]) + 2 <= max_repeats and more(point, len(runs[names[0]])):
        n = len(runs[names[0]])
        progress(f"{label}: {n} repeats do not settle it; 2 more "
                 f"(cap {max_repeats})")
        one_repeat(n, n + 2)
        one_repeat(n + 1, n + 2)
        point = recording.build_point(ledger, workload, temperature, concurrency, runs, warmups, passes)
    point["repeats_added"] = len(runs[names[0]]) - min_repeats
    timings = {name: [{"window_s": x["window_s"], "output_tokens": x["output_tokens"],
                       "output_tokens_per_s": x["output_tokens_per_s"]} for x in rs]
               for name, rs in runs.items()}
    return PointMeasurement((workload, float(temperature), int(concurrency)), point, timings,
                            time.monotonic() - t_start, runs=runs, warmups=warmups, passes=passes)


def merge_starts(ledger: Ledger, parts: Sequence[PointMeasurement]) -> PointMeasurement:
    """One point from its measurements in several engine starts (each from ``measure_point(start=i)``): the
    windows in start order, the warm-ups of the last start, the acceptance passes of the first."""
    if not parts:
        raise ValueError("merge_starts: no measurements")
    key = parts[0].key
    if any(part.key != key for part in parts):
        raise ValueError(f"merge_starts: measurements of different points: {[part.key for part in parts]}")
    runs = {name: [x for part in parts for x in part.runs[name]] for name in parts[0].runs}
    point = recording.build_point(ledger, *key, runs, parts[-1].warmups, parts[0].passes)
    point["repeats_added"] = sum(int(part.point.get("repeats_added", 0)) for part in parts)
    timings = {name: [t for part in parts for t in part.timings.get(name, [])] for name in parts[0].timings}
    return PointMeasurement(key, point, timings, sum(part.wall_s for part in parts), runs=runs,
                            warmups=dict(parts[-1].warmups), passes=dict(parts[0].passes))
