"""How far a ledger's figures move with the host's speed between engine starts (``figures.host_elasticities``).

Why: a verification and an added start judge "the same machine" by the CPU model number, and two hosts of one
model can run the same fixed Python loop 2.5x apart (H100 hosts of model 143 on 2026-12-07: 10 ms and 23-26 ms).
The pooled between-start spread already carries that variation, so verdicts stay honest; this finding says how
much of it the host explains, so a reader of a wide interval or a surprising verification knows whether to look at
the host slice (`specledger show`'s engine-starts table) first. Info only: it is an observation, not a defect.
"""

from __future__ import annotations

from specledger.analysis.audit.base import Auditor
from specledger.ledger import figures


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def check_host_sensitivity(a: Auditor) -> None:
    """One info finding per arm and pooled figure with a host elasticity: the change per doubled host slice, its
    95% interval, and the share of the between-start variance (within points) the host slice explains."""
    if not any(figures.arm_start_count(result) > 1 for point in a.ledger.points for result in point["arms"].values()):
        return  # no point of two starts: scipy is not even loaded
    for arm, by_figure in sorted(figures.host_elasticities(a.ledger).items()):
        for figure, e in sorted(by_figure.items()):
            change, low, high = e.per_doubling()
            sign = "moves with" if low > 0 or high < 0 else "shows no resolved dependence on"
            a.add(["start_spread", arm, figure], "host-sensitivity",
                  f"{figure} {sign} the host's speed: {_pct(change)} per doubled host slice (95% CI {_pct(low)}.."
                  f"{_pct(high)}; within-point slope of log {figure} on log host slice over {e.starts} engine starts "
                  f"at {e.points} points, {e.df} df; host slices {e.host_ms_min:.1f}..{e.host_ms_max:.1f} ms; "
                  f"r {e.r:+.2f}, so the host slice explains {100 * e.r**2:.0f}% of the between-start variance)",
                  "info")
