#!/usr/bin/env python3
"""Every measurement window of some ledger points on one wall clock, beside the host's speed: is a noisy point a
noisy engine or a slow host?

Why: on a lent H200 VM the same pure-Python loop ran at about 12 ms in some stretches of seconds and 22 ms in others
with zero steal (reports/evidence/2026-12-03-h200-host-probe), and a 1.5B model's serving step is host-bound. Each
window keeps `window.host_slice_ms` and `window.opened_unix_s`; `scripts/gpu-telemetry` times the same loop every 2 s
(`cpu-speed.csv`). This lines them up, one row a window, and draws them.

    scripts/window-timeline.py LABEL=LEDGER.json [LABEL=LEDGER.json ...] --points copy:0:8,copy:0:16
        [--telemetry LABEL=DIR ...] [--csv OUT.csv] [--plot OUT.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specledger.ledger.selection import PointSelector, parse_point_selection, point_label, point_selected  # noqa: E402


def windows(label: str, path: Path, wanted: list[PointSelector] | None) -> pd.DataFrame:
    """One row per (point, arm, window): its throughput and what the host was doing around it."""
    data = json.loads(path.read_text())
    rows = []
    for p in data["points"]:
        key = (p["workload"], float(p["temperature"]), int(p["concurrency"]))
        if not point_selected(key, wanted):
            continue
        for arm, res in p["arms"].items():
            w = res.get("window") or {}
            for i, tok_s in enumerate((res.get("output_tokens_per_s") or {}).get("repeats") or []):
                def at(k: str, i: int = i, w: dict = w) -> float | None:
                    return w[k][i] if k in w and i < len(w[k]) else None
                rows.append({"run": label, "point": point_label(key), "arm": arm, "repeat": i,
                             "output_tokens_per_s": tok_s, "window_s": at("seconds"),
                             "host_slice_ms": at("host_slice_ms"), "opened_unix_s": at("opened_unix_s"),
                             "cpu_steal_share": at("cpu_steal_share"), "cpu_busy_share": at("cpu_busy_share")})
    return pd.DataFrame(rows)


def telemetry(label: str, directory: Path) -> pd.DataFrame:
    """scripts/gpu-telemetry's host-speed series (one loop every 2 s, with its vCPU)."""
    df = pd.read_csv(directory / "cpu-speed.csv")
    df["run"] = label
    return df


def join_telemetry(win: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """Per window, the median telemetry slice taken while it was open (NaN where none fell inside)."""
    out = win.copy()
    windows = out[["opened_unix_s", "window_s"]].dropna().rename_axis("window").reset_index()
    pairs = windows.merge(speed[["unix_s", "python_slice_ms"]], how="cross")
    inside = pairs[(pairs["unix_s"] >= pairs["opened_unix_s"])
                   & (pairs["unix_s"] <= pairs["opened_unix_s"] + pairs["window_s"])]
    out["telemetry_slice_ms"] = inside.groupby("window")["python_slice_ms"].median().reindex(out.index)
    return out


def plot(win: pd.DataFrame, speed: pd.DataFrame | None, out: Path) -> None:
    """Per run and point: each arm's window throughput over the clock, and the host's loop time under it."""
    groups = list(win.groupby(["run", "point"], sort=False))
    fig, axes = plt.subplots(2, len(groups), figsize=(5.5 * len(groups), 6.5), squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [2, 1]})
    for col, ((run, point), g) in enumerate(groups):
        top, bottom = axes[0][col], axes[1][col]
        t0 = g["opened_unix_s"].min()
        for arm, a in g.groupby("arm", sort=False):
            top.plot(a["opened_unix_s"] - t0, a["output_tokens_per_s"], "o-", ms=3, lw=0.8, label=arm)
            bottom.plot(a["opened_unix_s"] - t0, a["host_slice_ms"], "o", ms=3)
        if speed is not None:
            s = speed[(speed["run"] == run) & (speed["unix_s"] >= t0 - 5)
                      & (speed["unix_s"] <= g["opened_unix_s"].max() + 10)]
            bottom.plot(s["unix_s"] - t0, s["python_slice_ms"], color="grey", lw=0.7, label="telemetry, every 2 s")
            bottom.legend(fontsize=7)
        top.set_title(f"{run}: {point}", fontsize=9)
        top.set_ylabel("window output tok/s")
        bottom.set_ylabel("host loop (ms)")
        bottom.set_xlabel("seconds since the point's first window")
        top.legend(fontsize=7)
    fig.suptitle("Each measurement window over the clock, and the host's speed around it (dots: window.host_slice_ms)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ledgers", nargs="+", metavar="LABEL=LEDGER.json")
    ap.add_argument("--points", default=None, metavar="W:T:C,...")
    ap.add_argument("--telemetry", action="append", default=[], metavar="LABEL=DIR")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    wanted = parse_point_selection(args.points)
    win = pd.concat([windows(lab, Path(p), wanted) for lab, p in (spec.split("=", 1) for spec in args.ledgers)])
    unclocked = win["opened_unix_s"].isna()
    if unclocked.any():  # points this run left as they were (recorded before windows kept their clock)
        print(f"left out {int(unclocked.sum())} windows without window.opened_unix_s:",
              ", ".join(sorted(set(win.loc[unclocked, "run"] + " " + win.loc[unclocked, "point"]))))
        win = win[~unclocked]
    speed = pd.concat([telemetry(lab, Path(d)) for lab, d in (t.split("=", 1) for t in args.telemetry)]) \
        if args.telemetry else None
    if speed is not None:
        win = pd.concat([join_telemetry(g, speed[speed["run"] == run]) for run, g in win.groupby("run", sort=False)])
    summary = win.groupby(["run", "point", "arm"], sort=False).agg(
        windows=("output_tokens_per_s", "size"), tok_s_median=("output_tokens_per_s", "median"),
        tok_s_min=("output_tokens_per_s", "min"), tok_s_max=("output_tokens_per_s", "max"),
        host_slice_ms_min=("host_slice_ms", "min"), host_slice_ms_max=("host_slice_ms", "max"))
    print(summary.to_string())
    if args.csv:
        win.to_csv(args.csv, index=False)
    if args.plot:
        plot(win, speed, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
