"""PNG plots of one ledger: multiplier curves, every arm's throughput, acceptance on the theory curve.

The numbers come from `tables.points_table` / `tables.critical_table` (and, for per-arm
throughput and repeat spreads, from the points themselves), so a plot can never disagree with
`specledger show`. Figures are built with the object-oriented `matplotlib.figure.Figure`, never
pyplot: no global figure registry, no GUI backend, nothing to close, safe in a test process.
A plot with nothing to draw raises `NothingToPlot` instead of writing an empty image. No vLLM.

About 500 lines on purpose: the three plot kinds share their axes helpers, condition names and CI bands; split
one module a plot, each would import the others' helpers.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from specledger.analysis import theory
from specledger.errors import SpecledgerError
from specledger.ledger import Ledger, figures
from specledger.render.tables import critical_table, points_table

__all__ = [
    "PLOT_DPI",
    "PLOT_KINDS",
    "NothingToPlot",
    "acceptance_figure",
    "condition_label",
    "figure_title",
    "multiplier_figure",
    "plot_path",
    "temperature_label",
    "throughput_figure",
    "write_plots",
]

#: Plot kinds in the order they are written; each is also the file-name suffix.
PLOT_KINDS = ("multiplier", "throughput", "acceptance")

#: Resolution of every PNG specledger writes (the compare plot too).
PLOT_DPI = 110
# Sideways step between the spread bars of lines sharing a concurrency, in log2 units of c.
_BAR_NUDGE_LOG2 = 0.05
_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P")
# Arm colours in the throughput plot: baselines in neutral tones so the drafters stand out.
_ROLE_COLORS = {"baseline": "black", "matched-baseline": "tab:gray"}
_ROLE_LINESTYLES = {"matched-baseline": "--"}


class NothingToPlot(SpecledgerError, ValueError):
    """A plot was asked for but the ledger has no figure it could draw (e.g. a planned ledger)."""


# --------------------------------------------------------------------------------------------
# labels and titles
# --------------------------------------------------------------------------------------------


def temperature_label(temperature: float | None) -> str:
    """'0', '0.7', or 'n/a' when the source did not publish a temperature."""
    if temperature is None or (isinstance(temperature, float) and math.isnan(temperature)):
        return "n/a"
    return f"{float(temperature):g}"


def condition_label(workload: str, temperature: float | None, arm: str | None = None) -> str:
    """'ngram copy T=0': the one name a condition has in every plot, legend and table."""
    head = f"{arm} " if arm else ""
    return f"{head}{workload} T={temperature_label(temperature)}"


def figure_title(ledger: Ledger, what: str, width: int = 100) -> str:
    """Title lines: what is shown, the ledger title, and target + engine + accelerator where known.

    Provenance goes into the title because a PNG travels without its ledger; a reader must be
    able to tell a CPU curve from an H200 one without the JSON.
    """
    lines = [f"{ledger.id}: {what}"]
    lines += textwrap.wrap(ledger.data["title"], width, break_on_hyphens=False)
    provenance = ledger.data.get("provenance", {})
    facts = [f"target {ledger.data['target']['name']}"]
    engine = provenance.get("engine")
    if engine:
        facts.append(f"{engine['name']} {engine['version']}")
    accelerator = provenance.get("accelerator")
    if accelerator:
        name = accelerator.get("name") or accelerator["kind"]
        count = accelerator.get("count", 1)
        facts.append(f"{count}x {name}" if count > 1 else name)
    if ledger.status == "reference":
        facts.append("published figures (reference)")
    lines += textwrap.wrap(" | ".join(facts), width, break_on_hyphens=False)
    return "\n".join(lines)


def _title_width(fig: Figure) -> int:
    """Characters of 10 pt text that fit across the figure (about 12 per inch)."""
    return int(fig.get_figwidth() * 12)


def plot_path(out_dir: str | Path, ledger: Ledger, kind: str) -> Path:
    """`<out_dir>/<ledger-id>-<kind>.png`."""
    return Path(out_dir) / f"{ledger.id}-{kind}.png"


# --------------------------------------------------------------------------------------------
# data helpers
# --------------------------------------------------------------------------------------------


def _temperature(value: Any) -> float | None:
    """Table temperatures are NaN when unpublished; ledger lookups want None."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _temperature_order(value: float | None) -> tuple[bool, float]:
    return (value is None, value if value is not None else 0.0)


def _throughput(result: dict[str, Any] | None) -> dict[str, Any]:
    return (result or {}).get("output_tokens_per_s") or {}


