"""Turn `vllm bench serve --save-result` files into a specledger ledger.

Why: many speculative-decoding numbers already exist as `vllm bench serve` result files. Filing
them as a ledger lets `show`, `audit`, `plot` and `policy` work on them, instead of someone
copying figures by hand (and forgetting that vLLM prints the acceptance rate in percent).

What a result file holds (vLLM 0.32, `vllm/benchmarks/serve.py`) and where it goes:

=============================================  ==========================================================
result JSON key (unit)                          ledger field
=============================================  ==========================================================
`label` (the run's `--label`)                   arm name; `baseline_label` marks the baseline arm
`max_concurrency` (requests in flight)          point `concurrency`
`output_throughput` (tokens/s)                  `output_tokens_per_s`: one repeat per file, median = it
`completed`, `total_output_tokens`, `duration`  `requests`, `output_tokens`, `duration_s` (s)
`spec_decode_num_drafts` (count)                `acceptance.drafts`
`spec_decode_draft_tokens` (count)              `acceptance.draft_tokens`
`spec_decode_accepted_tokens` (count)           `acceptance.accepted_tokens`
`spec_decode_acceptance_rate` (PERCENT)         `acceptance.acceptance_rate` (fraction: / 100)
`spec_decode_acceptance_length` (tokens/step)   `acceptance.acceptance_length` (1 + accepted / drafts)
`spec_decode_per_position_acceptance_rates`     `acceptance.per_position` (already fractions: unchanged),
  (fractions of drafts)                           and `accepted_per_position` = fraction x drafts (exact)
`date` (%Y%m%d-%H%M%S, the bench machine's      `provenance.date` (earliest run, ISO 8601, no zone:
  local time)                                     vLLM records none), each file's date in `notes`
`model_id`, `tokenizer_id`, `backend`           `target.model`; must agree across files
=============================================  ==========================================================

A result file does not record the temperature, the dataset, the speculative config, the engine
version or the hardware. `vllm bench serve --metadata KEY=VALUE ...` stores extra keys in the
file, and these are read: `temperature`, `workload`, `workload_kind`, `dataset_path`,
`dataset_name`, `speculative_config` (JSON), `engine`, `engine_version`, `torch_version`,
`accelerator` (cpu, cuda...), `accelerator_name`, `accelerator_count`, `host`. What the files do
not say, the caller passes (and a caller's value that contradicts a file is an error, not an
override).

Status: the ledger is `measured`. The schema's three states are planned (no figures),
reference (figures published elsewhere, which nothing here can reproduce) and measured.
These figures are measurements of a vLLM engine with a known, re-runnable command, so they are
not `reference`; adding a fourth state would change the format for every reader. Measured
it is, with `provenance.command` starting "imported from vllm bench serve results: <files>"
so nobody mistakes them for this suite's record mode (HTTP, client-timed, one repeat, no
interleaving), and a note saying so. Figures are rounded as record mode rounds them (the
ledger's default rounding), so `specledger audit` checks them like any measured ledger.

Inconsistent input is rejected with every problem at once, each naming its file: mixed models,
tokenizers or backends, mixed datasets (declared dataset, or paired runs that sent different
prompts), two files for one arm at one point, a speculative point without its baseline, a
baseline run with speculative counters, failed requests, open-loop runs (a finite request rate
has no fixed concurrency).

Over 500 lines on purpose: one importer, whose every check above is a rule a reader holds the import to;
the table above is its map, and the functions below follow it field by field.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from specledger.errors import SpecledgerError
from specledger.ledger import LedgerError, figures
from specledger.ledger.model import DEFAULT_ROUNDING, SCHEMA_VERSION
from specledger.ledger.safe_read import load_json_safely

__all__ = ["IMPORT_PREFIX", "BenchImportError", "BenchRun", "import_bench", "load_bench_result"]

#: How `provenance.command` of an imported ledger starts.
IMPORT_PREFIX = "imported from vllm bench serve results: "

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_WORKLOAD_KINDS = ("free-form", "copy", "math", "code", "mixed", "other")
_SPEC_KEYS = (
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)
#: How a number given as `--metadata` text must be written: ASCII digits only. Python's float() and
#: int() also take other scripts' digits ("٠.٥") and str.isdigit() takes "²", which int() refuses.
_METADATA_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_METADATA_COUNT = re.compile(r"\d+", re.ASCII)
#: Relative slack for figures vLLM derived from the counters in the same file (float noise only).
_REL = 1e-6


class BenchImportError(SpecledgerError, ValueError):
    """The result files cannot become one ledger; carries every problem, each naming its file."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class BenchRun:
    """One result file: its raw JSON plus the arm, temperature and concurrency it is filed under."""

    file: str
    data: dict[str, Any]
    arm: str
    temperature: float | None
    concurrency: int | None
    date: str | None

    def meta(self, key: str) -> str | None:
        """A `--metadata` value (vLLM stores them as strings), None when absent or empty."""
        value = self.data.get(key)
        return None if value is None or value == "" else str(value)


