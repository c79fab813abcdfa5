"""Paired, interleaved measurement of one ledger point across all of its arms.

Pairing is the point: every arm sees the same prompts in the same repeat, and arms
alternate within a point (A B C, then C B A) so that drift of the machine (clocks,
other tenants, a warming cache) lands on every arm alike. Counters are deltas per
arm and per repeat, summed over the repeats of the point. With ``repeat_prompts:
same`` every repeat also sends the same prompts, so the repeat spread is timing noise
alone (with the default, rotate, it also carries the prompt mix).
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

from specledger import __version__, counters, load
from specledger.schema import Ledger
from specledger.theory import sessions as sessions_at
from specledger.workloads import cycle_prompts, load_workload, resolve_fixture

Progress = Callable[[str], None]
DEFAULT_MAX_TOKENS = 128

@dataclass
class PointMeasurement:
    """One point, all arms: the ledger JSON for it plus per-repeat timings for benchmark output."""

    key: tuple[str, float, int]
    point: dict[str, Any]
    timings: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    wall_s: float = 0.0


def _noop(_: str) -> None:
    return None


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


def repeat_batches(prompts: Sequence[str], n: int, repeats: int, mode: str = "rotate") -> list[list[str]]:
    """The prompts of each repeat: the same block every time ("same") or the next block ("rotate")."""
    if mode not in ("rotate", "same"):
        raise ValueError(f"repeat_prompts must be 'rotate' or 'same', not {mode!r}")
    return [cycle_prompts(prompts, n, 0 if mode == "same" else r * n) for r in range(repeats)]


def warm_up(arms: Mapping[str, Any], prompts: Sequence[str], concurrencies: Sequence[int],
            sampling: Mapping[str, Any], progress: Progress = _noop) -> None:
    """Untimed traffic right after engine start: the first timed points otherwise run ~20% low."""
    top = max(concurrencies)
    for name, arm in arms.items():
        t0 = time.monotonic()
        arm.run(prompts=cycle_prompts(prompts, 2, 0), concurrency=1, sampling=sampling)
        arm.run(prompts=cycle_prompts(prompts, 2 * top, 0), concurrency=top, sampling=sampling)
        progress(f"warm-up {name}: {time.monotonic() - t0:.1f} s")


def measure_point(ledger: Ledger, arms: Mapping[str, Any], workload: str, temperature: float,
                  concurrency: int, *, root: Path | None = None, progress: Progress = _noop
                  ) -> PointMeasurement:
    """Measure every arm at one (workload, temperature, concurrency), interleaved and paired."""
    sweep = ledger.data.get("sweep", {})
    repeats = int(sweep.get("repeats", 3))
    rpr = sweep.get("requests_per_repeat", {})
    n = load.requests_for(concurrency, rpr.get("multiple", 4), rpr.get("minimum", 8))
    warmup = int(sweep.get("warmup_requests", concurrency))
    prompts = prompts_for(ledger, workload, root)
    sampling = sampling_for(ledger, workload, temperature)
    names = list(arms)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    t_start = time.monotonic()
    if warmup:
        for name in names:
            arms[name].run(prompts=cycle_prompts(prompts, warmup, len(prompts) // 2), concurrency=concurrency,
                           sampling=sampling)
    settle_s = float(sweep.get("settle_s", 0.0))
    batches = repeat_batches(prompts, n, repeats, sweep.get("repeat_prompts", "rotate"))
    for r, batch in enumerate(batches):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            time.sleep(settle_s)
            res = arms[name].run(prompts=batch, concurrency=concurrency, sampling=sampling)
            runs[name].append(res)
            progress(f"{workload} T={temperature:g} c={concurrency} repeat {r + 1}/{repeats} {name}: "
                     f"{res['output_tokens_per_s']:.1f} tok/s")
    point = build_point(ledger, workload, temperature, concurrency, runs)
    timings = {name: [{"wall_s": x["wall_s"], "output_tokens": x["output_tokens"],
                       "output_tokens_per_s": x["output_tokens_per_s"]} for x in rs]
               for name, rs in runs.items()}
    return PointMeasurement((workload, float(temperature), int(concurrency)), point, timings,
                            time.monotonic() - t_start)


def build_point(ledger: Ledger, workload: str, temperature: float, concurrency: int,
                runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Turn raw runs into the ledger's point object, rounded as the ledger states."""
    rounding = ledger.rounding
    r_tps, r_mult = rounding["output_tokens_per_s"], rounding["multiplier"]
    r_len, r_rate = rounding["acceptance_length"], rounding["acceptance_rate"]
    exact_median = {name: statistics.median(x["output_tokens_per_s"] for x in rs) for name, rs in runs.items()}
    arms_out: dict[str, Any] = {}
    for name, rs in runs.items():
        tps = [x["output_tokens_per_s"] for x in rs]
        result: dict[str, Any] = {
            "output_tokens_per_s": {
                "repeats": [round(v, r_tps) for v in tps],
                "median": round(exact_median[name], r_tps),
                "min": round(min(tps), r_tps),
                "max": round(max(tps), r_tps),
            },
            "requests": sum(int(x["requests"]) for x in rs),
            "output_tokens": sum(int(x["output_tokens"]) for x in rs),
            "duration_s": round(sum(float(x["wall_s"]) for x in rs), 3),
        }
        times = [x.get("request_time_s") or {} for x in rs]
        timed = [name for name in counters.REQUEST_TIMERS.values() if times and all(name in t for t in times)]
        if timed:
            result["request_time_s"] = {name: [round(t[name], 5) for t in times] for name in timed}
        arm = ledger.arm(name)
        if arm["role"] in ("speculative", "policy"):
            base = ledger.baseline_arm_for(name)
            if base in exact_median and exact_median[base] > 0:
                result["multiplier"] = round(exact_median[name] / exact_median[base], r_mult)
            matched = ledger.matched_baseline_for(name)
            if matched in exact_median and exact_median[matched] > 0:
                result["multiplier_vs_matched"] = round(exact_median[name] / exact_median[matched], r_mult)
            total: dict[str, Any] = {}
            for x in rs:
                total = counters.add(total, x["counters"])
            k = (arm.get("speculative_config") or {}).get("num_speculative_tokens")
            acc = counters.acceptance(total, k)
            if acc is not None:
                acc["acceptance_length"] = round(acc["acceptance_length"], r_len)
                acc["acceptance_rate"] = round(acc["acceptance_rate"], r_rate)
                acc["per_position"] = [round(v, r_rate) for v in acc["per_position"]]
                result["acceptance"] = acc
                result["speculative_tokens_per_step"] = round(acc["draft_tokens"] / acc["drafts"], 3)
        arms_out[name] = result
    return {"workload": workload, "temperature": float(temperature), "concurrency": int(concurrency),
            "arms": arms_out}


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


def provenance(infos: Mapping[str, Mapping[str, Any]], *, command: str | None = None,
               wall_s: float | None = None, root: Path | None = None) -> dict[str, Any]:
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
