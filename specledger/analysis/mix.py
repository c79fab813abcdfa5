"""Fleet multiplier of a traffic mix, per concurrency, from one ledger's per-workload points.

A fleet serves several workloads at once, so the number an operator sees is neither workload's
multiplier but their time-weighted mix (`theory.mix_multiplier` with each workload's baseline
tokens/s): the workload that got slower takes more of the wall time. A fleet curve is only as
wide as the concurrencies measured for *every* weighted workload; the others are dropped and
reported, never filled in. No vLLM here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from specledger.analysis import theory
from specledger.errors import SpecledgerError
from specledger.ledger import Ledger
from specledger.render.tables import points_table

__all__ = [
    "WEIGHT_SUM_TOLERANCE",
    "MixError",
    "check_weights",
    "default_weights",
    "fleet_crossing",
    "fleet_curve",
    "mix_arms",
    "mix_temperatures",
    "parse_weights",
    "render_fleet",
]

#: Weights must sum to 1 within this, as `theory.mix_multiplier` demands: a mis-summed mix is
#: usually a forgotten workload, so we never renormalise.
WEIGHT_SUM_TOLERANCE = 1e-6


class MixError(SpecledgerError, ValueError):
    """Weights or a mix request that cannot mean anything (the CLI turns this into exit 2)."""


def parse_weights(text: str) -> dict[str, float]:
    """'free-form=0.935,copy=0.065' -> {'free-form': 0.935, 'copy': 0.065}; MixError on bad syntax.

    Shares are fractions of generated tokens. Duplicates, negatives, NaN/inf and empty names are
    errors, because each one hides a typo that would silently change the fleet figure.
    """
    weights: dict[str, float] = {}
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise MixError(f"malformed weights {text!r}: expected WORKLOAD=SHARE[,WORKLOAD=SHARE...]")
    for item in items:
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name or "=" in value:
            raise MixError(f"malformed weight {item!r}: expected WORKLOAD=SHARE, e.g. free-form=0.935")
        try:
            share = float(value)
        except ValueError:
            raise MixError(f"malformed weight {item!r}: {value!r} is not a number") from None
        if not math.isfinite(share) or share < 0.0:
            raise MixError(f"weight of {name!r} must be a finite number >= 0, got {value!r}")
        if name in weights:
            raise MixError(f"workload {name!r} is weighted twice")
        weights[name] = share
    return weights


def check_weights(ledger: Ledger, weights: Mapping[str, float]) -> None:
    """MixError unless every weighted workload is in the ledger and the weights sum to 1."""
    known = [w["name"] for w in ledger.workloads]
    unknown = [name for name in weights if name not in known]
    if unknown:
        raise MixError(f"{ledger.id}: unknown workload(s) {', '.join(unknown)} (ledger has: {', '.join(known)})")
    total = math.fsum(weights.values())
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise MixError(f"weights sum to {total:.10g}, not 1 (within {WEIGHT_SUM_TOLERANCE:g}); nothing is renormalised")


def default_weights(ledger: Ledger) -> dict[str, float] | None:
    """The ledger's own `workload_mix` shares when they are shares of generated tokens, else None.

    A mix by requests is a different quantity (requests differ in length), so it is not used.
    """
    mix = ledger.data.get("workload_mix")
    if mix and mix.get("basis") == "generated_tokens":
        return dict(mix["shares"])
    return None


def _same_temperature(value: float, temperature: float | None) -> bool:
    if temperature is None:
        return math.isnan(value)
    return not math.isnan(value) and value == float(temperature)


def fleet_curve(ledger: Ledger, weights: Mapping[str, float], arm: str, temperature: float | None) -> pd.DataFrame:
    """One row per concurrency measured for every weighted workload: the fleet multiplier there.

    Columns: `concurrency`, `fleet_multiplier`, `weighting`, then per weighted workload w
    `multiplier:w` and `baseline_tokens_per_s:w` (from `tables.points_table`). `weighting` is
    "time" when every kept row has every weighted workload's baseline median (the time-weighted
    mix), else "equal-baseline" for the whole curve: the share-weighted harmonic mean, which
    assumes equal baseline speeds (published figures often give only multipliers). One rule per
    curve, so its crossing is never read off a curve that switches model halfway.
    `attrs["dropped"]` maps each concurrency left out to the weighted workloads missing there.
    Workloads with weight 0 take no part. MixError for weights that do not validate.
    """
    check_weights(ledger, weights)
    spec_arm = ledger.arm(arm)
    if spec_arm["role"] not in ("speculative", "policy"):
        raise MixError(f"{ledger.id}: arm {arm!r} has role {spec_arm['role']!r}; it has no multiplier to mix")
    weighted = [name for name, share in weights.items() if share > 0.0]
    table = points_table([ledger])
    rows = table[
        (table["arm"] == arm)
        & table["temperature"].map(lambda t: _same_temperature(t, temperature))
        & table["concurrency"].notna()
        & table["multiplier"].notna()
    ]
    by_concurrency: dict[int, dict[str, tuple[float, float]]] = {}
    for _, row in rows.iterrows():
        if row["workload"] in weighted:
            by_concurrency.setdefault(int(row["concurrency"]), {})[row["workload"]] = (
                float(row["multiplier"]),
                float(row["baseline_tokens_per_s"]),
            )
    dropped: dict[int, list[str]] = {}
    kept: dict[int, dict[str, tuple[float, float]]] = {}
    for concurrency in sorted(by_concurrency):
        missing = [name for name in weighted if name not in by_concurrency[concurrency]]
        if missing:
            dropped[concurrency] = missing
        else:
            kept[concurrency] = by_concurrency[concurrency]
    timed = all(math.isfinite(b) and b > 0.0 for measured in kept.values() for _, b in measured.values())
    shares = {name: float(weights[name]) for name in weighted}
    records: list[dict[str, object]] = []
    for concurrency, measured in kept.items():
        multipliers = {name: measured[name][0] for name in weighted}
        baselines = {name: measured[name][1] for name in weighted}
        record: dict[str, object] = {
            "concurrency": concurrency,
            "fleet_multiplier": theory.mix_multiplier(shares, multipliers, baselines if timed else None),
            "weighting": "time" if timed else "equal-baseline",
        }
        for name in weighted:
            record[f"multiplier:{name}"] = multipliers[name]
            record[f"baseline_tokens_per_s:{name}"] = baselines[name]
        records.append(record)
    columns = ["concurrency", "fleet_multiplier", "weighting"]
    columns += [f"{kind}:{name}" for name in weighted for kind in ("multiplier", "baseline_tokens_per_s")]
    curve = pd.DataFrame(records, columns=columns)
    curve["concurrency"] = curve["concurrency"].astype(int)
    curve["fleet_multiplier"] = curve["fleet_multiplier"].astype(float)
    curve.attrs.update(
        {"ledger": ledger.id, "arm": arm, "temperature": temperature, "weights": dict(weights), "dropped": dropped}
    )
    return curve


def fleet_crossing(curve: pd.DataFrame) -> theory.Crossing | None:
    """`theory.critical_concurrency` over the fleet curve; None when the curve has no rows."""
    if curve.empty:
        return None
    return theory.critical_concurrency(curve["concurrency"].tolist(), curve["fleet_multiplier"].tolist())


def mix_arms(ledger: Ledger, arm: str | None = None) -> list[str]:
    """The speculative/policy arms to mix: all of them, or `arm` (MixError if it has no multiplier)."""
    names = [a["name"] for a in ledger.speculative_arms()]
    if arm is None:
        return names
    if arm not in names:
        raise MixError(f"{ledger.id}: no speculative arm {arm!r} (speculative arms: {', '.join(names) or 'none'})")
    return [arm]


def mix_temperatures(ledger: Ledger, arm: str, temperature: float | None = None) -> list[float | None]:
    """Temperatures at which `arm` has a multiplier at some concurrency (None: unpublished), or just
    `temperature`; MixError when that one was not measured, so a typo cannot print an empty table."""
    table = points_table([ledger])
    rows = table[(table["arm"] == arm) & table["concurrency"].notna() & table["multiplier"].notna()]
    found: list[float | None] = []
    for value in rows["temperature"]:
        t = None if math.isnan(value) else float(value)
        if t not in found:
            found.append(t)
    found.sort(key=lambda t: (t is None, t or 0.0))
    if temperature is None:
        return found
    if float(temperature) not in found:
        measured = ", ".join("n/a" if t is None else f"{t:g}" for t in found) or "none"
        raise MixError(f"{ledger.id}: arm {arm!r} has no multiplier at T={temperature:g} (measured: {measured})")
    return [float(temperature)]


def render_fleet(curve: pd.DataFrame) -> str:
    """A fleet curve as terminal text: per-workload and fleet multipliers, crossing, dropped points."""
    attrs = curve.attrs
    temperature = "n/a" if attrs["temperature"] is None else f"{attrs['temperature']:g}"
    weights = ", ".join(f"{name}={share:g}" for name, share in attrs["weights"].items())
    lines = [f"{attrs['ledger']} {attrs['arm']} T={temperature}: mix {weights} (shares of generated tokens)"]
    dropped = "; ".join(f"c={c} ({', '.join(missing)} not measured)" for c, missing in sorted(attrs["dropped"].items()))
    if curve.empty:
        lines.append("  no concurrency is measured for every weighted workload")
        if dropped:
            lines.append(f"  dropped: {dropped}")
        return "\n".join(lines)
    if curve["weighting"].iloc[0] == "time":
        lines.append("  time-weighted: each workload's tokens cost 1/baseline tokens/s (theory.mix_multiplier)")
    else:
        lines.append("  equal-baseline: some baseline tokens/s are missing, so workloads are assumed equally fast")
    workloads = [name for name, share in attrs["weights"].items() if share > 0.0]
    header = ["c", *workloads, "fleet"]
    body = [
        [
            str(int(row["concurrency"])),
            *(f"{row[f'multiplier:{w}']:.2f}x" for w in workloads),
            f"{row['fleet_multiplier']:.2f}x",
        ]
        for _, row in curve.iterrows()
    ]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    for r in [header, *body]:
        lines.append("  " + "  ".join(cell.rjust(width) for cell, width in zip(r, widths, strict=True)))
    crossing = fleet_crossing(curve)
    assert crossing is not None
    lines.append(f"  fleet critical concurrency: {crossing.describe()}")
    if dropped:
        lines.append(f"  dropped: {dropped}")
    return "\n".join(lines)
