"""The ledger format: JSON Schema, loading, validation errors with file + JSON path, atomic writes.

A ledger is data, never code: it is parsed with `json` (no pickle, no eval), checked against
the packaged JSON Schema of its own `schema_version` and then against the rules a schema
cannot express (unique names, references between sections; for version 2 also what protocol v3
points must carry). Every problem names the file and the JSON path of the value it is about,
and all problems are collected before raising once, so one run shows everything to fix. Version
2 is what is written; version 1 ledgers still load (`specledger migrate` rewrites them as 2).
This module knows nothing about vLLM.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.errors import SpecledgerError

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

__all__ = [
    "DEFAULT_PROTOCOL",
    "DEFAULT_ROUNDING",
    "DEFAULT_TOLERANCES",
    "LEGACY_ACCEPTANCE",
    "MAX_INPUT_BYTES",
    "MAX_JSON_DEPTH",
    "SCHEMA_PATH",
    "SCHEMA_PATHS",
    "SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "Ledger",
    "LedgerError",
    "Problem",
    "dump_ledger",
    "has_figures",
    "iter_ledger_paths",
    "json_path",
    "load_json_safely",
    "load_ledger",
    "load_schema",
    "parse_ledger",
    "protocol_over_defaults",
    "protocol_with_overrides",
    "read_text_safely",
    "remove_stale_temporaries",
    "stale_temporaries",
    "write_ledger",
]

#: The version this specledger writes.
SCHEMA_VERSION = 2
#: Every version this specledger reads, oldest first; each is checked against its own schema file.
SCHEMA_VERSIONS: tuple[int, ...] = (1, 2)
#: The packaged schema file of each version (a real path for any normal, non-zipped install).
SCHEMA_PATHS: Mapping[int, Traversable] = {
    version: resources.files("specledger").joinpath(f"schemas/ledger-v{version}.schema.json")
    for version in SCHEMA_VERSIONS
}
#: The schema file of the version that is written.
SCHEMA_PATH: Traversable = SCHEMA_PATHS[SCHEMA_VERSION]

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


def protocol_with_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """DEFAULT_PROTOCOL with a plan's overrides, section by section: the protocol of a new recording."""
    own = overrides or {}
    return {key: ({**value, **own.get(key, {})} if isinstance(value, dict) else own.get(key, value))
            for key, value in DEFAULT_PROTOCOL.items()}  # each section's values are scalars


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

#: The largest input file read (ledger, report, bench result), in bytes. Real ones are well under 1 MiB;
#: anything bigger is a mistake (or a symlink to /dev/zero) and is refused before it is read.
MAX_INPUT_BYTES = 64 * 1024 * 1024
#: The deepest nesting of objects and arrays read (real ledgers are 7 deep); deeper input is refused
#: with its JSON path instead of exhausting the stack in the checks that walk it.
MAX_JSON_DEPTH = 64
#: How many duplicated point conditions are reported one by one; the rest are counted in one line.
_MAX_DUPLICATE_REPORTS = 10

_MAX_MESSAGE = 240
_PLAIN_KEY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")


