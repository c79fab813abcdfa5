"""Validating ledgers: the packaged JSON Schema of each version (`SCHEMA_PATHS`, `load_schema`) and the rules a
schema cannot express, then `parse_ledger`, which runs them all.

A ledger is data, never code: it is parsed with `json` (no pickle, no eval, see `safe_read`), checked against the
packaged JSON Schema of its own `schema_version` and then against the rules a schema cannot express (unique names,
references between sections, figures, GPU memory, duplicate points; for version 2 also what protocol v3 points must
carry). Every problem names the file and the JSON path of the value it is about, and all problems are collected
before raising once, so one run shows everything to fix. Version 2 is what is written; version 1 ledgers still load
(`specledger migrate` rewrites them as 2).

jsonschema is imported only when a ledger is first validated (`_validator`), so importing this module stays cheap:
the pytest plugin imports it in every pytest session of a project that has specledger installed. Reading files and
writing ledgers are `io`'s, which builds on `parse_ledger`; this module needs only `model` and `safe_read`.

Over 500 lines on purpose: it is one list of checks over one ledger, each a function of (data, file) returning
problems; splitting the list would only scatter the rules a reader checks a ledger against.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.ledger import gpu_memory
from specledger.ledger.model import (
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    Ledger,
    LedgerError,
    PointKey,
    Problem,
    has_figures,
    is_gpu_ledger,
    json_path,
)
from specledger.ledger.safe_read import decode_json

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

__all__ = [
    "SCHEMA_PATH",
    "SCHEMA_PATHS",
    "load_schema",
    "parse_ledger",
]

#: The packaged schema file of each version (a real path for any normal, non-zipped install).
SCHEMA_PATHS: Mapping[int, Traversable] = {
    version: resources.files("specledger.ledger").joinpath(f"schemas/ledger-v{version}.schema.json")
    for version in SCHEMA_VERSIONS
}
#: The schema file of the version that is written.
SCHEMA_PATH: Traversable = SCHEMA_PATHS[SCHEMA_VERSION]

#: How many duplicated point conditions are reported one by one; the rest are counted in one line.
_MAX_DUPLICATE_REPORTS = 10

_MAX_MESSAGE = 240


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


def _gpu_memory_problems(data: dict[str, Any], file: str) -> list[Problem]:
    """A GPU ledger whose arms cannot all start, or would not fit the GPU its provenance names
    (`gpu_memory.device_memory_problem`, when `$.provenance.accelerator.memory_gib` says how large it is). Why here:
    the sums are known from the file, and found only on the GPU they cost the slot (2026-12-05: an arm died of CUDA
    out of memory mid-run on an H100 80GB)."""
    if data.get("status") == "reference" or not is_gpu_ledger(data):
        return []
    fractions = gpu_memory.arm_fractions(data)
    if fractions is None:
        return []  # the schema reports the type
    where = gpu_memory.setting_path(data)
    summed = gpu_memory.summed_fraction_problem(fractions)
    if summed is not None:
        return [Problem(file, json_path(where), summed)]
    provenance = data.get("provenance") if isinstance(data.get("provenance"), dict) else {}
    accel = provenance.get("accelerator") if isinstance(provenance.get("accelerator"), dict) else {}
    memory_gib = accel.get("memory_gib")
    if not isinstance(memory_gib, (int, float)) or isinstance(memory_gib, bool):
        return []
    problem = gpu_memory.device_memory_problem(fractions, float(memory_gib))
    if problem is None:
        return []
    return [Problem(file, json_path(where), f"{problem} ($.provenance.accelerator: {accel.get('name', 'a GPU')} "
                                            f"of {float(memory_gib):g} GiB)")]


#: Figures only a speculative (or policy) arm has: a baseline states none of them.
_SPEC_ONLY_FIGURES = ("multiplier", "multiplier_vs_matched", "multiplier_ci95", "multiplier_vs_matched_ci95",
                      "multiplier_by_start", "multiplier_vs_matched_by_start", "acceptance")


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
    pooled_arms = _arms_over_starts(points)
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
                window = result.get("window") if isinstance(result.get("window"), dict) else {}
                starts = window.get("start") if isinstance(window.get("start"), list) else None
                if v3 and starts is not None and len(starts) != len(reps):
                    problems.append(Problem(file, json_path([*where, "window", "start"]),
                                            f"{len(starts)} engine starts named for {len(reps)} repeats"))
                elif v3 and type(high) is int and ((starts is not None and len(set(starts)) >= 2)
                                                   or name in pooled_arms):
                    # over several engine starts each start has its share of the repeats (at least a pair), and a
                    # point gathers starts across runs (--ledger-add-start): the bound holds per start. So it does
                    # for a point of one start where the ledger can pool the arm's spread over starts (another
                    # point has two or more): that point's interval is taken with the pooled spread
                    # (start_spread, which the audit recomputes), not from its own few repeats. A run of one start
                    # names no start (window.start is absent): its repeats are that one start's
                    named = starts if starts is not None else [0] * len(reps)
                    field = ["window", "start"] if starts is not None else ["output_tokens_per_s", "repeats"]
                    for start in dict.fromkeys(named):
                        n = named.count(start)
                        if not 2 <= n <= high:
                            problems.append(Problem(file, json_path([*where, *field]),
                                                    f"engine start {start} has {n} repeats, outside 2..{high}"))
                elif v3 and type(low) is int and type(high) is int and not low <= len(reps) <= high:
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


def _arms_over_starts(points: list[dict[str, Any]]) -> set[str]:
    """Arms measured in two or more engine starts at some v3 point: the arms whose between-start spread the ledger
    pools over its points (``figures.pooled_start_spreads``), so that every interval of theirs is taken with it."""
    arms: set[str] = set()
    for point in points:
        if point.get("protocol_version") != 3 or not isinstance(point.get("arms"), dict):
            continue
        for name, result in point["arms"].items():
            window = result.get("window") if isinstance(result, dict) else None
            starts = window.get("start") if isinstance(window, dict) else None
            if isinstance(starts, list) and len({s for s in starts if isinstance(s, int)}) >= 2:
                arms.add(name)
    return arms


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
    data = decode_json(text, file)
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