def _arm_throughput_rows(ledger: Ledger) -> pd.DataFrame:
    """Every arm's output tokens/s (median, min, max) at every point with a concurrency."""
    rows = []
    for point in ledger.points:
        if point["concurrency"] is None:
            continue
        for arm in ledger.arms:
            thr = _throughput(point["arms"].get(arm["name"]))
            if thr.get("median") is None:
                continue
            repeats = thr.get("repeats") or [thr["median"]]
            rows.append(
                {
                    "arm": arm["name"],
                    "role": arm["role"],
                    "workload": point["workload"],
                    "temperature": _temperature(point["temperature"]),
                    "concurrency": int(point["concurrency"]),
                    "median": float(thr["median"]),
                    "min": float(thr.get("min", min(repeats))),
                    "max": float(thr.get("max", max(repeats))),
                }
            )
    return pd.DataFrame(rows, columns=["arm", "role", "workload", "temperature", "concurrency", "median", "min", "max"])


def _log2_concurrency_axis(ax: Axes, concurrencies: Iterable[int]) -> None:
    """Log2 x axis with ticks exactly at the measured concurrencies (no minor ticks to misread)."""
    ticks = sorted(set(int(c) for c in concurrencies))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(c) for c in ticks])
    if len(ticks) == 1:
        ax.set_xlim(ticks[0] / 2, ticks[0] * 2)
    else:
        ax.set_xlim(ticks[0] / 2**0.3, ticks[-1] * 2**0.3)
    ax.set_xlabel("concurrency (requests in flight)")


def _crossing_gid(arm: str, workload: str, temperature: float | None) -> str:
    """The gid of a crossing marker, so tests and tools can find it among the Axes' artists."""
    return f"crossing|{arm}|{workload}|{temperature_label(temperature)}"


def _starts_gid(arm: str, workload: str, temperature: float | None, concurrency: int) -> str:
    """The gid of a point's per-start markers, so tests and tools can find them among the Axes' artists."""
    return f"starts|{arm}|{workload}|{temperature_label(temperature)}|{concurrency}"


def _legend_title(bar_kinds: set[str], crossed: bool, starts: bool = False, pooled_df: int | None = None
                  ) -> str | None:
    """Say what the bars, X markers and hollow start markers are, only when the panel has them; bars over engine
    starts also say their degrees of freedom, since with one (two starts of one point) t is 12.7 and every bar of
    the arm is wide (2026-12-07, the H100 fp8 ledger)."""
    parts = [f"bars: {kind}" for kind in sorted(bar_kinds)]
    if pooled_df is not None and figures.CI_BAR_OVER_STARTS in bar_kinds:
        parts.append(f"t with {pooled_df} degree{'s' if pooled_df != 1 else ''} of freedom: "
                     "each engine start added narrows every bar")
    if crossed:
        parts.append("X on 1.0: interpolated crossing (log2 c)")
    if starts:
        parts.append("o: each engine start's multiplier")
    return "\n".join(parts) or None  # one line each: side by side they outgrow a panel


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}..{high:.2f}"


