"""What a record run writes: the v3 point object built from a measurement's windows, and the run's provenance.

Why a module of its own (it was the second half of ``procedure``): ``procedure`` carries out the protocol on live
engines (warm-up, window sizing, paired repeats, acceptance passes); this module turns what it measured into ledger
JSON, rounded as the ledger states, and is also what ``replication`` uses to recompute a point over added engine
starts. Each figure has its one home here: ``throughput_figures``, ``multiplier_figures`` and ``arm_multipliers``
(with their intervals over the repeats or the engine starts), ``rounded_acceptance``, ``latency_figures``,
``lossless``; and each record run's ``provenance``, ``arm_facts`` (effective config, KV cache, sessions) and
``merge_runs`` (which run recorded which points).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specledger import __version__, stats
from specledger.analysis.theory import sessions as sessions_at
from specledger.ledger import Ledger
from specledger.ledger.figures import rounded_interval
from specledger.measure import counters

#: The measurement protocol a point built here states (``protocol_version``).
PROTOCOL_VERSION = 3


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
    for field_name, base in ledger.multiplier_bases(name):
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


def runs_of_point(prov: Mapping[str, Any] | None, label: str) -> list[Mapping[str, Any]]:
    """The provenance.runs entries that hold the point labelled ``label``, oldest first: the runs that name it
    (two when a run added its start to an earlier run's point), else the legacy run from before runs named their
    points, which holds every point no later run names."""
    runs = (prov or {}).get("runs") or []
    named = [run for run in runs if run.get("points") is not None and label in run["points"]]
    return named or [run for run in runs if run.get("points") is None][:1]


def run_of_point(prov: Mapping[str, Any] | None, label: str) -> Mapping[str, Any] | None:
    """The provenance.runs entry that first recorded the point labelled ``label`` (None when runs are not kept)."""
    return next(iter(runs_of_point(prov, label)), None)


def recorded_point_seconds(prov: Mapping[str, Any] | None, label: str) -> float | None:
    """How long the point labelled ``label`` took to measure in the ledger's earlier runs: the longest
    ``time_s.point_wall_s`` of a run that holds it, else that run's ``time_s.per_point`` (runs recorded before
    point times were kept); None when no run says."""
    seconds = []
    for run in runs_of_point(prov, label):
        times = run.get("time_s") or {}
        own = (times.get("point_wall_s") or {}).get(label)
        seconds += [own] if own is not None else [times["per_point"]] if times.get("per_point") else []
    return max(seconds, default=None)


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