def load_schema(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The ledger JSON Schema of `version` (default: the one written), parsed once per process."""
    return _parsed_schema(version)


@cache
def _parsed_schema(version: int) -> dict[str, Any]:
    return json.loads(SCHEMA_PATHS[version].read_text(encoding="utf-8"))


@cache
def _validator(version: int) -> Draft202012Validator:
    """Imported here, not at module load: the pytest plugin imports this module in every pytest session of
    any project that has specledger installed, and jsonschema is most of that import's cost."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema(version))


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
# the Ledger view
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


# --------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------


class _NonFinite:
    """Stands in for a NaN/Infinity literal (or an overflowing number) until its path is known."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


class _Object(dict):
    """A JSON object that remembers keys it saw twice (plain `json` keeps the last silently)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.duplicates: list[str] = []
        for key, value in pairs:
            if key in self:
                self.duplicates.append(key)
            self[key] = value


class _TooLong:
    """Stands in for an integer with more digits than Python converts (int() would raise mid-parse)."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _plain(value: Any, parts: list[str | int], file: str, problems: list[Problem], strict: bool) -> Any:
    """Plain JSON values from the hooked parse; reports overlong integers and too deep nesting, and
    when `strict` also non-finite numbers and duplicate keys."""
    if isinstance(value, _TooLong):
        digits = len(value.literal.lstrip("-"))
        limit = sys.get_int_max_str_digits()
        problems.append(
            Problem(file, json_path(parts), f"an integer of {digits:,} digits; at most {limit:,} are read")
        )
        return None
    if isinstance(value, _NonFinite):
        if not strict:
            return float(value.literal)
        problems.append(
            Problem(file, json_path(parts), f"{value.literal} is not a finite number; ledgers allow none")
        )
        return None
    if isinstance(value, dict | list) and len(parts) >= MAX_JSON_DEPTH:
        where = json_path(parts[:8]) + "..."  # the full path is MAX_JSON_DEPTH steps long
        problems.append(Problem(file, where, f"nested deeper than {MAX_JSON_DEPTH} levels"))
        return None
    if isinstance(value, dict):
        for key in getattr(value, "duplicates", ()) if strict else ():
            problems.append(
                Problem(
                    file, json_path([*parts, key]), f"duplicate key {key!r} (JSON would keep only the last)"
                )
            )
        return {k: _plain(v, [*parts, k], file, problems, strict) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, [*parts, i], file, problems, strict) for i, v in enumerate(value)]
    return value


def _decode(text: str, file: str, *, strict: bool = True) -> Any:
    """Parse JSON text, raising LedgerError (never ValueError or RecursionError) for what cannot be read.

    `strict` (ledgers) also refuses NaN/Infinity and duplicate keys; other JSON (bench results,
    which vLLM writes with NaN allowed) is read as `json` reads it, but still bounded.
    """
    if not text.strip():
        raise LedgerError([Problem(file, "$", "empty file: expected a JSON object")])
    odd: list[object] = []  # markers made while parsing; none (the usual case) lets the tree be used as parsed

    def constant(literal: str) -> _NonFinite:
        odd.append(marker := _NonFinite(literal))
        return marker

    def number(literal: str) -> float | _NonFinite:
        value = float(literal)
        return value if math.isfinite(value) else constant(literal)

    def integer(literal: str) -> int | _TooLong:
        try:
            return int(literal)
        except ValueError:  # over sys.get_int_max_str_digits(): reported with its JSON path
            odd.append(marker := _TooLong(literal))
            return marker

    def obj(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        plain = dict(pairs)
        if len(plain) == len(pairs):
            return plain
        odd.append(marker := _Object(pairs))
        return marker

    try:
        raw = json.loads(text, parse_constant=constant, parse_float=number, parse_int=integer, object_pairs_hook=obj)
    except json.JSONDecodeError as e:
        truncated = e.pos >= len(text.rstrip())
        what = "JSON ends early (truncated file?)" if truncated else "invalid JSON"
        raise LedgerError(
            [Problem(file, "$", f"{what} at line {e.lineno}, column {e.colno}: {e.msg}")]
        ) from None
    except RecursionError:
        raise LedgerError([Problem(file, "$", f"nested deeper than {MAX_JSON_DEPTH} levels")]) from None
    if not odd and _depth(raw) <= MAX_JSON_DEPTH:
        return raw
    problems: list[Problem] = []
    data = _plain(raw, [], file, problems, strict)
    if problems:
        raise LedgerError(problems)
    return data


def _depth(value: Any) -> int:
    """Levels of nested objects and arrays (a scalar: 0), counted breadth-first and without recursion,
    stopping once past MAX_JSON_DEPTH."""
    depth, level = 0, [value]
    while depth <= MAX_JSON_DEPTH:
        level = [v for v in level if isinstance(v, dict | list)]
        if not level:
            return depth
        depth += 1
        level = [child for v in level for child in (v.values() if isinstance(v, dict) else v)]
    return depth


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is not read (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


def read_text_safely(path: str | os.PathLike[str], what: str, *, where: str = "$") -> str:
    """The UTF-8 text of the regular file at `path`, else LedgerError naming the file (at `where`).

    Every input reader goes through here so that no input can hang or crash a run: a FIFO
    would block an open, a device (a symlink to /dev/zero) would read forever, a huge file
    would take minutes, and bytes that are not UTF-8 would raise. `what` names the kind of
    file in messages ("ledger", "report", "result file"); `where` is "$" for JSON inputs and
    "" for text ones.
    """
    file = str(path)

    def refuse(message: str) -> LedgerError:
        return LedgerError([Problem(file, where, message)])

    try:
        reason = _not_regular(os.stat(path).st_mode)  # before opening: opening a device can act
        if reason is not None:
            raise refuse(f"{reason}; a {what} must be a plain file")
        # O_NONBLOCK: should the path become a FIFO after the check, the open returns at once
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            reason = _not_regular(info.st_mode)
            if reason is not None:
                raise refuse(f"{reason}; a {what} must be a plain file")
            data = b"" if info.st_size > MAX_INPUT_BYTES else handle.read(MAX_INPUT_BYTES + 1)
            size = max(info.st_size, len(data))
    except OSError as e:
        raise refuse(f"cannot read: {e.strerror or e}") from None
    if size > MAX_INPUT_BYTES:
        raise refuse(
            f"too large: {size:,} bytes; a {what} may be at most {MAX_INPUT_BYTES // 2**20} MiB "
            "(specledger.schema.MAX_INPUT_BYTES)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise refuse(f"not UTF-8 text: {e.reason} at byte {e.start} (line {line})") from None


def load_json_safely(path: str | os.PathLike[str], what: str, *, strict: bool = True) -> Any:
    """The JSON value in the file at `path` (read with read_text_safely), else LedgerError.

    `strict` is for ledgers (no NaN/Infinity, no duplicate keys); any JSON input gets the
    bounds: integers Python can convert, at most MAX_JSON_DEPTH levels of nesting.
    """
    return _decode(read_text_safely(path, what), str(path), strict=strict)


def _sort_key(error: Any) -> tuple:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in error.absolute_path), error.message


def _shorten(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 3] + "..."


def _distinct_points(data: dict[str, Any]) -> tuple[dict[str, Any], list[int] | None]:
    """`data` with exact copies of a point left out, and each kept point's index in the original.

    Why: schema validation is slow per point (seconds per thousand), and a copy has exactly the
    errors of its original; the copies themselves are reported as duplicate points. The schema
    checks each point on its own, so leaving copies out changes no other error.
    None for the indexes when nothing was left out.
    """
    points = data.get("points")
    if not isinstance(points, list) or len(points) < 2:
        return data, None
    kept: dict[str, int] = {}
    for i, point in enumerate(points):
        kept.setdefault(json.dumps(point, sort_keys=True), i)
    if len(kept) == len(points):
        return data, None
    first_index = list(kept.values())
    return {**data, "points": [points[i] for i in first_index]}, first_index


def _schema_problems(data: dict[str, Any], file: str, version: int) -> list[Problem]:
    """Every error against the schema of `version`, sorted by path; unknown fields are reported at the field."""
    problems: list[Problem] = []
    data, first_index = _distinct_points(data)
    for error in sorted(_validator(version).iter_errors(data), key=_sort_key):
        parts = list(error.absolute_path)
        if first_index is not None and len(parts) > 1 and parts[0] == "points" and isinstance(parts[1], int):
            parts[1] = first_index[parts[1]]
        if error.validator == "additionalProperties" and error.validator_value is False:
            known = set(error.schema.get("properties", {}))
            patterns = [re.compile(p) for p in error.schema.get("patternProperties", {})]
            for key in error.instance:
                if key not in known and not any(p.search(key) for p in patterns):
                    problems.append(
                        Problem(
                            file,
                            json_path([*parts, key]),
                            f"unknown field {key!r} (schema version {version} has no such field)",
                        )
                    )
            continue
        message = error.message
        alternatives = error.validator_value if error.validator == "anyOf" else None
        if alternatives and all(set(a) == {"required"} for a in alternatives):
            names = ", ".join(n for a in alternatives for n in a["required"])
            message = f"needs one of the fields: {names}"
            if isinstance(error.instance, dict) and "role" in error.instance:
                message = f"an arm with role {error.instance['role']!r} {message}"
        problems.append(Problem(file, json_path(parts), _shorten(message)))
    return problems


def _named(items: Any) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) for the list entries that are objects with a string name."""
    if not isinstance(items, list):
        return []
    return [(i, x) for i, x in enumerate(items) if isinstance(x, dict) and isinstance(x.get("name"), str)]


def _unique_names(section: str, items: Any, file: str) -> tuple[set[str], list[Problem]]:
    problems: list[Problem] = []
    first: dict[str, int] = {}
    for i, item in _named(items):
        name = item["name"]
        if name in first:
            problems.append(
                Problem(
                    file,
                    json_path([section, i, "name"]),
                    f"{section[:-1]} name {name!r} is already used by {json_path([section, first[name]])}",
                )
            )
        else:
            first[name] = i
    return set(first), problems


def _semantic_problems(data: dict[str, Any], file: str) -> list[Problem]:
    """The rules JSON Schema cannot express. Defensive about types: the schema reports those."""
    arm_names, problems = _unique_names("arms", data.get("arms"), file)
    workload_names, more = _unique_names("workloads", data.get("workloads"), file)
    problems += more
    status = data.get("status")

    def unknown(kind: str, known: set[str], name: Any, parts: list[str | int]) -> None:
        if isinstance(name, str) and name not in known:
            problems.append(Problem(file, json_path(parts), f"names an unknown {kind} {name!r}"))

    for i, arm in _named(data.get("arms")):
        for field in ("baseline", "matched_baseline"):
            if field in arm:
                unknown("arm", arm_names, arm[field], ["arms", i, field])
                if arm[field] == arm["name"]:
                    problems.append(
                        Problem(file, json_path(["arms", i, field]), "an arm cannot be its own baseline")
                    )

    if status == "measured":
        provenance = data.get("provenance")
        if not isinstance(provenance, dict):
            problems.append(
                Problem(file, "$", "a measured ledger needs provenance (engine, date, accelerator)")
            )
        else:
            for field in ("engine", "date", "accelerator"):
                if field not in provenance:
                    problems.append(
                        Problem(
                            file, json_path(["provenance"]), f"a measured ledger's provenance needs {field!r}"
                        )
                    )

    problems += _figure_problems(data, file)
    seen: dict[PointKey, int] = {}
    repeats: dict[PointKey, list[int]] = {}
    points = data.get("points")
    for i, point in enumerate(points if isinstance(points, list) else []):
        if not isinstance(point, dict):
            continue
        unknown("workload", workload_names, point.get("workload"), ["points", i, "workload"])
        arms = point.get("arms")
        for name, result in arms.items() if isinstance(arms, dict) else ():
            unknown("arm", arm_names, name, ["points", i, "arms", name])
            if status != "reference" and isinstance(result, dict) and "multiplier_range" in result:
                problems.append(
                    Problem(
                        file,
                        json_path(["points", i, "arms", name, "multiplier_range"]),
                        "multiplier_range is for reference ledgers only; "
                        "a measured point states one multiplier",
                    )
                )
        if status == "measured":
            for field in ("temperature", "concurrency"):
                if field in point and point[field] is None:
                    problems.append(
                        Problem(
                            file,
                            json_path(["points", i, field]),
                            f"a measured point needs a {field}, not null",
                        )
                    )
        try:
            key = Ledger.point_key(point)
            hash(key)
        except (KeyError, TypeError, ValueError):
            continue
        if key in seen:
            repeats.setdefault(key, []).append(i)
        else:
            seen[key] = i
    problems += _duplicate_point_problems(seen, repeats, file)

    for section in ("critical_concurrency", "claims"):
        entries = data.get(section)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(entry, dict):
                unknown("arm", arm_names, entry.get("arm"), [section, i, "arm"])
                unknown("workload", workload_names, entry.get("workload"), [section, i, "workload"])

    sweep = data.get("sweep")
    if isinstance(sweep, dict):
        lists = [(["sweep", "workloads"], sweep.get("workloads"))]
        only = sweep.get("only")
        lists += [
            (["sweep", "only", j, "workloads"], o.get("workloads"))
            for j, o in enumerate(only or [])
            if isinstance(o, dict)
        ]
        for parts, names in lists:
            for j, name in enumerate(names if isinstance(names, list) else []):
                unknown("workload", workload_names, name, [*parts, j])

    mix = data.get("workload_mix")
    shares = mix.get("shares") if isinstance(mix, dict) else None
    for name in shares if isinstance(shares, dict) else ():
        unknown("workload", workload_names, name, ["workload_mix", "shares", name])
    return problems + _gpu_memory_problems(data, file)


#: vLLM's own default for `gpu_memory_utilization`, which an arm gets when neither it nor the ledger sets one.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: The most the arms' fractions may add up to: every arm's engine runs side by side on the same GPU(s), and
#: each process also holds a CUDA context outside its fraction.
MAX_SUMMED_GPU_MEMORY_UTILIZATION = 0.95


def _gpu_memory_problems(data: dict[str, Any], file: str) -> list[Problem]:
    """A GPU ledger whose arms cannot all start. Why here: a ledger's arms run side by side (one engine each,
    one ledger at a time), and vLLM gives each engine `gpu_memory_utilization` of the whole GPU and refuses to
    start when less is free. Six arms at 0.3 would start three and fail the rest, found only on the GPU
    after the staging and the first starts had spent the slot; the sum is known from the file."""
    if data.get("status") == "reference" or not is_gpu_ledger(data):
        return []
    shared = data.get("engine_args") if isinstance(data.get("engine_args"), dict) else {}
    arms = [arm for _, arm in _named(data.get("arms"))]
    fractions = []
    for arm in arms:
        own = arm.get("engine_args") if isinstance(arm.get("engine_args"), dict) else {}
        value = own.get("gpu_memory_utilization", shared.get("gpu_memory_utilization",
                                                             VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return []  # the schema reports the type
        fractions.append(float(value))
    total = sum(fractions)
    if total <= MAX_SUMMED_GPU_MEMORY_UTILIZATION + 1e-9:
        return []
    where = ["engine_args", "gpu_memory_utilization"] if "gpu_memory_utilization" in shared else ["arms"]
    listed = ", ".join(f"{arm['name']} {f:g}" for arm, f in zip(arms, fractions, strict=True))
    return [Problem(file, json_path(where),
                    f"the {len(arms)} arms run side by side on each GPU, and their gpu_memory_utilization adds "
                    f"up to {total:.2f} ({listed}); vLLM reserves each engine's fraction of the whole GPU, so "
                    f"the arms started last would not start: keep the sum at most "
                    f"{MAX_SUMMED_GPU_MEMORY_UTILIZATION} (arms not setting it get vLLM's default, "
                    f"{VLLM_DEFAULT_GPU_MEMORY_UTILIZATION})")]


#: Figures only a speculative (or policy) arm has: a baseline states none of them.
_SPEC_ONLY_FIGURES = ("multiplier", "multiplier_vs_matched", "multiplier_ci95", "multiplier_vs_matched_ci95",
                      "acceptance")


def _is_iso_date(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    try:
        _dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            _dt.date.fromisoformat(text)
        except ValueError:
            return False
    return True


def _figure_problems(data: dict[str, Any], file: str) -> list[Problem]:
    """Figures that contradict the ledger's own statements: a baseline with a multiplier or draft counters,
    a provenance date that is not a date, a measured ledger without points or repeats, a planned one with
    figures, a repeat count the sweep or protocol does not allow, an arm at 0 tok/s that produced tokens."""
    problems: list[Problem] = []
    status = data.get("status")
    roles = {a.get("name"): a.get("role") for a in data.get("arms") or [] if isinstance(a, dict)}
    provenance = data.get("provenance")
    if isinstance(provenance, dict) and "date" in provenance and not _is_iso_date(provenance["date"]):
        problems.append(Problem(file, "$.provenance.date",
                                f"{provenance['date']!r} is not an ISO 8601 date or date-time"))
    listed = data.get("points") if isinstance(data.get("points"), list) else []
    points = [p for p in listed if isinstance(p, dict)]
    if status == "measured" and not points:
        problems.append(Problem(file, "$.points", "a measured ledger holds no points (a plan is status planned)"))
    sweep = data.get("sweep") if isinstance(data.get("sweep"), dict) else {}
    protocol = data.get("protocol") if isinstance(data.get("protocol"), dict) else {}
    bounds = protocol.get("repeats") if isinstance(protocol.get("repeats"), dict) else {}
    for i, point in enumerate(data.get("points") or []):
        if not isinstance(point, dict) or not isinstance(point.get("arms"), dict):
            continue
        arms = point["arms"]
        with_figures = has_figures(point)
        if status == "planned" and with_figures:
            problems.append(Problem(file, json_path(["points", i]),
                                    "a planned ledger holds figures here (a recorded ledger is status measured)"))
        stated_repeats = 0
        for name, result in arms.items():
            if not isinstance(result, dict):
                continue
            where = ["points", i, "arms", name]
            if roles.get(name) in ("baseline", "matched-baseline"):
                for key in _SPEC_ONLY_FIGURES:
                    if key in result:
                        problems.append(Problem(file, json_path([*where, key]),
                                                f"arm {name!r} is a {roles[name]}: it drafts nothing and has no {key}"))
            tps = result.get("output_tokens_per_s") if isinstance(result.get("output_tokens_per_s"), dict) else {}
            reps = tps.get("repeats") if isinstance(tps.get("repeats"), list) else None
            if reps:
                stated_repeats += 1
                v3 = point.get("protocol_version") == 3
                expected = sweep.get("repeats") if not v3 else None
                if type(expected) is int and len(reps) != expected:
                    problems.append(Problem(file, json_path([*where, "output_tokens_per_s", "repeats"]),
                                            f"{len(reps)} repeats, but sweep.repeats says {expected}"))
                low, high = bounds.get("min"), bounds.get("max")
                if v3 and type(low) is int and type(high) is int and not low <= len(reps) <= high:
                    problems.append(Problem(file, json_path([*where, "output_tokens_per_s", "repeats"]),
                                            f"{len(reps)} repeats, outside protocol.repeats {low}..{high}"))
            numbers = [v for v in (reps or []) if type(v) in (int, float)]
            zero_rate = (numbers and all(v == 0 for v in numbers)) or (not numbers and tps.get("median") == 0)
            tokens = result.get("output_tokens")
            if zero_rate and type(tokens) in (int, float) and tokens > 0:
                problems.append(Problem(file, json_path([*where, "output_tokens"]),
                                        f"{tokens} output tokens at 0 tok/s: one of the two is wrong"))
        if status == "measured" and with_figures and not stated_repeats:
            problems.append(Problem(file, json_path(["points", i]),
                                    "a measured point states no arm's repeats (output_tokens_per_s.repeats)"))
    return problems


def _duplicate_point_problems(first: Mapping[PointKey, int], repeats: Mapping[PointKey, list[int]], file: str
                              ) -> list[Problem]:
    """One problem per duplicated condition (with its count), at most _MAX_DUPLICATE_REPORTS of them.

    Why: a ledger of thousands of copied points must say so in a few lines, not one line per copy.
    """
    problems: list[Problem] = []
    for key, later in list(repeats.items())[:_MAX_DUPLICATE_REPORTS]:
        where = f"$.points[{first[key]}] and $.points[{later[0]}]"
        if len(later) > 1:
            shown = ", ".join(f"$.points[{i}]" for i in later[:3]) + (", ..." if len(later) > 3 else "")
            where = f"$.points[{first[key]}] and {len(later):,} later points ({shown})"
        problems.append(
            Problem(
                file,
                json_path(["points", later[0]]),
                f"duplicate point (workload {key[0]!r}, temperature {key[1]}, concurrency {key[2]}): "
                f"{where} have the same conditions",
            )
        )
    rest = list(repeats.values())[_MAX_DUPLICATE_REPORTS:]
    if rest:
        problems.append(
            Problem(
                file,
                "$.points",
                f"and {len(rest):,} more duplicated conditions ({sum(map(len, rest)):,} duplicate points in all)",
            )
        )
    return problems


def _interval(value: Any) -> tuple[float, float] | None:
    """(low, high) of a two-number list, else None (the schema reports any other shape)."""
    if isinstance(value, list) and len(value) == 2 and all(type(v) in (int, float) for v in value):
        return value[0], value[1]
    return None


def _protocol_problems(data: dict[str, Any], file: str) -> list[Problem]:
    """Version 2's rules: what a protocol v3 point must carry so that its intervals and pairing can be checked.

    A point measured before v3 (protocol_version 1 or absent) keeps version 1's rules, so that every
    version 1 ledger stays valid as version 2. Defensive about types: the schema reports those.
    """
    problems: list[Problem] = []
    protocol = data.get("protocol")
    protocol_version = protocol.get("version") if isinstance(protocol, dict) else None
    repeats_rule = protocol.get("repeats") if isinstance(protocol, dict) else None
    if isinstance(repeats_rule, dict):
        low, high = repeats_rule.get("min"), repeats_rule.get("max")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(
                Problem(file, json_path(["protocol", "repeats"]), f"repeats min {low} is above max {high}")
            )
    roles = {arm["name"]: arm.get("role") for _, arm in _named(data.get("arms"))}

    points = data.get("points")
    for i, point in enumerate(points if isinstance(points, list) else []):
        if not isinstance(point, dict):
            continue
        v3 = point.get("protocol_version") == 3
        if v3 and protocol_version != 3:
            problems.append(
                Problem(
                    file,
                    json_path(["points", i, "protocol_version"]),
                    "a protocol_version 3 point needs the ledger's protocol (version 3) it was measured with",
                )
            )
        if point.get("busy") is True and not v3:
            problems.append(
                Problem(
                    file,
                    json_path(["points", i, "busy"]),
                    "busy: true is for protocol_version 3 points only (recorded with --ledger-force-busy)",
                )
            )
        arms = point.get("arms")
        repeat_counts: dict[str, int] = {}
        for name, result in arms.items() if isinstance(arms, dict) else ():
            if not isinstance(result, dict):
                continue
            base: list[str | int] = ["points", i, "arms", name]
            throughput = result.get("output_tokens_per_s")
            throughput = throughput if isinstance(throughput, dict) else {}
            for parts, value in (
                ([*base, "output_tokens_per_s", "ci95"], throughput.get("ci95")),
                ([*base, "multiplier_ci95"], result.get("multiplier_ci95")),
                ([*base, "multiplier_vs_matched_ci95"], result.get("multiplier_vs_matched_ci95")),
            ):
                interval = _interval(value)
                if interval is not None and interval[0] > interval[1]:
                    problems.append(
                        Problem(file, json_path(parts), f"interval low {interval[0]} is above high {interval[1]}")
                    )
            repeats = throughput.get("repeats")
            if isinstance(repeats, list):
                repeat_counts[name] = len(repeats)
                window = result.get("window")
                for field, per_repeat in window.items() if isinstance(window, dict) else ():
                    if isinstance(per_repeat, list) and len(per_repeat) != len(repeats):
                        problems.append(
                            Problem(
                                file,
                                json_path([*base, "window", field]),
                                f"has {len(per_repeat)} entries for {len(repeats)} repeats (one per repeat)",
                            )
                        )
            lossless = result.get("lossless")
            if isinstance(lossless, dict):
                identical, compared = lossless.get("identical"), lossless.get("requests_compared")
                if isinstance(identical, int) and isinstance(compared, int) and identical > compared:
                    problems.append(
                        Problem(
                            file,
                            json_path([*base, "lossless", "identical"]),
                            f"{identical} identical of {compared} requests compared",
                        )
                    )
            if not v3:
                continue
            missing = [f for f in ("repeats", "mean", "ci95") if f not in throughput]
            if missing:
                where = [*base, "output_tokens_per_s"] if "output_tokens_per_s" in result else base
                problems.append(
                    Problem(
                        file,
                        json_path(where),
                        f"a protocol_version 3 point needs output_tokens_per_s {', '.join(missing)} for every arm",
                    )
                )
            if roles.get(name) in ("speculative", "policy") and "multiplier" in result:
                if "multiplier_ci95" not in result:
                    problems.append(
                        Problem(
                            file,
                            json_path(base),
                            "a speculative or policy arm with a multiplier in a protocol_version 3 point "
                            "needs multiplier_ci95",
                        )
                    )
        if v3 and len(set(repeat_counts.values())) > 1:
            counts = ", ".join(f"{name} {n}" for name, n in repeat_counts.items())
            problems.append(
                Problem(
                    file,
                    json_path(["points", i, "arms"]),
                    f"every arm of a protocol_version 3 point needs the same number of repeats "
                    f"(repeat r of one arm is paired with repeat r of the others): {counts}",
                )
            )
    return problems


def parse_ledger(text: str, file: str) -> Ledger:
    """Parse and fully validate ledger text; `file` is the name every problem carries.

    Raises LedgerError listing every problem found.
    """
    data = _decode(text, file)
    if not isinstance(data, dict):
        kind = "an array" if isinstance(data, list) else f"a JSON {type(data).__name__}"
        raise LedgerError([Problem(file, "$", f"a ledger must be a JSON object, got {kind}")])
    version = data.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int or version not in SCHEMA_VERSIONS:
        raise LedgerError(
            [
                Problem(
                    file,
                    "$.schema_version",
                    f"unknown schema_version {json.dumps(version)}; "
                    f"this specledger reads versions {', '.join(str(v) for v in SCHEMA_VERSIONS)}",
                )
            ]
        )
    problems = _schema_problems(data, file, version) + _semantic_problems(data, file)
    if version >= 2:
        problems += _protocol_problems(data, file)
    if problems:
        raise LedgerError(problems)
    return Ledger(path=Path(file), data=data)


def load_ledger(path: str | os.PathLike[str]) -> Ledger:
    """Read and validate the ledger at `path` (problems name the path as given)."""
    file = str(path)
    ledger = parse_ledger(read_text_safely(path, "ledger"), file)
    ledger.path = Path(path)
    return ledger


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def dump_ledger(data: Mapping[str, Any]) -> str:
    """Ledger JSON as committed: indent 2, key order kept, no NaN/Infinity, trailing newline."""
    return json.dumps(data, indent=2, allow_nan=False, ensure_ascii=False) + "\n"


def write_ledger(path: str | os.PathLike[str], data: Mapping[str, Any], *, overwrite: bool) -> None:
    """Validate `data`, then write it to `path` atomically (mode 0o644).

    Never writes an invalid ledger (LedgerError) and never replaces an existing file unless
    `overwrite` is true (FileExistsError): committed figures change only on purpose. The text
    goes to a temporary file in the same directory, is fsynced, then renamed over `path`, so a
    crash leaves either the old file or the new one, never a partial one.
    """
    target = Path(path)
    text = dump_ledger(data)
    parse_ledger(text, str(target))
    if not overwrite and target.exists():
        raise FileExistsError(
            f"{target} already exists; refusing to replace a committed ledger "
            "(re-record with --ledger-record, i.e. overwrite=True, to replace it on purpose)"
        )
    directory = target.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Temporary files `write_ledger` left beside `path` when its process was killed mid-write.

    A SIGKILL between the temporary file's creation and the rename leaves `.<name>.<random>.tmp`
    behind (the ledger itself is intact: the rename never happened). The next recording of that
    ledger removes them (`remove_stale_temporaries`).
    """
    target = Path(path)
    return sorted(target.parent.glob(f".{target.name}.*.tmp"))


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Delete what `stale_temporaries` finds; returns the files removed."""
    removed = []
    for tmp in stale_temporaries(path):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; best effort where directories cannot be opened (e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def iter_ledger_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files as given, directories expanded to their `*.json` (sorted); FileNotFoundError if missing."""
    found: list[Path] = []
    for entry in paths:
        path = Path(entry)
        if path.is_dir():
            found.extend(sorted(p for p in path.glob("*.json") if p.is_file()))
        elif path.exists():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {entry}")
    return found
