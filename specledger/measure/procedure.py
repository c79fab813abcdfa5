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

import datetime as _dt
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specledger import __version__, stats
from specledger.analysis.theory import sessions as sessions_at
from specledger.ledger import Ledger
from specledger.ledger.model import protocol_over_defaults, protocol_with_overrides
from specledger.measure import counters
from specledger.workloads import load_workload, resolve_fixture

Progress = Callable[[str], None]
DEFAULT_MAX_TOKENS = 128
PROTOCOL_VERSION = 3


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
    t_start = time.monotonic()
    warmups: dict[str, dict[str, Any]] = {}
    for name in names:
        warmups[name] = warm_up_arm(arms[name], prompts, concurrency, sampling, protocol, settle_s)
        w = warmups[name]
        progress(f"{workload} T={temperature:g} c={concurrency} warm-up {name}: {w['windows']} windows, "
                 f"{w['seconds']:.0f} s, tok/s {w['output_tokens_per_s']}"
                 + ("" if w["converged"] or int(protocol["warmup"]["max_windows"]) < 2
                    else " (cap reached before two windows agreed)"))
    passes = dict(passes) if passes is not None else acceptance_passes(
        ledger, arms, prompts, concurrency, sampling, protocol, progress,
        label=f"{workload} T={temperature:g} c={concurrency}")
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
            progress(f"{workload} T={temperature:g} c={concurrency} repeat {r + 1}/{planned} {name}: "
                     f"{res['output_tokens_per_s']:.1f} tok/s in a {res['window_s']:.1f} s window "
                     f"({res['requests']} requests, {res['rounds'] or 0:.1f} rounds{_host_note(res)}); "
                     f"point ETA {eta:.0f} s")

    for r in range(min_repeats):
        one_repeat(r, min_repeats)
    point = build_point(ledger, workload, temperature, concurrency, runs, warmups, passes)
    while more is not None and len(runs[names[0]]) + 2 <= max_repeats and more(point, len(runs[names[0]])):
        n = len(runs[names[0]])
        progress(f"{workload} T={temperature:g} c={concurrency}: {n} repeats do not settle it; 2 more "
                 f"(cap {max_repeats})")
        one_repeat(n, n + 2)
        one_repeat(n + 1, n + 2)
        point = build_point(ledger, workload, temperature, concurrency, runs, warmups, passes)
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
    point = build_point(ledger, *key, runs, parts[-1].warmups, parts[0].passes)
    point["repeats_added"] = sum(int(part.point.get("repeats_added", 0)) for part in parts)
    timings = {name: [t for part in parts for t in part.timings.get(name, [])] for name in parts[0].timings}
    return PointMeasurement(key, point, timings, sum(part.wall_s for part in parts), runs=runs,
                            warmups=dict(parts[-1].warmups), passes=dict(parts[0].passes))


def _percentiles(values: Sequence[float], digits: int = 5) -> dict[str, float] | None:
    if not values:
        return None
    p50, p99 = np.percentile(np.asarray(values, dtype=float), [50, 99])
    return {"p50": round(float(p50), digits), "p99": round(float(p99), digits)}


