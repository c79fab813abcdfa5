"""Tables over ledgers (pandas), for `specledger show` and for reports and plots built on them.

One row per figure, one column per quantity, units in the column names as in the ledger, so
a plot or a Markdown report is a groupby away. Missing figures are NaN (numbers) or None
(labels); concurrency is a nullable integer column (pandas `Int64`) so that 64 prints as 64
and an unpublished concurrency as <NA>. No vLLM here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from specledger.analysis import theory
from specledger.ledger import Ledger, figures

__all__ = ["CRITICAL_COLUMNS", "DRAFTER_CONFIG_KEYS", "POINTS_COLUMNS", "STARTS_COLUMNS", "config_differences",
           "critical_table", "format_table", "points_table", "starts_table", "verdict_table"]

POINTS_COLUMNS = [
    "ledger",
    "target",
    "arm",
    "baseline_arm",
    "workload",
    "temperature",
    "concurrency",
    "baseline_tokens_per_s",
    "spec_tokens_per_s",
    "multiplier",
    "multiplier_vs_matched",
    "acceptance_length",
    "acceptance_rate",
    "spread",
    "multiplier_range",
    "multiplier_ci95",
    "multiplier_vs_matched_ci95",
]
CRITICAL_COLUMNS = [
    "ledger",
    "target",
    "arm",
    "workload",
    "temperature",
    "concurrencies",
    "kind",
    "value",
    "between",
    "critical_concurrency",
    "above_again_at",
    "loss_bracket_ci95",
    "wins_after_loss_ci95",
    "critical_ci95",
]

STARTS_COLUMNS = [
    "ledger",
    "arm",
    "workload",
    "temperature",
    "concurrency",
    "start",
    "windows",
    "output_tokens_per_s",
    "multiplier",
    "multiplier_vs_matched",
    "host_slice_ms",
    "cpu_steal_share",
]

_NAN = math.nan


def _number(value: Any) -> float:
    return _NAN if value is None else float(value)


def _median(result: dict[str, Any] | None) -> float:
    if not result:
        return _NAN
    return _number(result.get("output_tokens_per_s", {}).get("median"))


def points_table(ledgers: Iterable[Ledger]) -> pd.DataFrame:
    """One row per (ledger, speculative/policy arm, point that has that arm), in ledger order.

    `multiplier` is the stated one, else `figures.multiplier`'s ratio; `multiplier_range` (a
    (low, high) tuple or None) carries published ranges, which have no single multiplier;
    `multiplier_ci95` and `multiplier_vs_matched_ci95` (each a (low, high) tuple or None) the recorded CIs of
    a protocol v3 point, so that no table shows a v3 verdict without its uncertainty.
    """
    rows: list[dict[str, Any]] = []
    for ledger in ledgers:
        for arm in ledger.speculative_arms():
            name = arm["name"]
            base = ledger.baseline_arm_for(name)
            for point in ledger.points:
                result = point["arms"].get(name)
                if result is None:
                    continue
                acceptance = result.get("acceptance") or {}
                low_high = result.get("multiplier_range")
                ci95, matched_ci95 = result.get("multiplier_ci95"), result.get("multiplier_vs_matched_ci95")
                rows.append(
                    {
                        "ledger": ledger.id,
                        "target": ledger.data["target"]["name"],
                        "arm": name,
                        "baseline_arm": base,
                        "workload": point["workload"],
                        "temperature": _number(point["temperature"]),
                        "concurrency": point["concurrency"],
                        "baseline_tokens_per_s": _median(point["arms"].get(base) if base else None),
                        "spec_tokens_per_s": _median(result),
                        "multiplier": _number(figures.multiplier(ledger, point, name)),
                        "multiplier_vs_matched": _number(result.get("multiplier_vs_matched")),
                        "acceptance_length": _number(acceptance.get("acceptance_length")),
                        "acceptance_rate": _number(acceptance.get("acceptance_rate")),
                        "spread": _number(figures.throughput_spread(result)),
                        "multiplier_range": tuple(low_high) if low_high is not None else None,
                        "multiplier_ci95": tuple(ci95) if ci95 is not None else None,
                        "multiplier_vs_matched_ci95": tuple(matched_ci95) if matched_ci95 is not None else None,
                    }
                )
    df = pd.DataFrame(rows, columns=POINTS_COLUMNS)
    df["concurrency"] = df["concurrency"].astype("Int64")
    float_columns = [
        c
        for c in POINTS_COLUMNS[POINTS_COLUMNS.index("temperature") :]
        if c not in ("concurrency", "multiplier_range", "multiplier_ci95", "multiplier_vs_matched_ci95")
    ]
    return df.astype({c: float for c in float_columns})


def starts_table(ledgers: Iterable[Ledger]) -> pd.DataFrame:
    """One row per (ledger, arm, point measured in two or more engine starts, start), in start order: that start's
    mean output tokens/s and multipliers beside the host state its windows saw (median host slice, mean CPU steal).

    Why: ``start_spread`` says how far a ledger's starts disagree, not which start or why. On the H100 Qwen ledger
    a second lease ran the host slice at 26 ms where the first ran it at 11, and its c=64 baseline fell 62%: a
    reader of a wide interval needs to see that beside the figures (``figures.figures_by_start`` makes them)."""
    rows: list[dict[str, Any]] = []
    for ledger in ledgers:
        for point in ledger.points:
            if not figures.is_v3(point):
                continue
            for name, result in point["arms"].items():
                starts = figures.engine_starts(result)
                order = list(dict.fromkeys(starts))
                if len(order) < 2:
                    continue
                by_start = figures.figures_by_start(ledger, point, name)
                host = figures.per_start_window_statistic(result, "host_slice_ms")
                steal = figures.per_start_window_statistic(result, "cpu_steal_share", statistics.fmean)
                for i, start in enumerate(order):
                    rows.append({
                        "ledger": ledger.id, "arm": name, "workload": point["workload"],
                        "temperature": _number(point["temperature"]), "concurrency": point["concurrency"],
                        "start": start, "windows": starts.count(start),
                        **{f: by_start[start].get(f, _NAN)
                           for f in ("output_tokens_per_s", "multiplier", "multiplier_vs_matched")},
                        "host_slice_ms": host[i], "cpu_steal_share": steal[i],
                    })
    df = pd.DataFrame(rows, columns=STARTS_COLUMNS)
    return df.astype({"concurrency": "Int64", "start": "Int64", "windows": "Int64"})


def critical_table(ledgers: Iterable[Ledger]) -> pd.DataFrame:
    """One row per (ledger, arm, workload, temperature) with a multiplier at >= 1 known concurrency.

    The crossing comes from `theory.critical_concurrency` (points with null concurrency are
    skipped); `critical_concurrency` is its one-line description. Where every point of the curve
    states its multiplier's 95% CI (protocol v3), `loss_bracket_ci95` is `theory.loss_bracket` over
    them and `critical_ci95` its description: what the intervals establish about the first loss,
    which the interpolated point estimate alone overstates. `above_again_at` (point estimates) and
    `wins_after_loss_ci95` (intervals) say where a curve that dipped comes back above 1.0. The CI
    columns are None without CIs.
    """
    rows: list[dict[str, Any]] = []
    for ledger in ledgers:
        for arm in ledger.speculative_arms():
            name = arm["name"]
            base = ledger.baseline_arm_for(name)
            curves: dict[tuple[str, float | None], list[tuple[int, float, Any]]] = {}
            for point in ledger.points:
                multiplier = figures.multiplier(ledger, point, name)
                if point["concurrency"] is None or multiplier is None:
                    continue
                workload, temperature, concurrency = Ledger.point_key(point)
                bar = figures.multiplier_bar(point, name, base)
                ci95 = bar[:2] if bar is not None and figures.is_ci_bar(bar[2]) else None
                curves.setdefault((workload, temperature), []).append((concurrency, multiplier, ci95))
            for (workload, temperature), curve in curves.items():
                curve.sort(key=lambda entry: entry[0])
                concurrencies = [c for c, _, _ in curve]
                crossing = theory.critical_concurrency(concurrencies, [m for _, m, _ in curve])
                bracket, wins_after, described = None, None, None
                if all(ci is not None for _, _, ci in curve):
                    lows, highs = [ci[0] for _, _, ci in curve], [ci[1] for _, _, ci in curve]
                    bracket = theory.loss_bracket(concurrencies, lows, highs)
                    wins_after = theory.wins_after_loss(concurrencies, lows, highs)
                    described = theory.describe_loss_bracket(bracket, concurrencies, wins_after=wins_after)
                rows.append(
                    {
                        "ledger": ledger.id,
                        "target": ledger.data["target"]["name"],
                        "arm": name,
                        "workload": workload,
                        "temperature": _number(temperature),
                        "concurrencies": tuple(concurrencies),
                        "kind": crossing.kind,
                        "value": _number(crossing.value),
                        "between": crossing.between,
                        "critical_concurrency": crossing.describe(),
                        "above_again_at": crossing.above_again_at,
                        "loss_bracket_ci95": bracket,
                        "wins_after_loss_ci95": wins_after,
                        "critical_ci95": described,
                    }
                )
    df = pd.DataFrame(rows, columns=CRITICAL_COLUMNS)
    df["temperature"] = df["temperature"].astype(float)
    df["value"] = df["value"].astype(float)
    return df


def format_table(df: pd.DataFrame) -> str:
    """Plain-text table for a terminal (pandas `to_string`, missing values as '-')."""
    if df.empty:
        return "(no rows)"
    shown = df.copy()
    for column in [c for c in shown.columns if shown[c].dtype.kind == "O"]:
        shown[column] = shown[column].map(lambda v: "-" if v is None else v)
    return shown.to_string(index=False, na_rep="-")


# Plots (matplotlib) build on the tables above and belong below this line.


#: Effective-config keys that differ between arms by design (the drafter itself and what it takes from the
#: KV pool, or an input the arm sets on purpose), not as a side effect of turning speculation on.
DRAFTER_CONFIG_KEYS = frozenset({"speculative_method", "num_speculative_tokens", "num_gpu_blocks", "kv_cache_tokens",
                                 "env_VLLM_USE_V2_MODEL_RUNNER"})


def config_differences(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Effective-config keys whose values differ between arms, beyond the drafter: {key: {arm: value}}.

    A key some arms lack counts as a difference (the value is None there). This is what a reader
    must know before crediting a multiplier to the drafter: vLLM switches other features off with it.
    """
    keys: list[str] = []
    for config in configs.values():
        keys += [k for k in config if k not in keys and k not in DRAFTER_CONFIG_KEYS]
    diffs = {}
    for key in keys:
        values = {arm: config.get(key) for arm, config in configs.items()}
        if len({repr(v) for v in values.values()}) > 1 or any(key not in c for c in configs.values()):
            diffs[key] = values
    return diffs


