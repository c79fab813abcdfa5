"""A PNG of `analysis.compare`'s table: each shared figure's ratio (other / reference) with its 95% CI, against the
reference's tolerance band, so a reader sees at once whether a condition moved a figure or the leases hide it.

Kept apart from `plots` (one ledger's curves): this figure is about two ledgers and draws from the comparison table
alone, so it can never disagree with `specledger compare`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from specledger.render.plots import PLOT_DPI, NothingToPlot

__all__ = ["change_figure", "write_change_plot"]

_OUTCOME_COLORS = {"holds": "tab:green", "changed": "tab:red", "inconclusive": "tab:gray"}
#: Ratio ticks a reader can name ("0.5x" is half the reference).
_RATIO_TICKS = (0.1, 0.2, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 10.0)


def change_figure(table: pd.DataFrame, title: str, acceptance: pd.DataFrame | None = None) -> Figure:
    """One panel per kind of figure (multipliers, tokens/s), one row per point and arm: the ratio other / reference
    on a log axis, its CI as a bar, the tolerance as a shaded band around 1, coloured by outcome. With
    ``acceptance`` (`analysis.compare.compare_acceptance`'s table), a last panel of acceptance lengths: the
    reference's bar shaded per row, its value a tick, the other's a dot coloured by outcome."""
    if table.empty:
        raise NothingToPlot(f"{title}: nothing to plot: the two ledgers share no point")
    kinds = [("multiplier", table[table["figure"] == "multiplier"]),
             ("output tokens/s", table[table["figure"] != "multiplier"])]
    kinds = [(name, rows) for name, rows in kinds if not rows.empty]
    asserted = None if acceptance is None or acceptance.empty else acceptance[acceptance["bar"].notna()]
    panels = len(kinds) + (asserted is not None and not asserted.empty)
    height = 1.9 + 0.32 * max(len(rows) for _, rows in kinds)
    fig = Figure(figsize=(5.2 * panels, height), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    if panels > len(kinds):
        _acceptance_panel(axes[-1], asserted)
    for ax, (name, rows) in zip(axes[:len(kinds)], kinds, strict=True):
        labels = [f"{r.point} {r.arm}" for r in rows.itertuples()]
        y = list(range(len(rows)))[::-1]
        tolerance = float(rows["tolerance_pct"].iloc[0]) / 100
        ax.axvspan(1 - tolerance, 1 + tolerance, color="tab:green", alpha=0.12, label=f"±{tolerance:.0%} tolerance")
        ax.axvline(1.0, color="black", linewidth=0.8)
        for yi, r in zip(y, rows.itertuples(), strict=True):
            low, high = (1 + v / 100 for v in r.change_ci95_pct)
            ratio = 1 + r.change_pct / 100
            color = _OUTCOME_COLORS[r.outcome]
            ax.plot([low, high], [yi, yi], color=color, linewidth=2.5, alpha=0.7)
            ax.plot([ratio], [yi], "o", color=color)
        ax.set_xscale("log")
        low_x, high_x = ax.get_xlim()
        ax.xaxis.set_major_locator(FixedLocator([t for t in _RATIO_TICKS if low_x <= t <= high_x]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks(y, labels)
        ax.set_xlabel(f"{name}: other / reference (95% CI)")
        ax.grid(axis="x", alpha=0.3)
        handles = [ax.plot([], [], "o-", color=c, label=o)[0] for o, c in _OUTCOME_COLORS.items()
                   if o in set(rows["outcome"])]
        ax.legend(handles=[*ax.get_legend_handles_labels()[0][:1], *handles], fontsize=8, loc="upper center",
                  bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
    over = sorted(set(table["over"]))
    fig.suptitle(f"{title}\nintervals over {', '.join(over)}", fontsize=10)
    return fig


def _acceptance_panel(ax: Axes, rows: pd.DataFrame) -> None:
    """Acceptance lengths on their own axis (tokens per step): its bar is absolute, so no ratio would show it."""
    y = list(range(len(rows)))[::-1]
    for yi, r in zip(y, rows.itertuples(), strict=True):
        low, high = r.bar
        ax.fill_betweenx([yi - 0.3, yi + 0.3], low, high, color="tab:green", alpha=0.12)
        ax.plot([r.reference], [yi], "|", color="black", markersize=14)
        ax.plot([r.other], [yi], "o", color=_OUTCOME_COLORS.get(r.outcome, "tab:gray"))
    ax.set_yticks(y, [f"{r.point} {r.arm}" for r in rows.itertuples()])
    ax.set_xlabel("acceptance length (tokens per step)")
    ax.grid(axis="x", alpha=0.3)
    handles = [ax.fill_between([], [], color="tab:green", alpha=0.12, label="reference's bar"),
               ax.plot([], [], "|", color="black", markersize=10, label="reference")[0]]
    handles += [ax.plot([], [], "o", color=c, label=o)[0] for o, c in _OUTCOME_COLORS.items()
                if o in set(rows["outcome"])]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)


def write_change_plot(table: pd.DataFrame, title: str, path: str | Path,
                      acceptance: pd.DataFrame | None = None) -> Path:
    """Draw `change_figure` to `path` (its folder created if missing)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    change_figure(table, title, acceptance).savefig(out, dpi=PLOT_DPI)
    return out
