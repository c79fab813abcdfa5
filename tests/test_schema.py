"""The ledger format: every malformed ledger is rejected with its file and the JSON path of the fault."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from specledger import schema
from specledger.schema import (
    SCHEMA_VERSION,
    Ledger,
    LedgerError,
    Problem,
    dump_ledger,
    iter_ledger_paths,
    load_ledger,
    load_schema,
    parse_ledger,
    write_ledger,
)

DATA = Path(__file__).parent / "data"
SMALL = DATA / "measured-small.json"
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
    assert SCHEMA_VERSION == 1
    assert json.loads(schema.SCHEMA_PATH.read_text())["$schema"].endswith("2020-12/schema")


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


def test_unknown_schema_version(tmp_path, small):
    small["schema_version"] = 2
    small["colour"] = "red"  # checked before the schema: the version message comes alone
    (problem,) = problems_of(write(tmp_path, json.dumps(small)))
    assert problem.json_path == "$.schema_version"
    assert problem.message == "unknown schema_version 2; this specledger reads version 1"


def test_missing_schema_version(tmp_path, small):
    del small["schema_version"]
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$")
    assert "schema_version" in problem.message


def test_unknown_field(tmp_path, small):
    small["points"][0]["colour"] = "red"
    problem = single(problems_of(write(tmp_path, json.dumps(small))), "$.points[0].colour")
    assert "unknown field 'colour'" in problem.message


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
    assert text.startswith('{\n  "schema_version": 1,\n  "id": "test-small",')
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

    monkeypatch.setattr(schema, "dump_ledger", broken)
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

    monkeypatch.setattr(schema.os, "replace", broken)
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

    monkeypatch.setattr(schema.os, "fsync", broken)
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
