"""A Markdown report over ledgers: conditions, points, critical concurrency, notes and plots.

The report is for readers who will never open the JSON, so it states the conditions a number
depends on (engine, accelerator, each arm's drafter config, KV-cache capacity and how the arms'
effective engine configs differ) next to the numbers. Tables come from `tables.points_table`,
`tables.critical_table` and `tables.starts_table`, plots from `plots.write_plots`; nothing is recomputed here. The table
formatter is our own (pandas' `to_markdown` needs tabulate, which is not a dependency). No vLLM.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from specledger import __version__
from specledger.ledger import Ledger
from specledger.ledger.model import protocol_over_defaults
from specledger.render.plots import PLOT_KINDS, NothingToPlot, plot_path, temperature_label, write_plots
from specledger.render.tables import (
    DRAFTER_CONFIG_KEYS,
    config_differences,
    critical_table,
    points_table,
    starts_table,
)

__all__ = [
    "effective_config_differences",
    "ledger_section",
    "markdown_table",
    "render_report",
    "write_report",
]

_ABSENT = "(absent)"


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    """A table cell: pipes escaped, newlines flattened, so one value can never break a row."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[bool] = ()) -> str:
    """A GitHub-flavoured Markdown table; `right[i]` right-aligns column i (numbers)."""
    rows = [[_cell(v) for v in row] for row in rows]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, table has {len(headers)} columns: {row}")
    aligns = [(right[i] if i < len(right) else False) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(_cell(h) for h in headers) + " |",
        "|" + "|".join("---:" if r else "---" for r in aligns) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if _missing(value) else f"{value:{spec}}{suffix}"


def _multiplier(value: Any, low_high: Any = None, ci95: Any = None) -> str:
    """'1.16x', with its 95% CI as '1.16x (1.05..1.28)' where the point recorded one; a published range as
    '1.30-4.20x'; '-' when there is neither."""
    if not _missing(value):
        return f"{value:.2f}x" + (f" ({ci95[0]:.2f}..{ci95[1]:.2f})" if ci95 is not None else "")
    if low_high is not None:
        return f"{low_high[0]:.2f}-{low_high[1]:.2f}x"
    return "-"


def _json(value: Any) -> str:
    return "`" + json.dumps(value, sort_keys=False) + "`"


# --------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------


def effective_config_differences(ledger: Ledger) -> tuple[list[str], list[tuple[str, list[Any]]]]:
    """(arm names, [(key, value per arm)]) for effective-config keys whose values differ (tables.config_differences).

    Only arms that recorded an effective config take part; a key missing from some of them
    counts as a difference (shown as "(absent)").
    """
    configs = {a["name"]: a["effective_config"] for a in ledger.arms if a.get("effective_config")}
    differing = [(key, [configs[name].get(key, _ABSENT) for name in configs])
                 for key in config_differences(configs)]
    return list(configs), differing


def _conditions(ledger: Ledger) -> list[str]:
    data = ledger.data
    target = data["target"]
    provenance = data.get("provenance", {})
    facts = [f"- **Status:** {ledger.status}"]
    source = data.get("source")
    if source:
        where = f" ({source['url']})" if source.get("url") else ""
        facts.append(f"- **Source:** {source['title']}{where}" + (f"; {source['note']}" if source.get("note") else ""))
    target_bits = [f"`{target['model']}`"]
    for key, label in (
        ("parameters", "parameters"),
        ("dtype", "dtype"),
        ("quantization", "quantization"),
        ("weight_format", "weights"),
        ("kv_cache_dtype", "KV-cache dtype"),
        ("max_model_len", "max_model_len"),
    ):
        if key in target:
            value = target[key] if target[key] is not None else "none"
            target_bits.append(f"{label} {value}")
    facts.append(f"- **Target:** {target['name']}: " + ", ".join(target_bits))
    engine = provenance.get("engine")
    if engine:
        extra = [f"torch {provenance['torch_version']}"] if provenance.get("torch_version") else []
        extra += [f"Python {provenance['python_version']}"] if provenance.get("python_version") else []
        facts.append(
            f"- **Engine:** {engine['name']} {engine['version']}" + (f" ({', '.join(extra)})" if extra else "")
        )
    accelerator = provenance.get("accelerator")
    if accelerator:
        name = accelerator.get("name") or accelerator["kind"]
        count = accelerator.get("count")
        details = [accelerator["kind"]]
        details += [f"driver {accelerator['driver']}"] if accelerator.get("driver") else []
        details += [f"{accelerator['cpu_count']} CPUs"] if accelerator.get("cpu_count") else []
        details = [d for d in details if d != name]
        shown = f"{f'{count}x ' if count else ''}{name}" + (f" ({', '.join(details)})" if details else "")
        facts.append(f"- **Accelerator:** {shown}")
    recorded = [provenance[k] for k in ("date",) if provenance.get(k)]
    recorded += [f"commit {provenance['git_commit'][:12]}"] if provenance.get("git_commit") else []
    recorded += [f"{provenance['wall_s']:g} s wall"] if provenance.get("wall_s") is not None else []
    if recorded:
        facts.append("- **Recorded:** " + ", ".join(str(r) for r in recorded))
    if data.get("engine_args"):
        facts.append(f"- **Shared engine args:** {_json(data['engine_args'])}")
    sweep = data.get("sweep")
    if sweep:
        temperatures = ", ".join(temperature_label(t) for t in sweep["temperatures"])
        concurrencies = ", ".join(str(c) for c in sweep["concurrencies"])
        facts.append(
            f"- **Sweep:** T = {temperatures}; c = {concurrencies}; {_repeats(data)} per point"
            + ("; plus extra points" if sweep.get("only") else "")
        )
    workloads = ", ".join(f"{w['name']} ({w['kind']})" for w in ledger.workloads)
    facts.append(f"- **Workloads:** {workloads}")
    return facts


def _repeats(data: dict[str, Any]) -> str:
    """How many repeats a point gets: a fixed count in the one-round protocols (`sweep.repeats`), a range in
    protocol v3, whose sweep states none (the adaptive rule adds pairs up to the cap)."""
    if "repeats" in data["sweep"]:
        return f"{data['sweep']['repeats']} repeats"
    protocol = protocol_over_defaults(data.get("protocol"))
    repeats = protocol["repeats"]
    return (f"{repeats['min']} to {repeats['max']} paired repeats of steady-state windows "
            f"(protocol v{protocol['version']})")


def _arms_table(ledger: Ledger) -> str:
    rows = []
    for arm in ledger.arms:
        if arm.get("speculative_config"):
            drafter = _json(arm["speculative_config"])
        else:
            drafter = arm.get("drafter", "-")
        overrides = {**arm.get("engine_args", {}), **{f"env {k}": v for k, v in arm.get("env", {}).items()}}
        kv = arm.get("kv_cache", {})
        tokens = f"{kv['tokens']:,}" if kv.get("tokens") is not None else "-"
        change = f"{kv['change_vs_baseline']:+.1%}" if kv.get("change_vs_baseline") is not None else "-"
        sessions = "; ".join(f"{s['sessions']:g} at {s['context_tokens']:,} ctx" for s in arm.get("sessions", []))
        rows.append(
            [arm["name"], arm["role"], drafter, _json(overrides) if overrides else "-", tokens, change, sessions or "-"]
        )
    return markdown_table(
        ["arm", "role", "speculative_config / drafter", "overrides", "KV-cache tokens", "vs baseline", "sessions"],
        rows,
        right=[False, False, False, False, True, True, False],
    )


def _differences(ledger: Ledger) -> list[str]:
    names, differing = effective_config_differences(ledger)
    if len(names) < 2:
        return ["No two arms recorded an effective engine config, so there is nothing to compare."]
    note = ", ".join(sorted(DRAFTER_CONFIG_KEYS))
    if not differing:
        return [f"The arms' effective engine configs agree on every key (apart from {note})."]
    rows = [[f"`{key}`", *(v if v == _ABSENT else _json(v) for v in values)] for key, values in differing]
    return [
        f"Keys whose values differ between the arms' effective configs ({note} left out):",
        "",
        markdown_table(["key", *names], rows),
    ]


def _points(ledger: Ledger) -> str:
    df = points_table([ledger])
    if not ledger.points:
        return f"No measured points yet (status {ledger.status})."
    if df.empty:
        return "No point has a speculative arm."
    rows = [
        [
            row["arm"],
            row["workload"],
            temperature_label(row["temperature"]),
            "n/a" if row["concurrency"] is pd.NA else int(row["concurrency"]),
            _fmt(row["baseline_tokens_per_s"], ",.0f"),
            _fmt(row["spec_tokens_per_s"], ",.0f"),
            _multiplier(row["multiplier"], row["multiplier_range"], row["multiplier_ci95"]),
            _multiplier(row["multiplier_vs_matched"], ci95=row["multiplier_vs_matched_ci95"]),
            _fmt(row["acceptance_length"], ".2f"),
            _fmt(row["acceptance_rate"], ".3f"),
            _fmt(row["spread"], ".0%"),
        ]
        for _, row in df.iterrows()
    ]
    headers = [
        "arm",
        "workload",
        "T",
        "c",
        "baseline tok/s",
        "spec tok/s",
        "multiplier",
        "vs matched",
        "acceptance length",
        "acceptance rate",
        "repeat spread",
    ]
    table = markdown_table(headers, rows, right=[False, False, True, True] + [True] * 7)
    return (
        table + "\n\ntok/s: medians over repeats; multiplier: as the ledger states it (protocol v3: the ratio of "
        "mean window throughput over the paired repeats, with its paired-bootstrap 95% CI in brackets; earlier "
        "protocols: spec median / baseline median; published ranges as low-high); acceptance rate is a fraction; "
        "repeat spread: (max - min) / median of the spec arm's tokens/s."
    )


def _critical(ledger: Ledger) -> str:
    df = critical_table([ledger])
    if df.empty:
        return "No curve with a multiplier at a known concurrency."
    rows = [
        [
            row["arm"],
            row["workload"],
            temperature_label(row["temperature"]),
            ", ".join(str(c) for c in row["concurrencies"]),
            row["critical_concurrency"],
            row["critical_ci95"] or "-",
        ]
        for _, row in df.iterrows()
    ]
    return markdown_table(
        ["arm", "workload", "T", "concurrencies", "multiplier first below 1.0", "first loss at 95% confidence"],
        rows,
        right=[False, False, True],
    ) + ("\n\nThe first column interpolates the point estimates; the second says what the points' 95% CIs "
         "establish: between the last concurrency whose interval lies wholly above 1.0 and the first whose "
         "interval lies wholly below ('-': a point without a CI). Both name any concurrency past that loss "
         "where the curve is back above 1.0.")


def _starts(ledger: Ledger) -> str | None:
    """Each engine start of the points measured in several, beside its host state; None where there is none."""
    df = starts_table([ledger])
    if df.empty:
        return None
    rows = [
        [
            row["arm"],
            row["workload"],
            temperature_label(row["temperature"]),
            int(row["concurrency"]),
            int(row["start"]),
            int(row["windows"]),
            _fmt(row["output_tokens_per_s"], ",.0f"),
            _multiplier(row["multiplier"]),
            _multiplier(row["multiplier_vs_matched"]),
            _fmt(row["host_slice_ms"], ".1f"),
            _fmt(row["cpu_steal_share"], ".1%"),
        ]
        for _, row in df.iterrows()
    ]
    headers = ["arm", "workload", "T", "c", "start", "windows", "mean tok/s", "multiplier", "vs matched",
               "host slice ms", "CPU steal"]
    return markdown_table(headers, rows, right=[False, False] + [True] * 9) + (
        "\n\nEach start's own figures: mean tok/s over its windows, multiplier as the ratio of its paired means. "
        "The point's multiplier is their geometric mean. Host slice: median time of a fixed Python loop around the "
        "start's windows (a host-bound engine slows with it); CPU steal: mean share over its windows.")


def _plots(ledger: Ledger, plots_dir: Path, report_dir: Path) -> list[str]:
    skipped: list[str] = []
    try:
        paths = write_plots(ledger, plots_dir, on_skip=skipped.append)
    except NothingToPlot as e:
        return [f"_No plots: {e}._"]
    lines = []
    for kind in PLOT_KINDS:
        path = plot_path(plots_dir, ledger, kind)
        if path in paths:
            link = Path(os.path.relpath(path, report_dir)).as_posix()
            lines += [f"![{ledger.id} {kind}]({link})", ""]
    lines += [f"- skipped: {message}" for message in skipped]
    return lines


def ledger_section(ledger: Ledger, plots_dir: Path, report_dir: Path) -> str:
    """The report section of one ledger; writes its plots into `plots_dir` as a side effect."""
    parts = [f"## {ledger.id}", "", f"_{ledger.data['title']}_", ""]
    if ledger.data.get("description"):
        parts += [ledger.data["description"], ""]
    parts += ["### Conditions", "", *_conditions(ledger), "", "#### Arms", "", _arms_table(ledger), ""]
    parts += ["#### Effective-config differences", "", *_differences(ledger), ""]
    parts += ["### Points", "", _points(ledger), ""]
    parts += ["### Critical concurrency", "", _critical(ledger), ""]
    if (starts := _starts(ledger)) is not None:
        parts += ["### Engine starts", "", starts, ""]
    if ledger.data.get("notes"):
        parts += ["### Notes", "", *(f"- {note}" for note in ledger.data["notes"]), ""]
    parts += ["### Plots", "", *_plots(ledger, plots_dir, report_dir), ""]
    return "\n".join(parts)


def render_report(ledgers: Sequence[Ledger], report_path: str | Path, plots_dir: str | Path | None = None) -> str:
    """The whole report as Markdown; plots go to `plots_dir` (default `<report stem>_files/` beside it)."""
    report_path = Path(report_path)
    plots = Path(plots_dir) if plots_dir is not None else report_path.with_name(f"{report_path.stem}_files")
    head = [
        "# specledger report",
        "",
        f"Generated by specledger {__version__} from {len(ledgers)} ledger(s): "
        + ", ".join(f"`{ledger.id}`" for ledger in ledgers)
        + ".",
        "",
    ]
    return "\n".join(head + [ledger_section(ledger, plots, report_path.parent) for ledger in ledgers])


def write_report(ledgers: Sequence[Ledger], report_path: str | Path, plots_dir: str | Path | None = None) -> Path:
    """Render and write the report (plots first, then the Markdown); returns the report path."""
    report_path = Path(report_path)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(ledgers, report_path, plots_dir)
    report_path.write_text(text, encoding="utf-8")
    return report_path
