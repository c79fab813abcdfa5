"""The between-start spread a ledger states (``start_spread``), and the intervals it sets, recomputed from the repeats.

Why: a verification judges a fresh start against a committed point with the ledger's pooled spread
(`specledger.analysis.verdict`), so a spread stated too narrow makes every verification cry wolf and one stated
too wide makes every verification hold. Validation checks only its shape. This check recomputes the spread with
the function a recording writes it with (``figures.pooled_start_spreads``) and every interval it sets
(``figures.pooled_intervals``), from the repeats and their ``window.start`` as the ledger keeps them.
"""

from __future__ import annotations

from typing import Any

from specledger.analysis.audit.base import Auditor, num
from specledger.ledger import figures


def check_start_spread(a: Auditor) -> None:
    """``start_spread`` is what the repeats give (log_sd to its 4 stated decimals, df and points exactly), and
    each pooled interval is the t interval that spread sets, to one unit of its last stated digit."""
    stated = a.ledger.data.get("start_spread") or {}
    if not stated and not any(figures.arm_start_count(result) > 1
                              for point in a.ledger.points for result in point["arms"].values()):
        return  # nothing pooled and no point of two starts: scipy is not even loaded
    exact = figures.pooled_start_spreads(a.ledger)
    for arm in sorted(set(stated) | set(exact)):
        for figure in figures.POOLED_FIGURES:
            given, want = (stated.get(arm) or {}).get(figure), exact.get(arm, {}).get(figure)
            parts: list[str | int] = ["start_spread", arm, figure]
            if want is None and given is not None:
                a.add(parts, "start-spread", "states a between-start spread, but no point has this figure of this "
                                             "arm in two engine starts")
            elif want is not None and given is None:
                a.add(parts, "start-spread", f"missing: the repeats give log_sd {want.log_sd:.4f} over {want.df} "
                                             f"degrees of freedom ({want.points} points)")
            elif want is not None and given is not None:
                written = figures.start_spread_json(want)
                if abs(float(given.get("log_sd", -1.0)) - written["log_sd"]) > figures.half_unit(4) \
                        or given.get("df") != written["df"] or given.get("points") != written["points"]:
                    a.add(parts, "start-spread", f"states log_sd {given.get('log_sd')}, df {given.get('df')}, "
                                                 f"points {given.get('points')}; the repeats give log_sd "
                                                 f"{written['log_sd']}, df {written['df']}, points {written['points']}")
    index = {id(point): i for i, point in enumerate(a.ledger.points)}
    for point, arm, figure, want_ci in figures.pooled_intervals(a.ledger, exact):
        where = figures.interval_field(figure)
        parts = ["points", index[id(point)], "arms", arm, *where]
        given_ci: Any = point["arms"][arm]
        for part in where:
            given_ci = (given_ci or {}).get(part)
        unit = 10.0**-a.ledger.rounding["output_tokens_per_s" if figure == "output_tokens_per_s" else "multiplier"]
        if given_ci is None or len(given_ci) != 2 or any(
                abs(float(g) - w) > unit + figures.eps(w) for g, w in zip(given_ci, want_ci, strict=True)):
            a.add(parts, "start-spread", f"interval {given_ci} is not the t interval over the point's starts with the "
                                         f"arm's pooled spread: {num(want_ci[0])}..{num(want_ci[1])}")
