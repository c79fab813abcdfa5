"""The benchmark that sizes the v3 window: multiplier CI half-width against GPU seconds, per concurrency.

Reads what scripts/h200-v3-probe.py brought back (sizing.json: interleaved 2.5 s windows per arm; the
recorded ledger: the points' 5 s windows) and, for the first n paired windows of each series, computes the
multiplier's 95% CI with specledger.stats (the same estimator verdicts use) and the GPU seconds those n
pairs cost (windows plus ramps, both arms). Prints the table, the repeats and seconds a +-5% half-width
would take (half-width shrinking as 1/sqrt(n)), and draws the curve.

    python scripts/window-sizing.py reports/evidence/2026-12-01-h200-v3 ledgers/h200-smollm2-copy-v3-probe.json \
        -o reports/plots/h200-window-sizing.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

TARGET_HALF_WIDTH = 0.05


def series(evidence: Path, ledger_path: Path) -> list[dict]:
    """(concurrency, window length) -> paired per-window throughputs and seconds per pair."""
    out: list[dict] = []
    rows = json.loads((evidence / "sizing.json").read_text())
    for c in sorted({r["concurrency"] for r in rows}):
        mine = [r for r in rows if r["concurrency"] == c]
        by_arm = {arm: [r for r in mine if r["arm"] == arm] for arm in ("baseline", "ngram")}
        seconds = [sum(r["window_s"] + r["ramp_s"] for r in pair) for pair in zip(*by_arm.values(), strict=True)]
        out.append({"concurrency": c, "window_s": 2.5, "spec": [r["output_tokens_per_s"] for r in by_arm["ngram"]],
                    "base": [r["output_tokens_per_s"] for r in by_arm["baseline"]], "pair_s": seconds})
    ledger = json.loads(ledger_path.read_text())
    for point in ledger["points"]:
        arms = point["arms"]
        w = {name: arms[name]["window"] for name in ("baseline", "ngram")}
        pair_s = [sum(w[n]["seconds"][i] + w[n]["ramp_s"][i] for n in w) for i in range(len(w["ngram"]["seconds"]))]
        out.append({"concurrency": point["concurrency"], "window_s": round(w["ngram"]["seconds"][0], 1),
                    "spec": arms["ngram"]["output_tokens_per_s"]["repeats"],
                    "base": arms["baseline"]["output_tokens_per_s"]["repeats"], "pair_s": pair_s})
    return out


def main(argv: list[str] | None = None) -> int:
    from specledger import stats

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evidence", type=Path)
    parser.add_argument("ledger", type=Path)
    parser.add_argument("-o", "--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    curves = []
    print(f"{'c':>3} {'window':>6} {'n':>3} {'GPU s':>6} {'multiplier (95% CI)':>24} {'half-width':>10}")
    for s in series(args.evidence, args.ledger):
        points = []
        for n in range(3, len(s["spec"]) + 1):
            est = stats.multiplier_estimate(s["spec"][:n], s["base"][:n])
            gpu_s = sum(s["pair_s"][:n])
            points.append((gpu_s, est.half_width_rel))
            print(f"{s['concurrency']:>3} {s['window_s']:>5.1f}s {n:>3} {gpu_s:>6.0f} "
                  f"{est.value:>8.3f} ({est.low:.3f}..{est.high:.3f}) {est.half_width_rel:>9.1%}")
        n = len(s["spec"])
        hw = points[-1][1]
        need = math.ceil(n * (hw / TARGET_HALF_WIDTH) ** 2)
        per_pair = sum(s["pair_s"]) / n
        print(f"    c={s['concurrency']} {s['window_s']:.1f} s windows: ±{hw:.1%} at n={n}; ±5% needs about {need} "
              f"pairs = {need * per_pair:.0f} GPU s of windows (warm-up and engine start not included)")
        curves.append((s, points, need, need * per_pair))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for s, points, need, cost in curves:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, [100 * y for y in ys], marker="o",
                    label=f"c={s['concurrency']}, {s['window_s']:g} s windows (±5%: ~{need} pairs, {cost:.0f} s)")
        ax.axhline(100 * TARGET_HALF_WIDTH, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("GPU seconds in timed windows (both arms, ramps included)")
        ax.set_ylabel("multiplier 95% CI half-width (%)")
        ax.set_title("H200, SmolLM2-135M bf16, ngram k=7 vs baseline, copy T=0")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