def latency_figures(rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """TTFT, TPOT and ITL at p50/p99 over a point's windows, as `vllm bench serve` reports them."""
    out = {}
    for name in ("ttft", "tpot", "itl"):
        pct = _percentiles([v for x in rs for v in x.get(f"{name}_s", [])])
        if pct is not None:
            out[name] = pct
    return out


def lossless(spec_runs: Sequence[Mapping[str, Any]], base_runs: Sequence[Mapping[str, Any]]
             ) -> dict[str, Any] | None:
    """At T=0 speculation must not change the output: the speculative arm's tokens against the baseline's.

    Compared per prompt (the first finished request of each prompt in the point's windows);
    prompts that one arm never finished are left out.
    """
    def first_outputs(rs: Sequence[Mapping[str, Any]]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for x in rs:
            for k, v in (x.get("outputs") or {}).items():
                out.setdefault(int(k), v)
        return out

    spec, base = first_outputs(spec_runs), first_outputs(base_runs)
    common = sorted(set(spec) & set(base))
    if not common:
        return None
    identical = 0
    first: dict[str, int] | None = None
    for k in common:
        a, b = spec[k], base[k]
        if a == b:
            identical += 1
        elif first is None:
            j = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            first = {"prompt_index": k, "token_index": j}
    return {"requests_compared": len(common), "identical": identical,
            "identical_share": round(identical / len(common), 4), "first_divergence": first}


def start_indices(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[int] | None:
    """Each window's engine start, where the windows came from two or more starts (None: one start, or untagged).

    Then a point's intervals are taken over its starts (``stats.replicated_estimate``), since windows of one start
    share its host state; every arm ran in every start, paired window by window, so one list serves all arms."""
    tagged = [[x.get("start") for x in rs] for rs in runs.values()]
    if not tagged or any(s is None for rs in tagged for s in rs):
        return None
    if any(rs != tagged[0] for rs in tagged):
        raise ValueError(f"arms were measured in different engine starts: {tagged}")
    starts = [int(s) for s in tagged[0]]
    return starts if len(set(starts)) >= 2 else None


def rounded_interval(e: stats.Estimate, digits: int) -> list[float]:
    """[low, high] rounded as the ledger states its figure."""
    return [round(e.low, digits), round(e.high, digits)]


def throughput_figures(values: Sequence[float], starts: Sequence[int] | None, digits: int) -> dict[str, Any]:
    """An arm's ``output_tokens_per_s`` object: the repeats, their spread, and the mean with its interval (over the
    engine starts where ``starts`` names two or more, else the repeats' bootstrap)."""
    mean = stats.replicated_estimate(stats.start_means(values, starts)) if starts else stats.mean_estimate(values)
    return {"repeats": [round(v, digits) for v in values], "median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits),
            "mean": round(mean.value, digits), "ci95": rounded_interval(mean, digits)}


def multiplier_figures(field_name: str, values: Sequence[float], base: Sequence[float],
                       starts: Sequence[int] | None, digits: int) -> dict[str, Any]:
    """``multiplier`` (or ``multiplier_vs_matched``) with its interval: over the engine starts, with each start's
    figure beside it, where ``starts`` names two or more; else the paired bootstrap of the repeats."""
    out: dict[str, Any] = {}
    if starts:
        per_start = stats.start_multipliers(values, base, starts)
        m = stats.replicated_estimate(per_start)
        out[f"{field_name}_by_start"] = [round(v, digits) for v in per_start]
    else:
        m = stats.multiplier_estimate(values, base)
    return {field_name: round(m.value, digits), f"{field_name}_ci95": rounded_interval(m, digits), **out}


def arm_multipliers(ledger: Ledger, name: str, tps: Mapping[str, Sequence[float]],
                    starts: Sequence[int] | None) -> dict[str, Any]:
    """A drafting arm's ``multiplier`` against its baseline and ``multiplier_vs_matched`` against its matched
    baseline, each where that arm was measured (``multiplier_figures``)."""
    out: dict[str, Any] = {}
    for field_name, base in (("multiplier", ledger.baseline_arm_for(name)),
                             ("multiplier_vs_matched", ledger.matched_baseline_for(name))):
        if base in tps and statistics.fmean(tps[base]) > 0:
            out.update(multiplier_figures(field_name, tps[name], tps[base], starts, ledger.rounding["multiplier"]))
    return out


def rounded_acceptance(acc: dict[str, Any], rounding: Mapping[str, int]) -> dict[str, Any]:
    """``counters.acceptance`` figures rounded as the ledger states (length, rate, per-position rates)."""
    acc["acceptance_length"] = round(acc["acceptance_length"], rounding["acceptance_length"])
    acc["acceptance_rate"] = round(acc["acceptance_rate"], rounding["acceptance_rate"])
    acc["per_position"] = [round(v, rounding["acceptance_rate"]) for v in acc["per_position"]]
    return acc


def build_point(ledger: Ledger, workload: str, temperature: float, concurrency: int,
                runs: Mapping[str, Sequence[Mapping[str, Any]]],
                warmups: Mapping[str, Mapping[str, Any]] | None = None,
                passes: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Turn raw windows (and acceptance passes) into the ledger's v3 point object, rounded as the ledger states."""
    rounding = ledger.rounding
    r_tps = rounding["output_tokens_per_s"]
    tps = {name: [float(x["output_tokens_per_s"]) for x in rs] for name, rs in runs.items()}
    arms_out: dict[str, Any] = {}
    starts = start_indices(runs)

    for name, rs in runs.items():
        values = tps[name]
        result: dict[str, Any] = {
            "output_tokens_per_s": throughput_figures(values, starts, r_tps),
            "requests": sum(int(x["requests"]) for x in rs),
            "output_tokens": sum(int(x["output_tokens"]) for x in rs),
            "duration_s": round(sum(float(x["window_s"]) for x in rs), 3),
            "window": {"seconds": [round(float(x["window_s"]), 3) for x in rs],
                       "ramp_s": [round(float(x["ramp_s"]), 3) for x in rs],
                       "requests": [int(x["requests"]) for x in rs],
                       "rounds": [round(float(x["rounds"] or 0.0), 2) for x in rs]},
        }
        for key, digits in (("longest_gap_s", 4), ("cpu_steal_share", 4), ("cpu_busy_share", 4),
                            ("host_slice_ms", 3), ("opened_unix_s", 2)):
            if all(x.get(key) is not None for x in rs):
                result["window"][key] = [round(float(x[key]), digits) for x in rs]
        if all(x.get("start") is not None for x in rs):
            result["window"]["start"] = [int(x["start"]) for x in rs]
        if warmups and name in warmups:
            result["warmup"] = {k: v for k, v in warmups[name].items() if k != "request_latency_s"}
        latency = latency_figures(rs)
        if latency:
            result["latency_s"] = latency
        times = [x.get("request_time_s") or {} for x in rs]
        timed = [t for t in counters.REQUEST_TIMERS.values() if times and all(t in x for x in times)]
        if timed:
            result["request_time_s"] = {t: [round(x[t], 5) for x in times] for t in timed}
        arm = ledger.arm(name)
        if arm["role"] in ("speculative", "policy"):
            result.update(arm_multipliers(ledger, name, tps, starts))
            done = (passes or {}).get(name)
            total: dict[str, Any] = {}
            for x in [done] if done else rs:
                total = counters.add(total, x["counters"])
            k = (arm.get("speculative_config") or {}).get("num_speculative_tokens")
            acc = counters.acceptance(total, k)
            if acc is not None:
                acc["from"] = "pass" if done else "windows"
                if done:
                    acc["requests"] = int(done["requests"])
                    acc["seconds"] = round(float(done["seconds"]), 2)
                result["acceptance"] = rounded_acceptance(acc, rounding)
                result["speculative_tokens_per_step"] = round(acc["draft_tokens"] / acc["drafts"], 3)
            base = ledger.baseline_arm_for(name)
            if float(temperature) == 0.0 and base in runs:
                same = lossless(rs, runs[base])
                if same is not None:
                    result["lossless"] = same
        arms_out[name] = result
    return {"workload": workload, "temperature": float(temperature), "concurrency": int(concurrency),
            "protocol_version": PROTOCOL_VERSION, "arms": arms_out}


def arm_facts(ledger: Ledger, infos: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-arm effective config, KV-cache capacity and sessions, as the engines reported them."""
    contexts = ledger.data.get("session_context_tokens") or [ledger.data["target"].get("max_model_len", 2048)]
    base_name = next((a["name"] for a in ledger.arms if a["role"] == "baseline"), None)
    base_tokens = infos.get(base_name, {}).get("kv_cache", {}).get("tokens") if base_name else None
    out: dict[str, dict[str, Any]] = {}
    digits = ledger.rounding["sessions"]
    for name, info in infos.items():
        kv = dict(info["kv_cache"])
        if base_tokens and name != base_name:
            kv["change_vs_baseline"] = round(kv["tokens"] / base_tokens - 1.0, 4)
        out[name] = {
            "effective_config": dict(info["effective_config"]),
            "kv_cache": kv,
            "sessions": [{"context_tokens": int(c),
                          "sessions": round(sessions_at(kv["tokens"], int(c)), digits)} for c in contexts],
        }
    return out


def kv_cache_drift(recorded_arms: Sequence[Mapping[str, Any]],
                   infos: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Arms whose KV capacity in this run differs from the one the ledger holds (an earlier run's), one line each.

    Why: vLLM sizes the KV cache from a profiling run, and what that run sees moves with the start's conditions:
    on 2026-12-02 the same six Qwen arms on the same H200 got 0.6-1.7% more KV blocks with a restored compile
    cache than without (baseline 40,211 blocks against 39,523). A ledger extended by a later run shows the latest
    capacity at the top level, so the earlier capacity has to stay with its run, and the difference be said.
    """
    lines = []
    for arm in recorded_arms:
        before = (arm.get("kv_cache") or {}).get("tokens")
        now = (infos.get(arm["name"], {}).get("kv_cache") or {}).get("tokens")
        if before and now and before != now:
            lines.append(f"{arm['name']}: KV cache {now:,} tokens in this run, {before:,} in the ledger's "
                         f"earlier run ({now / before - 1.0:+.2%})")
    return lines


#: What a provenance.runs entry keeps of its run's provenance.
_RUN_KEYS = ("date", "git_commit", "command", "wall_s", "machine", "time_s")


def merge_runs(previous: Mapping[str, Any] | None, current: Mapping[str, Any], started: str,
               recorded: Sequence[str], kv_cache_tokens: Mapping[str, int] | None = None,
               shared: Sequence[str] = ()) -> list[dict[str, Any]]:
    """``provenance.runs`` after this run: one entry per recording run with the points it holds.

    A ledger extended or resumed by a later run (another visit, another day, maybe another machine)
    keeps who measured which point: the earlier runs' entries stay (an older ledger's top-level
    provenance becomes its first entry), a point measured again moves to this run, and a run left
    holding no point drops out. ``started`` tells this run's entry apart across its own stores.
    ``kv_cache_tokens`` (arm -> tokens) keeps the KV capacity each arm had in this run (see kv_cache_drift).
    ``shared`` names the points this run added its engine start to (``--ledger-add-start``): their earlier runs
    still hold windows of them, so they keep them too.
    """
    prior = [dict(r) for r in (previous or {}).get("runs") or []]
    if not prior and previous and previous.get("date"):
        prior = [{"started": previous["date"], **{k: previous[k] for k in _RUN_KEYS if k in previous},
                  "points": None}]  # None: every point that no later run claims
    mine = set(recorded) - set(shared)
    out: list[dict[str, Any]] = []
    for run in prior:
        if run.get("started") == started:
            continue
        if run.get("points") is not None:
            run["points"] = [p for p in run["points"] if p not in mine]
            if not run["points"]:
                continue
        out.append(run)
    entry = {"started": started, **{k: current[k] for k in _RUN_KEYS if k in current}, "points": sorted(recorded)}
    if kv_cache_tokens:
        entry["kv_cache_tokens"] = {name: int(tokens) for name, tokens in kv_cache_tokens.items()}
    out.append(entry)
    return out


def run_of_point(prov: Mapping[str, Any] | None, label: str) -> Mapping[str, Any] | None:
    """The provenance.runs entry that recorded the point labelled ``label`` (None when runs are not kept)."""
    runs = (prov or {}).get("runs") or []
    for run in runs:
        if run.get("points") is not None and label in run["points"]:
            return run
    return next((run for run in runs if run.get("points") is None), None)


def provenance(infos: Mapping[str, Mapping[str, Any]], *, command: str | None = None,
               wall_s: float | None = None, root: Path | None = None,
               machine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Who measured this, on what, with which code: enough to judge whether a re-run is comparable."""
    any_info = next(iter(infos.values()))
    prov: dict[str, Any] = {
        "engine": dict(any_info["engine"]),
        "torch_version": any_info["torch_version"],
        "python_version": platform.python_version(),
        "accelerator": dict(any_info["accelerator"]),
        "host": platform.node() or "unknown",
        "suite_version": __version__,
        "git_commit": git_commit(root),
        "date": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
    }
    if machine:
        prov["machine"] = dict(machine)
    if command:
        prov["command"] = command
    if wall_s is not None:
        prov["wall_s"] = round(wall_s, 1)
    return prov


def git_commit(root: Path | None = None) -> str:
    """HEAD of the checkout (``SPECLEDGER_GIT_COMMIT`` where the copy has no .git, e.g. the GPU machine)."""
    if os.environ.get("SPECLEDGER_GIT_COMMIT"):
        return os.environ["SPECLEDGER_GIT_COMMIT"]
    try:
        cwd = root or Path.cwd()
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        # Recording rewrites ledgers/ itself: only code changes make a run "dirty".
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!ledgers"],
                               cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