def _plain_log_y(ax: Axes, low: float, high: float) -> None:
    """Log y axis labelled 2,000 rather than 2x10^3; minor ticks get labels only within one decade."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:,.0f}" if value >= 10 else f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if high < 10 * low else NullFormatter())


def _crossing_text(kind: str, value: float, row: pd.Series) -> str:
    if kind == "crosses":
        low, high = row["between"]
        return f"crosses 1.0 at c={value:.2f} (between {low} and {high})"
    concurrencies = row["concurrencies"]
    if kind == "stays-above":
        low, high = concurrencies[0], concurrencies[-1]
        measured = f"c={low}..{high}" if len(concurrencies) > 1 else f"only c={low}"
        return f"does not cross ({measured})"
    return f"below from c={concurrencies[0]}"


# --------------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------------


def multiplier_figure(ledger: Ledger) -> Figure:
    """Multiplier vs concurrency, one panel per speculative arm, one line per workload x temperature.

    Lines join the stated multipliers. Vertical bars are the multiplier's uncertainty (see
    `figures.multiplier_bar`: the 95% CI of a v3 point, else min..max of the paired per-repeat ratios,
    else the spec arm's min..max over the baseline median); they are nudged sideways by a few pixels per
    line so that lines sharing a concurrency do not hide each other's bars, while markers and
    lines stay at the true concurrency. The 1.0 line is break-even; a cross marker
    on it sits at `theory.critical_concurrency`'s interpolated crossing (gid
    `crossing|<arm>|<workload>|<T>`), and the legend says "does not cross" / "below from c=..."
    when there is no crossing. Where a point has two or more engine starts, hollow markers at its bar show each
    start's multiplier (gid `starts|<arm>|<workload>|<T>|<c>`): an interval over starts is that wide because of
    them. Points without a concurrency (some published figures) are skipped.
    """
    table = points_table([ledger])
    table = table[table["concurrency"].notna() & table["multiplier"].notna()]
    if table.empty:
        raise NothingToPlot(f"{ledger.id}: no multiplier plot: no point has both a concurrency and a multiplier")
    critical = {
        (row["arm"], row["workload"], _temperature(row["temperature"])): row
        for _, row in critical_table([ledger]).iterrows()
    }
    arms = [a["name"] for a in ledger.speculative_arms() if a["name"] in set(table["arm"])]
    workloads = sorted(set(table["workload"]), key=[w["name"] for w in ledger.workloads].index)
    temperatures = sorted({_temperature(t) for t in table["temperature"]}, key=_temperature_order)
    concurrencies = [int(c) for c in table["concurrency"]]

    fig = Figure(figsize=(max(7.5, 6.4 * len(arms)), 6.2), layout="constrained")
    axes = fig.subplots(1, len(arms), sharey=True, squeeze=False)[0]
    top = max(1.25, float(table["multiplier"].max()) * 1.1)
    for ax, arm in zip(axes, arms, strict=True):
        base = ledger.baseline_arm_for(arm)
        bar_kinds: set[str] = set()
        pooled_spread = figures.start_spread(ledger.data, arm, "multiplier")
        crossed = False
        starts_shown = False
        ax.axhline(1.0, color="black", linewidth=1.0, zorder=1)
        groups = list(table[table["arm"] == arm].groupby(["workload", "temperature"], dropna=False, sort=False))
        for line_index, ((workload, temperature), group) in enumerate(groups):
            nudge = 2.0 ** (_BAR_NUDGE_LOG2 * (line_index - (len(groups) - 1) / 2))
            temperature = _temperature(temperature)
            group = group.sort_values("concurrency")
            color = _COLORS[workloads.index(workload) % len(_COLORS)]
            t_index = temperatures.index(temperature)
            row = critical.get((arm, workload, temperature))
            label = condition_label(workload, temperature, arm)
            xs = [int(c) for c in group["concurrency"]]
            ys = [float(m) for m in group["multiplier"]]
            pooled = pooled_spread is not None
            points = {c: ledger.find_point(workload, temperature, c) for c in xs}
            spreads = {c: figures.multiplier_bar(p, arm, base, pooled=pooled) if p else None
                       for c, p in points.items()}  # one bar per point
            if row is not None:
                label += ": " + _crossing_text(row["kind"], row["value"], row)
                bracket = row["loss_bracket_ci95"]
                if row["kind"] == "crosses" and bracket is not None:
                    label += f"; with the CIs between {bracket[0] or 'below ' + str(xs[0])} and {bracket[1]}"
                if row["above_again_at"]:  # a dip that recovers: say where the curve is back above break-even
                    label += f" (>= 1.0 again at c={', '.join(str(c) for c in row['above_again_at'])})"
            ax.plot(
                xs,
                ys,
                color=color,
                linestyle=_LINESTYLES[t_index % len(_LINESTYLES)],
                marker=_MARKERS[t_index % len(_MARKERS)],
                markersize=5,
                label=label,
                zorder=3,
            )
            for c, spread in spreads.items():
                if spread is not None:
                    low, high, what = spread
                    ax.vlines(c * nudge, low, high, color=color, alpha=0.5, linewidth=2.5, zorder=2)
                    top = max(top, high * 1.05)
                    bar_kinds.add(what)
                point = points[c]
                per_start = (figures.per_start_figures(ledger, point, arm).get("multiplier", [])
                             if point is not None and figures.is_v3(point) else [])
                if len(per_start) >= 2:  # the starts an interval over starts is taken from: which lease drew it
                    ax.plot([c * nudge] * len(per_start), per_start, linestyle="none", marker="o", markersize=4,
                            markerfacecolor="none", markeredgecolor=color, zorder=4,
                            gid=_starts_gid(arm, workload, temperature, c))
                    top = max(top, max(per_start) * 1.05)
                    starts_shown = True
            if row is not None and row["kind"] == "crosses":
                crossed = True
                ax.plot(
                    [float(row["value"])],
                    [1.0],
                    linestyle="none",
                    marker="X",
                    markersize=11,
                    color=color,
                    markeredgecolor="black",
                    zorder=5,
                    gid=_crossing_gid(arm, workload, temperature),
                )
        arm_info = ledger.arm(arm)
        k = (arm_info.get("speculative_config") or {}).get("num_speculative_tokens")
        method = (arm_info.get("speculative_config") or {}).get("method") or arm_info.get("drafter", "")
        ax.set_title(f"{arm} ({method}{f', k={k}' if k else ''}) vs {base}", fontsize=10)
        _log2_concurrency_axis(ax, concurrencies)
        ax.set_ylim(0, top)
        ax.grid(True, alpha=0.3)
        ax.legend(
            loc="upper center",
            bbox_to_anchor=(0.5, -0.11),
            fontsize=8,
            frameon=False,
            title_fontsize=8,
            title=_legend_title(bar_kinds, crossed, starts_shown,
                                pooled_spread.df if pooled_spread is not None else None),
        )
    axes[0].set_ylabel("multiplier (spec / baseline output tokens/s)")
    fig.suptitle(figure_title(ledger, "speculative multiplier vs concurrency", _title_width(fig)), fontsize=10)
    return fig


def throughput_figure(ledger: Ledger) -> Figure:
    """Output tokens/s vs concurrency (log-log) for every arm, one panel per workload x temperature.

    Each arm's line joins its medians; the shaded band spans its min..max over the repeats, so
    overlapping bands mean the arms are not told apart at that point.
    """
    rows = _arm_throughput_rows(ledger)
    if rows.empty:
        raise NothingToPlot(f"{ledger.id}: no throughput plot: no point has a concurrency and an arm's tokens/s")
    workloads = sorted(set(rows["workload"]), key=[w["name"] for w in ledger.workloads].index)
    temperatures = sorted(set(rows["temperature"].tolist()), key=_temperature_order)
    arm_names = [a["name"] for a in ledger.arms if a["name"] in set(rows["arm"])]
    spec_index = 0
    colors: dict[str, str] = {}
    for arm in arm_names:
        role = ledger.arm(arm)["role"]
        if role in _ROLE_COLORS:
            colors[arm] = _ROLE_COLORS[role]
        else:
            colors[arm] = _COLORS[spec_index % len(_COLORS)]
            spec_index += 1

    fig = Figure(figsize=(max(7.5, 5.2 * len(temperatures) + 0.6), 4.0 * len(workloads) + 1.6), layout="constrained")
    grid = fig.subplots(len(workloads), len(temperatures), squeeze=False)
    for i, workload in enumerate(workloads):
        for j, temperature in enumerate(temperatures):
            ax = grid[i][j]
            here = rows[(rows["workload"] == workload) & rows["temperature"].map(lambda t, T=temperature: t == T)]
            ax.set_title(condition_label(workload, temperature), fontsize=10)
            if here.empty:
                ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", va="center", color="gray")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            for arm in arm_names:
                line = here[here["arm"] == arm].sort_values("concurrency")
                if line.empty:
                    continue
                xs = line["concurrency"].tolist()
                ax.fill_between(xs, line["min"], line["max"], color=colors[arm], alpha=0.18, linewidth=0)
                ax.plot(
                    xs,
                    line["median"],
                    color=colors[arm],
                    marker="o",
                    markersize=4,
                    label=arm,
                    linestyle=_ROLE_LINESTYLES.get(ledger.arm(arm)["role"], "-"),
                )
            _log2_concurrency_axis(ax, rows["concurrency"].tolist())
            _plain_log_y(ax, float(here["min"].min()), float(here["max"].max()))
            ax.grid(True, which="major", alpha=0.35)
            ax.grid(True, which="minor", alpha=0.12)
            ax.set_ylabel("output tokens/s")
    handles, labels = {}, []
    for ax in grid.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    fig.legend(
        [handles[label] for label in labels],
        labels,
        loc="outside lower center",
        ncols=min(len(labels), 5),
        title="line: median of repeats; band: min..max",
        fontsize=9,
        title_fontsize=8,
    )
    fig.suptitle(figure_title(ledger, "output tokens/s per arm", _title_width(fig)), fontsize=10)
    return fig


def acceptance_figure(ledger: Ledger) -> Figure:
    """Acceptance length vs per-token acceptance alpha: theory E(alpha, k) and where each point sits.

    One panel per speculative arm with a `num_speculative_tokens` k. The curve is
    `theory.expected_tokens_per_step` for alpha in [0, 1]; each measured acceptance length L is
    placed on it at alpha = `theory.alpha_from_acceptance_length(L, k)`, coloured by workload x
    temperature. Concurrency does not enter the model, so points published without one are kept.
    Later conditions get smaller markers, so points at the same spot show as concentric rings.
    """
    table = points_table([ledger])
    table = table[table["acceptance_length"].notna()]
    panels: list[tuple[str, int, pd.DataFrame]] = []
    for arm in ledger.speculative_arms():
        k = (arm.get("speculative_config") or {}).get("num_speculative_tokens")
        here = table[table["arm"] == arm["name"]]
        if k and not here.empty:
            panels.append((arm["name"], int(k), here))
    if not panels:
        raise NothingToPlot(
            f"{ledger.id}: no acceptance plot: "
            "no speculative arm has both num_speculative_tokens and an acceptance length"
        )
    conditions = sorted(
        {(w, _temperature(t)) for w, t in zip(table["workload"], table["temperature"], strict=True)},
        key=lambda wt: ([w["name"] for w in ledger.workloads].index(wt[0]), _temperature_order(wt[1])),
    )
    fig = Figure(figsize=(max(7.5, 5.6 * len(panels)), 5.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    alphas = [i / 200 for i in range(201)]
    for ax, (arm, k, here) in zip(axes, panels, strict=True):
        ax.plot(
            alphas,
            [theory.expected_tokens_per_step(a, k) for a in alphas],
            color="black",
            linewidth=1.2,
            label=f"theory E(α, k={k})",
            zorder=2,
        )
        for index, (workload, temperature) in enumerate(conditions):
            group = here[
                (here["workload"] == workload) & here["temperature"].map(lambda t, T=temperature: _temperature(t) == T)
            ]
            placed = [
                (theory.alpha_from_acceptance_length(length, k), length)
                for length in group["acceptance_length"]
                if 1.0 <= length <= k + 1
            ]
            if not placed:
                continue
            alphas_here = [a for a, _ in placed]
            lengths = [length for _, length in placed]
            ax.scatter(
                alphas_here,
                lengths,
                color=_COLORS[index % len(_COLORS)],
                marker=_MARKERS[index % len(_MARKERS)],
                s=max(20, 80 - 16 * index),
                alpha=0.8,
                edgecolors="black",
                linewidths=0.5,
                zorder=3 + index,
                label=f"{condition_label(workload, temperature)}: {len(placed)} pt, L={_span(lengths)}, "
                f"α={_span(alphas_here)}",
            )
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(0.9, k + 1.1)
        ax.set_xlabel("per-token acceptance α (inverted from L)")
        ax.set_title(f"{arm}, k={k}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel("acceptance length L (tokens per verification step)")
    fig.suptitle(figure_title(ledger, "acceptance length on the i.i.d. theory curve", _title_width(fig)), fontsize=10)
    return fig


_FIGURES: dict[str, Callable[[Ledger], Figure]] = {
    "multiplier": multiplier_figure,
    "throughput": throughput_figure,
    "acceptance": acceptance_figure,
}


def write_plots(
    ledger: Ledger, out_dir: str | Path, on_skip: Callable[[str], None] = lambda message: None
) -> list[Path]:
    """Write `<id>-multiplier.png`, `<id>-throughput.png`, `<id>-acceptance.png`; return their paths.

    A kind with nothing to draw is skipped and reported through `on_skip` (a partial reference
    ledger still gets the plots it can); if no kind can be drawn, NothingToPlot is raised instead,
    with every reason in one message, so a caller cannot mistake "no plots" for success.
    """
    if not ledger.points:
        raise NothingToPlot(f"{ledger.id}: nothing to plot: no measured points (status {ledger.status})")
    out = Path(out_dir)
    written: list[Path] = []
    reasons: list[str] = []
    for kind in PLOT_KINDS:
        try:
            fig = _FIGURES[kind](ledger)
        except NothingToPlot as e:
            reasons.append(str(e))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path = plot_path(out, ledger, kind)
        fig.savefig(path, dpi=PLOT_DPI)
        written.append(path)
    if not written:
        why = "; ".join(reason.split(": ", 1)[1] for reason in reasons)
        raise NothingToPlot(
            f"{ledger.id}: nothing to plot (status {ledger.status}, {len(ledger.points)} point(s)): {why}"
        )
    for reason in reasons:
        on_skip(reason)
    return written
