"""The ledger format's data model: `Ledger` (a validated ledger's JSON plus lookups over it), `Problem` and
`LedgerError` (every problem located by file and JSON path), and the defaults a ledger's sections fall back to
(protocol v3's `DEFAULT_PROTOCOL`, tolerances, rounding).

The bottom of the `ledger` layer: it imports nothing of specledger but `errors`, and nothing outside the standard
library, so every other module (reading, validation, writing, figures) builds on it without a cycle. It knows the
schema versions it can hold (`SCHEMA_VERSION`, `SCHEMA_VERSIONS`) but not the schema files: those are
`validate`'s. This module knows nothing about vLLM.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.errors import SpecledgerError

__all__ = [
    "DEFAULT_PROTOCOL",
    "DEFAULT_ROUNDING",
    "DEFAULT_TOLERANCES",
    "LEGACY_ACCEPTANCE",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "Ledger",
    "LedgerError",
    "PointKey",
    "Problem",
    "has_figures",
    "is_gpu_ledger",
    "json_path",
    "protocol_over_defaults",
    "protocol_with_overrides",
]

#: The version this specledger writes.
SCHEMA_VERSION = 2
#: Every version this specledger reads, oldest first; each is checked against its own schema file.
SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)

#: Protocol v3's settings, for recording into a ledger that states none (copy it before changing it:
#: it is a plain dict so that it can go into a ledger's JSON as it is).
DEFAULT_PROTOCOL: dict[str, Any] = {
    "version": 3,
    "window": {"min_s": 10.0, "min_rounds": 4},
    "warmup": {"max_windows": 4, "agree_rel": 0.1},
    "repeats": {"min": 5, "max": 12},
    "busy_others_cpu_share": 0.15,
    "statistics": {
        "confidence": 0.95,
        "method": "BCa",
        "n_resamples": 9999,
        "estimator": "ratio of mean window throughput over paired repeats",
    },
    "acceptance": {"from": "pass"},
}
#: The acceptance section of a v3 protocol that states none: it was recorded before the acceptance
#: pass existed, so its acceptance figures came from the timed windows.
LEGACY_ACCEPTANCE: Mapping[str, Any] = {"from": "windows"}


def protocol_over_defaults(own: Mapping[str, Any] | None) -> dict[str, Any]:
    """A ledger's stated protocol over DEFAULT_PROTOCOL, section by section (sub-dicts merged, so a
    ledger can state one knob); a new dict. The schema forbids sections it does not know.

    A stated protocol without an ``acceptance`` section took acceptance from its windows
    (LEGACY_ACCEPTANCE): the default describes new recordings, not old ones."""
    if own and "acceptance" not in own:
        own = {**own, "acceptance": dict(LEGACY_ACCEPTANCE)}
    return protocol_with_overrides(own)


def protocol_with_overrides(overrides: Mapping[str, Any] | None, base: Mapping[str, Any] = DEFAULT_PROTOCOL
                            ) -> dict[str, Any]:
    """``base`` (DEFAULT_PROTOCOL: the protocol of a new recording) with overrides, section by section;
    a new dict with base's keys."""
    own = overrides or {}
    return {key: ({**value, **own.get(key, {})} if isinstance(value, Mapping) else own.get(key, value))
            for key, value in base.items()}  # each section's values are scalars


def has_figures(point: Mapping[str, Any]) -> bool:
    """Whether a point holds any measured (or published) figure: some arm result is not empty."""
    arms = point.get("arms")
    return isinstance(arms, Mapping) and any(isinstance(r, Mapping) and r for r in arms.values())


#: How far a verification may land from committed figures when the ledger does not say.
DEFAULT_TOLERANCES: Mapping[str, float] = {
    "multiplier_rel": 0.15,
    "output_tokens_per_s_rel": 0.25,
    "acceptance_length_abs": 0.15,
}
#: Decimals each stored figure is rounded to when the ledger does not say.
DEFAULT_ROUNDING: Mapping[str, int] = {
    "multiplier": 3,
    "output_tokens_per_s": 1,
    "acceptance_length": 3,
    "acceptance_rate": 4,
    "sessions": 2,
}