def load_bench_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one result file; BenchImportError (naming it) unless it is a JSON object from bench serve."""
    file = str(path)
    try:
        # not strict: vLLM writes NaN where a statistic is undefined; still a regular file, bounded
        data = load_json_safely(path, "result file", strict=False)
    except LedgerError as e:
        raise BenchImportError([str(p) for p in e.problems]) from None
    if not isinstance(data, dict):
        raise BenchImportError([f"{file}: expected a JSON object (one vllm bench serve result)"])
    missing = [k for k in ("output_throughput", "max_concurrency", "model_id", "date") if k not in data]
    if missing:
        raise BenchImportError(
            [f"{file}: not a vllm bench serve --save-result file (no {', '.join(missing)}); "
             "--append-result files hold several runs and are not supported"]
        )
    return data


def import_bench(
    files: Sequence[str | os.PathLike[str]],
    *,
    ledger_id: str,
    baseline_label: str = "baseline",
    arm_of: Mapping[str, str] | None = None,
    speculative_configs: Mapping[str, Mapping[str, Any]] | None = None,
    temperature: float | None = None,
    workload: str | None = None,
    workload_kind: str | None = None,
    engine: Mapping[str, str] | None = None,
    accelerator: Mapping[str, Any] | None = None,
    target_name: str | None = None,
    target_model: str | None = None,
    title: str | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """The ledger (a plain dict, not yet validated or written) for these result files.

    Each file is one arm at one concurrency: its arm is `arm_of[file]` (any spelling of the
    path), else its `label`; the arm named `baseline_label` is the baseline, every other arm is
    speculative and needs its speculative_config (from `speculative_configs[arm]` or the
    file's metadata).
    `target_model` names the target as the ledger should (e.g. "embedded:smollm2") where the
    files' `model_id` is a machine's local folder. Write the result with `specledger.ledger.write_ledger`,
    which validates it.
    """
    if not files:
        raise BenchImportError(["no result files given"])
    problems: list[str] = []
    runs: list[BenchRun] = []
    arms_by_path = {_key(f): arm for f, arm in (arm_of or {}).items()}
    for path in files:
        try:
            data = load_bench_result(path)
        except BenchImportError as e:
            problems += e.problems
            continue
        run = _run(str(path), data, arms_by_path, temperature, problems)
        if run is not None:
            runs.append(run)
    if problems:
        raise BenchImportError(problems)

    _check_same(runs, ("model_id", "tokenizer_id", "backend"), "mixed", problems)
    _check_same(runs, ("dataset_name", "dataset_path", "workload", "workload_kind"), "mixed datasets:", problems)
    _check_same(runs, ("engine", "engine_version", "torch_version", "accelerator", "accelerator_name",
                       "accelerator_count", "host"), "mixed machines:", problems)
    arms = _arms(runs, baseline_label, speculative_configs or {}, problems)
    points = _points(runs, baseline_label, problems)
    prov = _provenance(runs, engine, accelerator, command, problems)
    workload_entry = _workload(runs, workload, workload_kind, problems)
    if problems:
        raise BenchImportError(problems)

    model = str(runs[0].data["model_id"])
    name = target_name or _slug(Path(model).name or model)
    ledger: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "id": ledger_id,
        "title": title or f"{Path(model).name}: {', '.join(a['name'] for a in arms)} (vllm bench serve, imported)",
        "description": (
            "Figures imported from `vllm bench serve --save-result` files: HTTP load from vLLM's own "
            "benchmark client, one run per file, not this suite's paired, interleaved record mode (which "
            "measures in-process: a pytest re-check of this ledger compares across the two methods)."
        ),
        "status": "measured",
        "provenance": prov,
        "target": {"name": name, "model": target_model or model},
        "arms": arms,
        "workloads": [workload_entry],
        "points": [
            _point(workload_entry["name"], key, by_arm, baseline_label) for key, by_arm in sorted(points.items())
        ],
        "notes": [_file_note(run) for run in runs],
    }
    return ledger


# --------------------------------------------------------------------------------------------
# per file
# --------------------------------------------------------------------------------------------


def _run(file: str, data: dict[str, Any], arm_of: Mapping[str, str], temperature: float | None,
         problems: list[str]) -> BenchRun | None:
    """Check one file on its own and say where it goes; None (with problems) when it cannot go anywhere."""
    before = len(problems)
    arm = arm_of.get(_key(file)) or data.get("label")
    if not isinstance(arm, str) or not _NAME.match(arm):
        problems.append(
            f"{file}: arm name {arm!r} (the run's --label) is not a ledger name "
            "(lower case, digits, . _ -): relabel the run or map the file to an arm"
        )
    concurrency = data.get("max_concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)):
        problems.append(f"{file}: max_concurrency is {concurrency!r}, not a whole number")
    elif concurrency is None or concurrency < 1:
        problems.append(
            f"{file}: max_concurrency is {concurrency!r}: the run had no concurrency limit "
            "(re-run with --max-concurrency N)"
        )
    if data.get("request_rate", "inf") != "inf" or "ramp_up_strategy" in data:
        problems.append(
            f"{file}: request_rate {data.get('request_rate')!r}: an open-loop (rate-limited) run has no fixed "
            "concurrency; a ledger point is a closed loop (request rate inf)"
        )
    failed, completed = data.get("failed") or 0, data.get("completed")
    if failed:
        problems.append(f"{file}: {failed} request(s) failed; its throughput counts only the completed ones")
    if not isinstance(completed, int) or completed < 1:
        problems.append(f"{file}: {completed!r} requests completed: nothing was measured")
    for key in ("output_throughput", "duration"):
        value = data.get(key)
        if not _finite(value) or value < 0:
            problems.append(f"{file}: {key} is {value!r}, not a non-negative number")
    stated = data.get("temperature")
    file_temperature: float | None = None
    if stated is not None:
        if _METADATA_NUMBER.fullmatch(str(stated)):
            file_temperature = float(stated)
        else:
            problems.append(f"{file}: metadata temperature {stated!r} is not a number written in ASCII digits")
    if file_temperature is not None and temperature is not None and file_temperature != temperature:
        problems.append(f"{file}: records temperature {file_temperature:g}, but {temperature:g} was given")
    chosen = file_temperature if file_temperature is not None else temperature
    if chosen is None and stated is None:
        problems.append(
            f"{file}: no temperature (vllm bench serve records it only as --metadata temperature=T); "
            "pass the temperature the run used"
        )
    elif chosen is not None and (not math.isfinite(chosen) or chosen < 0):
        problems.append(f"{file}: temperature {chosen!r} is not a non-negative number")
    date = _iso_date(data.get("date"))
    if date is None:
        problems.append(f"{file}: date {data.get('date')!r} is neither %Y%m%d-%H%M%S (vLLM's) nor ISO 8601")
    if len(problems) > before:
        return None
    return BenchRun(file, data, arm, chosen, concurrency, date)


def _key(path: str | os.PathLike[str]) -> str:
    """One spelling per file, so `arm_of` finds it however the caller wrote the path."""
    return str(Path(path).resolve())


def _iso_date(value: Any) -> str | None:
    """vLLM's '20261129-170226' as '2026-11-29T17:02:26' (no zone: vLLM writes local time without one)."""
    if not isinstance(value, str):
        return None
    for parse in (lambda v: datetime.strptime(v, "%Y%m%d-%H%M%S"), datetime.fromisoformat):
        try:
            return parse(value).isoformat()
        except ValueError:
            continue
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return slug or "model"


# --------------------------------------------------------------------------------------------
# across files
# --------------------------------------------------------------------------------------------


def _check_same(runs: Sequence[BenchRun], keys: Sequence[str], what: str, problems: list[str]) -> None:
    """Every file that states `key` states the same value as the first file that does."""
    for key in keys:
        first: BenchRun | None = None
        for run in runs:
            value = run.meta(key)
            if value is None:
                continue
            if first is None:
                first = run
            elif value != first.meta(key):
                problems.append(
                    f"{run.file}: {what} {key} {value!r}, but {first.file} has {first.meta(key)!r}"
                )


def _arms(runs: Sequence[BenchRun], baseline: str, configs: Mapping[str, Mapping[str, Any]],
          problems: list[str]) -> list[dict[str, Any]]:
    """Baseline first, then the speculative arms in the order their files came."""
    names = list(dict.fromkeys(run.arm for run in runs))
    if baseline not in names:
        problems.append(
            f"no file is the baseline: no run is labelled {baseline!r} (labels: {', '.join(names)})"
        )
    for name in configs:
        if name not in names or name == baseline:
            problems.append(f"a speculative config was given for {name!r}, which is no speculative arm here")
    out: list[dict[str, Any]] = []
    if baseline in names:
        out.append({"name": baseline, "role": "baseline", "description": "no drafter (vllm bench serve run)"})
    for run in runs:
        if run.arm == baseline and run.meta("speculative_config") is not None:
            problems.append(
                f"{run.file}: labelled as the baseline {baseline!r} but records a speculative_config"
            )
    for name in names:
        if name == baseline:
            continue
        config = _spec_config(name, [r for r in runs if r.arm == name], configs.get(name), problems)
        arm: dict[str, Any] = {"name": name, "role": "speculative"}
        if baseline in names:
            arm["baseline"] = baseline
        if config is not None:
            arm["speculative_config"] = config
        out.append(arm)
    return out


def _spec_config(arm: str, runs: Sequence[BenchRun], given: Mapping[str, Any] | None,
                 problems: list[str]) -> dict[str, Any] | None:
    """The arm's speculative_config: the files' metadata and the caller's must agree; one is needed."""
    found: dict[str, Any] | None = dict(given) if given is not None else None
    source = "the given config"
    for run in runs:
        text = run.meta("speculative_config")
        if text is None:
            continue
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            problems.append(f"{run.file}: metadata speculative_config is not JSON: {e}")
            continue
        if not isinstance(config, dict):
            problems.append(f"{run.file}: metadata speculative_config is not a JSON object")
        elif found is None:
            found, source = config, run.file
        elif config != found:
            problems.append(
                f"{run.file}: speculative_config {json.dumps(config)} differs from {source}'s {json.dumps(found)}"
            )
    if found is None:
        files = ", ".join(r.file for r in runs)
        problems.append(
            f"{files}: arm {arm!r} is speculative but its speculative_config is unknown: vllm bench serve "
            "does not record the server's; give it, or run bench serve with --metadata speculative_config=JSON"
        )
    elif not isinstance(found.get("method"), str):
        problems.append(f"arm {arm!r}: speculative_config {json.dumps(found)} has no method")
    return found


PointKey = tuple[float, int]


def _points(runs: Sequence[BenchRun], baseline: str,
            problems: list[str]) -> dict[PointKey, dict[str, BenchRun]]:
    """Runs by (temperature, concurrency) and arm; duplicates, unpaired and mismatched runs are problems."""
    points: dict[PointKey, dict[str, BenchRun]] = {}
    for run in runs:
        assert run.temperature is not None and run.concurrency is not None
        key = (run.temperature, run.concurrency)
        by_arm = points.setdefault(key, {})
        if run.arm in by_arm:
            problems.append(
                f"{run.file}: duplicate: {by_arm[run.arm].file} is already arm {run.arm!r} at concurrency "
                f"{run.concurrency}, temperature {run.temperature:g} (one file per arm and concurrency)"
            )
            continue
        by_arm[run.arm] = run
    for (t, c), by_arm in points.items():
        base = by_arm.get(baseline)
        for arm, run in by_arm.items():
            if arm == baseline:
                _check_baseline_counters(run, problems)
                continue
            if base is None:
                problems.append(
                    f"{run.file}: arm {arm!r} at concurrency {c}, temperature {t:g} has no baseline run "
                    f"(no file labelled {baseline!r} at that concurrency and temperature)"
                )
                continue
            for key in ("num_prompts", "total_input_tokens"):
                if run.data.get(key) != base.data.get(key):
                    problems.append(
                        f"{run.file}: mixed datasets: {key} {run.data.get(key)!r}, but its baseline "
                        f"{base.file} has {base.data.get(key)!r} (the paired runs sent different prompts)"
                    )
            _acceptance(run, problems)
    return points


def _check_baseline_counters(run: BenchRun, problems: list[str]) -> None:
    drafts = run.data.get("spec_decode_num_drafts")
    if drafts:
        problems.append(
            f"{run.file}: labelled as the baseline but its server drafted ({drafts} drafts): "
            "was it started with a speculative config?"
        )


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _REL * max(1.0, abs(a), abs(b))


def _acceptance(run: BenchRun, problems: list[str]) -> dict[str, Any] | None:
    """The acceptance block of a speculative run (unrounded), or None when the file has no counters.

    The counts decide the units: the stated rate must be accepted/draft_tokens x 100 (percent)
    and the length 1 + accepted/drafts, so a file in other units is an error, not a silent x100.
    """
    d = run.data
    if not any(k in d for k in _SPEC_KEYS):
        return None
    drafts, draft_tokens, accepted = (d.get(k) for k in _SPEC_KEYS[2:5])
    rate_pct, length, per_pos = d.get(_SPEC_KEYS[0]), d.get(_SPEC_KEYS[1]), d.get(_SPEC_KEYS[5])
    before = len(problems)
    for key, value in zip(_SPEC_KEYS[2:5], (drafts, draft_tokens, accepted), strict=True):
        if not isinstance(value, int) or value < 0:
            problems.append(f"{run.file}: {key} is {value!r}, not a count")
    for key, value in ((_SPEC_KEYS[0], rate_pct), (_SPEC_KEYS[1], length)):
        if not _finite(value):
            problems.append(f"{run.file}: {key} is {value!r}, not a number")
    if not isinstance(per_pos, list) or not all(_finite(v) and 0 <= v <= 1 for v in per_pos):
        problems.append(f"{run.file}: {_SPEC_KEYS[5]} is {per_pos!r}, not a list of fractions in [0, 1]")
    if len(problems) > before:
        return None
    if not draft_tokens or not drafts:
        problems.append(f"{run.file}: {drafts} drafts, {draft_tokens} draft tokens: vLLM writes no rates then")
        return None
    if accepted > draft_tokens:
        problems.append(f"{run.file}: {accepted} accepted tokens exceed {draft_tokens} draft tokens")
    if not _close(rate_pct, 100.0 * accepted / draft_tokens):
        problems.append(
            f"{run.file}: spec_decode_acceptance_rate {rate_pct!r} is not accepted/draft_tokens in percent "
            f"({accepted}/{draft_tokens} x 100 = {100.0 * accepted / draft_tokens:.4f})"
        )
    exact_length = figures.acceptance_length(accepted, drafts)
    if not _close(length, exact_length):
        problems.append(
            f"{run.file}: spec_decode_acceptance_length {length!r} is not 1 + accepted/drafts "
            f"(1 + {accepted}/{drafts} = {exact_length:.4f})"
        )
    counts = [v * drafts for v in per_pos]
    whole = all(abs(c - round(c)) < 1e-6 for c in counts)
    if whole and per_pos and sum(round(c) for c in counts) != accepted:
        problems.append(
            f"{run.file}: per-position rates x {drafts} drafts sum to {sum(round(c) for c in counts)} "
            f"accepted tokens, not {accepted}"
        )
    acc: dict[str, Any] = {"drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted}
    if whole and per_pos:
        acc["accepted_per_position"] = [round(c) for c in counts]
    acc["acceptance_length"] = float(length)
    acc["acceptance_rate"] = rate_pct / 100.0
    acc["per_position"] = [float(v) for v in per_pos]
    return acc


def _workload(runs: Sequence[BenchRun], name: str | None, kind: str | None, problems: list[str]) -> dict[str, Any]:
    """The one workload of the import: named by the caller, else the files' metadata, else 'bench'."""
    first = runs[0]
    stated = first.meta("workload")
    if name is not None and stated is not None and name != stated:
        problems.append(f"{first.file}: records workload {stated!r}, but {name!r} was given")
    chosen = name or stated or "bench"
    if not _NAME.match(chosen):
        problems.append(f"workload name {chosen!r} is not a ledger name (lower case, digits, . _ -)")
    stated_kind = first.meta("workload_kind")
    if kind is not None and stated_kind is not None and kind != stated_kind:
        problems.append(f"{first.file}: records workload_kind {stated_kind!r}, but {kind!r} was given")
    chosen_kind = kind or stated_kind or (chosen if chosen in _WORKLOAD_KINDS else "other")
    if chosen_kind not in _WORKLOAD_KINDS:
        problems.append(f"workload kind {chosen_kind!r} is not one of {', '.join(_WORKLOAD_KINDS)}")
    entry: dict[str, Any] = {"name": chosen, "kind": chosen_kind}
    dataset_path = first.meta("dataset_path")
    if dataset_path and not Path(dataset_path).is_absolute():
        entry["fixture"] = dataset_path
    prompts = {run.data.get("num_prompts") for run in runs}
    if len(prompts) == 1 and isinstance(next(iter(prompts)), int):
        entry["num_prompts"] = next(iter(prompts))
    dataset = ", ".join(f"{k} {first.meta(k)}" for k in ("dataset_name", "dataset_path") if first.meta(k))
    entry["description"] = "vllm bench serve" + (f" ({dataset})" if dataset else " (dataset not recorded)")
    return entry


def _provenance(runs: Sequence[BenchRun], engine: Mapping[str, str] | None, accelerator: Mapping[str, Any] | None,
                command: str | None, problems: list[str]) -> dict[str, Any]:
    """Engine, accelerator and date from the files (metadata), filled in by the caller where they are silent."""
    first = runs[0]
    prov: dict[str, Any] = {}
    engine_out = _reconcile(first, "engine", {"name": "engine", "version": "engine_version"}, engine, problems)
    if "name" not in engine_out or "version" not in engine_out:
        problems.append(
            f"{first.file}: the engine (name and version) is not recorded; give it, or run bench serve with "
            "--metadata engine=vllm engine_version=X.Y.Z"
        )
    else:
        prov["engine"] = engine_out
    if first.meta("torch_version"):
        prov["torch_version"] = first.meta("torch_version")
    accel = _reconcile(first, "accelerator",
                       {"kind": "accelerator", "name": "accelerator_name", "count": "accelerator_count"},
                       accelerator, problems)
    if "kind" not in accel:
        problems.append(
            f"{first.file}: the accelerator is not recorded; give its kind (cpu, cuda, ...), or run bench serve "
            "with --metadata accelerator=cuda accelerator_name=..."
        )
    else:
        prov["accelerator"] = accel
    if first.meta("host"):
        prov["host"] = first.meta("host")
    dates = sorted(run.date for run in runs if run.date)
    prov["date"] = dates[0]
    prov["command"] = IMPORT_PREFIX + ", ".join(run.file for run in runs) + (f"; by: {command}" if command else "")
    return prov


def _reconcile(run: BenchRun, what: str, meta_keys: Mapping[str, str], given: Mapping[str, Any] | None,
               problems: list[str]) -> dict[str, Any]:
    """Fields the file's metadata records, else the caller's; a contradiction between them is a problem.

    Why both: `bench serve --metadata` is the run's own word, the caller's flags fill its silences,
    and neither may quietly overrule the other.
    """
    out: dict[str, Any] = {}
    for key, meta_key in meta_keys.items():
        stated: Any = run.meta(meta_key)
        if key == "count" and stated is not None:
            if not _METADATA_COUNT.fullmatch(stated):
                problems.append(f"{run.file}: metadata {meta_key} {stated!r} is not a count written in ASCII digits")
                continue
            stated = int(stated)
        value = (given or {}).get(key)
        if value is not None and stated is not None and value != stated:
            problems.append(f"{run.file}: records {what} {key} {stated!r}, but {value!r} was given")
        if stated is not None or value is not None:
            out[key] = stated if stated is not None else value
    return out


# --------------------------------------------------------------------------------------------
# the ledger point
# --------------------------------------------------------------------------------------------


def _point(workload: str, key: PointKey, by_arm: Mapping[str, BenchRun], baseline: str) -> dict[str, Any]:
    """One point, rounded as record mode rounds (the ledger's default rounding), multiplier from exact figures."""
    temperature, concurrency = key
    r = DEFAULT_ROUNDING
    base = by_arm.get(baseline)
    arms: dict[str, Any] = {}
    for name, run in _ordered(by_arm, baseline):
        tps = float(run.data["output_throughput"])
        rounded = round(tps, r["output_tokens_per_s"])
        result: dict[str, Any] = {
            "output_tokens_per_s": {"repeats": [rounded], "median": rounded, "min": rounded, "max": rounded},
            "requests": int(run.data["completed"]),
        }
        if isinstance(run.data.get("total_output_tokens"), int):
            result["output_tokens"] = run.data["total_output_tokens"]
        result["duration_s"] = round(float(run.data["duration"]), 3)
        if name != baseline:
            base_tps = float(base.data["output_throughput"]) if base is not None else 0.0
            if base_tps > 0:
                result["multiplier"] = round(tps / base_tps, r["multiplier"])
            acc = _acceptance(run, [])
            if acc is not None:
                acc["acceptance_length"] = round(acc["acceptance_length"], r["acceptance_length"])
                acc["acceptance_rate"] = round(acc["acceptance_rate"], r["acceptance_rate"])
                acc["per_position"] = [round(v, r["acceptance_rate"]) for v in acc["per_position"]]
                result["acceptance"] = acc
                result["speculative_tokens_per_step"] = round(acc["draft_tokens"] / acc["drafts"], 3)
        arms[name] = result
    sources = "; ".join(f"{name}: {run.file} (run {run.date})" for name, run in _ordered(by_arm, baseline))
    return {"workload": workload, "temperature": float(temperature), "concurrency": int(concurrency),
            "arms": arms, "note": f"vllm bench serve results: {sources}"}


def _ordered(by_arm: Mapping[str, BenchRun], baseline: str) -> list[tuple[str, BenchRun]]:
    """(arm, run) with the baseline first, then by name."""
    return [(n, by_arm[n]) for n in sorted(by_arm, key=lambda n: (n != baseline, n))]


def _file_note(run: BenchRun) -> str:
    d = run.data
    return (
        f"{run.file}: arm {run.arm}, concurrency {run.concurrency}, temperature {run.temperature:g}, "
        f"run {run.date} (local time of the bench machine; vLLM records no zone), backend {d.get('backend')}, "
        f"{d.get('completed')} requests, {d.get('total_input_tokens')} input / {d.get('total_output_tokens')} "
        "output tokens"
    )