def verdict_table(results: Sequence[tuple[str, Any]]) -> str:
    """One row per verified arm-point (``SuiteSession.results``: test id, ``verdict`` result): outcome, fresh and
    committed multiplier with CIs, acceptance length."""
    if not results:
        return ""

    def ci(e: Any) -> str:
        return f"{e.value:.3f} ({e.low:.3f}..{e.high:.3f})"

    rows = []
    for test_id, r in results:
        mult = r.figure("multiplier")
        speed = mult or (r.figures[0] if r.figures else None)
        acc = next((c for c in r.checks if c.metric == "acceptance_length"), None)
        rows.append({
            "point": test_id,
            "verdict": r.outcome,
            "figure": "multiplier" if mult else (speed.metric if speed else "-"),
            "fresh (95% CI)": ci(speed.fresh) if speed else "-",
            "committed (95% CI)": ci(speed.committed) if speed else "-",
            "change (95% CI)": (f"{speed.verdict.change.value:+.1%} ({speed.verdict.change.low:+.1%}.."
                                f"{speed.verdict.change.high:+.1%})") if speed else "-",
            "L fresh/committed": f"{acc.measured:.3f}/{acc.committed:.3f}" if acc else "-",
            "repeats needed": r.repeats_needed or ("-" if r.settled_by_repeats else "none settle it"),
        })
    return format_table(pd.DataFrame(rows))