_PLAIN_KEY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")


def json_path(parts: Iterable[str | int]) -> str:
    """A JSON path written the way `jsonschema`'s `error.json_path` writes it, e.g. `$.points[3].arms`."""
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            path += f".{part}"
        else:
            escaped = part.replace("\\", "\\\\").replace("'", "\\'")
            path += f"['{escaped}']"
    return path


@dataclass(frozen=True)
class Problem:
    """One reason a ledger cannot be loaded, located by file and JSON path."""

    file: str
    json_path: str
    message: str

    def __str__(self) -> str:
        if not self.json_path:  # a problem with a whole non-JSON file (e.g. a Markdown report)
            return f"{self.file}: {self.message}"
        return f"{self.file}: {self.json_path}: {self.message}"


class LedgerError(SpecledgerError, ValueError):
    """A ledger failed to load; carries every problem found, not only the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)

# --------------------------------------------------------------------------------------------

PointKey = tuple[str, float | None, int | None]


@dataclass
class Ledger:
    """A validated ledger: the raw JSON (`data`, key order kept) plus lookups over it.

    `data` stays a plain dict so that record mode can update it and write it back unchanged
    apart from what it measured.
    """

    path: Path | None
    data: dict[str, Any]
    #: The ledger whose pooled between-start spread this one borrowed, in memory, to be verified with
    #: (``figures.borrow_start_spread``, ``--ledger-start-spread-from``); None: its own spread, or none.
    spread_from: str | None = None

    @property
    def file(self) -> str:
        """The name problems and findings use for this ledger."""
        return str(self.path) if self.path is not None else "<ledger>"

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def arms(self) -> list[dict[str, Any]]:
        return self.data["arms"]

    @property
    def workloads(self) -> list[dict[str, Any]]:
        return self.data["workloads"]

    @property
    def points(self) -> list[dict[str, Any]]:
        return self.data["points"]

    def arm(self, name: str) -> dict[str, Any]:
        """The arm called `name`; KeyError if there is none (a validated ledger never names one)."""
        for arm in self.arms:
            if arm["name"] == name:
                return arm
        raise KeyError(f"ledger {self.id!r} has no arm {name!r}")

    def workload(self, name: str) -> dict[str, Any]:
        """The workload called `name`; KeyError if there is none."""
        for workload in self.workloads:
            if workload["name"] == name:
                return workload
        raise KeyError(f"ledger {self.id!r} has no workload {name!r}")

    @property
    def schema_version(self) -> int:
        """The version the ledger was validated against (1 or 2)."""
        return self.data.get("schema_version", SCHEMA_VERSION)

    @property
    def protocol(self) -> dict[str, Any] | None:
        """The ledger's measurement `protocol` (present: it records with protocol v3), else None."""
        protocol = self.data.get("protocol")
        return protocol if isinstance(protocol, dict) else None

    @staticmethod
    def point_protocol_version(point: Mapping[str, Any]) -> int:
        """The protocol a point was measured with: its `protocol_version`, absent = 1 (before v3)."""
        return int(point.get("protocol_version", 1))

    def _arm_with_role(self, role: str) -> str | None:
        return next((a["name"] for a in self.arms if a["role"] == role), None)

    def baseline_arm_for(self, arm_name: str) -> str | None:
        """The arm `arm_name`'s multiplier is taken against: its `baseline`, else the role-baseline arm.

        None for the baseline itself (nothing to compare against) or when there is no baseline.
        """
        chosen = self.arm(arm_name).get("baseline") or self._arm_with_role("baseline")
        return None if chosen == arm_name else chosen

    def matched_baseline_for(self, arm_name: str) -> str | None:
        """The arm behind `multiplier_vs_matched`: its `matched_baseline`, else the matched-baseline arm."""
        chosen = self.arm(arm_name).get("matched_baseline") or self._arm_with_role("matched-baseline")
        return None if chosen == arm_name else chosen

    def multiplier_bases(self, arm_name: str) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
        """Each multiplier field of an arm with the arm it is taken against: the one pairing that recording,
        pooling over starts, the audit and the figures all read (``multiplier``: the baseline;
        ``multiplier_vs_matched``: the matched baseline)."""
        return (("multiplier", self.baseline_arm_for(arm_name)),
                ("multiplier_vs_matched", self.matched_baseline_for(arm_name)))

    def speculative_arms(self) -> list[dict[str, Any]]:
        """Arms that carry a multiplier: role speculative or policy, in ledger order."""
        return [a for a in self.arms if a["role"] in ("speculative", "policy")]

    @staticmethod
    def point_key(point: Mapping[str, Any]) -> PointKey:
        """(workload, temperature, concurrency) with temperature as float, so 0 and 0.0 are one key."""
        temperature = point.get("temperature")
        return (
            point["workload"],
            None if temperature is None else float(temperature),
            point.get("concurrency"),
        )

    def find_point(self, workload: str, temperature: float | None, concurrency: int | None) -> dict | None:
        """The point measured at these conditions, or None."""
        wanted = self.point_key(
            {"workload": workload, "temperature": temperature, "concurrency": concurrency}
        )
        return next((p for p in self.points if self.point_key(p) == wanted), None)

    @property
    def tolerances(self) -> dict[str, float]:
        """The ledger's tolerances over the defaults."""
        return {**DEFAULT_TOLERANCES, **self.data.get("tolerances", {})}

    @property
    def rounding(self) -> dict[str, int]:
        """The ledger's rounding (decimals per figure) over the defaults."""
        return {**DEFAULT_ROUNDING, **self.data.get("rounding", {})}

    def rounding_for(self, point: Mapping[str, Any]) -> dict[str, int]:
        """Rounding for one point: its own `rounding` override over the ledger's."""
        return {**self.rounding, **point.get("rounding", {})}

    def grid(self) -> Iterator[PointKey]:
        """Every (workload, temperature, concurrency) the `sweep` asks for, each once, in a stable order.

        The full grid is sweep.workloads (default: all, in ledger order) x temperatures x
        concurrencies; then the `only` extras, whose workloads default to the sweep's.
        Temperatures come out as floats. No sweep, no grid.
        """
        sweep = self.data.get("sweep")
        if not sweep:
            return
        workloads = sweep.get("workloads") or [w["name"] for w in self.workloads]
        seen: set[PointKey] = set()

        def emit(names: Iterable[str], temperatures: Iterable[float], concurrencies: Iterable[int]):
            for name in names:
                for temperature in temperatures:
                    for concurrency in concurrencies:
                        key = (name, float(temperature), concurrency)
                        if key not in seen:
                            seen.add(key)
                            yield key

        yield from emit(workloads, sweep["temperatures"], sweep["concurrencies"])
        for extra in sweep.get("only", []):
            yield from emit(
                extra.get("workloads") or workloads, [extra["temperature"]], extra["concurrencies"]
            )

    def is_gpu(self) -> bool:
        """Whether this ledger's figures come from (or are meant for) a CUDA GPU.

        Measured and reference ledgers say so in `provenance.accelerator.kind`. A planned
        ledger may state the same field ahead of the run; failing that, an `engine_args`
        `device` of "cuda" (shared, or on any arm) marks it as a GPU ledger. Anything else
        is not a GPU ledger, so a plain CPU `pytest` never selects it by accident.
        """
        return is_gpu_ledger(self.data)


def is_gpu_ledger(data: Mapping[str, Any]) -> bool:
    """`Ledger.is_gpu` on raw ledger data, for the checks that run before a `Ledger` exists."""
    provenance = data.get("provenance")
    accelerator = provenance.get("accelerator") if isinstance(provenance, dict) else None
    if isinstance(accelerator, dict):
        return accelerator.get("kind") == "cuda"
    if data.get("status") != "planned":
        return False
    arms = data.get("arms") if isinstance(data.get("arms"), list) else []
    args = [data.get("engine_args"), *(a.get("engine_args") for a in arms if isinstance(a, dict))]
    return any(str(a.get("device", "")).lower() == "cuda" for a in args if isinstance(a, dict))
