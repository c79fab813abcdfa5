"""`specledger migrate`: version 1 ledgers become version 2 with every figure as it was, points marked protocol 1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from repo_paths import ROOT, SMALL

import specledger.ledger as ledger_package
from specledger.cli import main
from specledger.ledger import LedgerError, dump_ledger, load_ledger, parse_ledger
from specledger.ledger.migrate import migrate_data, migrate_file, replan_data
from specledger.ledger.model import DEFAULT_PROTOCOL, has_figures

COMMITTED = sorted([*(ROOT / "ledgers").glob("*.json"), *(ROOT / "tests" / "data").glob("*.json")])


def as_v1(text: str) -> str:
    """A committed version 2 ledger as version 1 wrote it: what `migrate` was given before the repository moved.

    Only a ledger that `migrate` could have produced has one (no v2-only field besides protocol_version 1).
    """
    data = json.loads(text)
    data["schema_version"] = 1
    for point in data["points"]:
        if point.pop("protocol_version", 1) != 1:
            pytest.skip("has protocol v3 points: recorded as version 2, never migrated")
    v1 = dump_ledger(data)
    try:
        parse_ledger(v1, "as-v1.json")
    except LedgerError:
        pytest.skip("has version 2 fields: recorded as version 2, never migrated")
    return v1


def literals(text: str) -> Any:
    """The JSON with every number kept as its literal text, so equal means byte-identical, not merely equal."""
    return json.loads(text, parse_float=lambda s: ("float", s), parse_int=lambda s: ("int", s))


def numbers(value: Any, path: tuple = ()) -> dict[tuple, tuple[str, str]]:
    """Every number leaf (as literals() keeps it) by its path, apart from the two the migration sets."""
    if isinstance(value, tuple):
        return {} if path[-1:] in (("schema_version",), ("protocol_version",)) else {path: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return {k: v for key, child in items for k, v in numbers(child, (*path, key)).items()}


@pytest.fixture
def v1_small(tmp_path) -> Path:
    """The small ledger as a version 1 file."""
    path = tmp_path / "in" / "small.json"
    path.parent.mkdir()
    path.write_text(as_v1(SMALL.read_text()))
    return path


@pytest.fixture
def v1_pair(v1_small) -> list[Path]:
    other = v1_small.parent / "other.json"
    data = json.loads(v1_small.read_text())
    data["id"] = "other"
    other.write_text(dump_ledger(data))
    return [v1_small, other]


# -- the repository's ledgers ---------------------------------------------------------------------


def test_every_committed_ledger_is_version_2():
    assert len(COMMITTED) >= 17
    assert {load_ledger(p).schema_version for p in COMMITTED} == {2}


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_round_trip_of_committed_ledger(tmp_path, path):
    """v1 text -> migrate -> the committed text, byte for byte; every number literal unchanged; points marked 1."""
    committed = path.read_text()
    v1 = tmp_path / path.name
    v1.write_text(as_v1(committed))
    migration = migrate_file(v1)
    text = migration.text()
    ledger = parse_ledger(text, str(v1))
    assert ledger.schema_version == 2
    assert text == committed
    assert numbers(literals(text)) == numbers(literals(v1.read_text()))
    assert all(p["protocol_version"] == 1 for p in ledger.points if has_figures(p))
    assert migration.points_marked == sum(1 for p in ledger.points if has_figures(p))
    old_lines, new_lines = v1.read_text().splitlines(), text.splitlines()
    assert [line for line in new_lines if line.strip() != '"protocol_version": 1,'] == [
        line.replace('"schema_version": 1,', '"schema_version": 2,') for line in old_lines
    ]


# -- the library --------------------------------------------------------------------------------


def test_migrate_data_keeps_key_order_and_leaves_its_input(v1_small):
    data = json.loads(v1_small.read_text())
    before = json.loads(v1_small.read_text())
    out = migrate_data(data)
    assert data == before
    assert list(out) == list(data) and out["schema_version"] == 2
    for old, new in zip(data["points"], out["points"], strict=True):
        keys = list(old)
        assert list(new) == [*keys[: keys.index("concurrency") + 1], "protocol_version", *keys[keys.index("arms"):]]


def test_points_without_figures_are_not_marked(v1_small):
    data = json.loads(v1_small.read_text())
    data["points"][1]["arms"] = {"baseline": {}, "eagle": {}}
    out = migrate_data(data)
    assert "protocol_version" not in out["points"][1]
    assert [p.get("protocol_version") for p in out["points"]] == [1, None, 1]
    parse_ledger(dump_ledger(out), "x.json")


def test_migrate_data_refuses_other_versions():
    with pytest.raises(ValueError, match="schema_version 1"):
        migrate_data({"schema_version": 2, "points": []})


def test_already_v2_is_left_alone():
    migration = migrate_file(SMALL)
    assert migration.already_current and migration.data is None and migration.points_marked == 0
    assert migration.text() == SMALL.read_text()


def test_migrate_file_raises_for_a_ledger_that_does_not_load(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 1}')
    with pytest.raises(LedgerError):
        migrate_file(path)


# -- the command line -----------------------------------------------------------------------------


def test_stdout_mode_prints_the_migrated_ledger(v1_small, capsys):
    before = v1_small.read_bytes()
    assert main(["migrate", str(v1_small)]) == 0
    out = capsys.readouterr().out
    assert out == SMALL.read_text()
    assert v1_small.read_bytes() == before


def test_stdout_mode_for_a_v2_ledger(capsys):
    assert main(["migrate", str(SMALL)]) == 0
    captured = capsys.readouterr()
    assert captured.out == SMALL.read_text()
    assert "already v2" in captured.err


def test_stdout_mode_takes_one_ledger(v1_pair, capsys):
    assert main(["migrate", *map(str, v1_pair)]) == 2
    assert "--in-place or -o DIR" in capsys.readouterr().err


def test_in_place_and_idempotence(v1_pair, capsys):
    assert main(["migrate", "--in-place", str(v1_pair[0].parent)]) == 0
    out = capsys.readouterr().out
    assert all(f"{p}: migrated to v2 (3 point(s) marked protocol_version 1)" in out for p in v1_pair)
    assert v1_pair[0].read_text() == SMALL.read_text()
    assert all(load_ledger(p).schema_version == 2 for p in v1_pair)
    texts, stats = [p.read_bytes() for p in v1_pair], [p.stat().st_mtime_ns for p in v1_pair]
    assert main(["migrate", "--in-place", *map(str, v1_pair)]) == 0
    assert capsys.readouterr().out.count("already v2") == 2
    assert [p.read_bytes() for p in v1_pair] == texts
    assert [p.stat().st_mtime_ns for p in v1_pair] == stats  # not even rewritten
    assert sorted(p.name for p in v1_pair[0].parent.iterdir()) == ["other.json", "small.json"]


def test_out_dir(v1_pair, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    before = [p.read_bytes() for p in v1_pair]
    assert main(["migrate", *map(str, v1_pair), "-o", str(out_dir)]) == 0
    assert f"{v1_pair[0]} -> {out_dir / 'small.json'}: migrated to v2" in capsys.readouterr().out
    assert (out_dir / "small.json").read_text() == SMALL.read_text()
    assert load_ledger(out_dir / "other.json").id == "other"
    assert [p.read_bytes() for p in v1_pair] == before  # the sources stay as they were


def test_out_dir_refuses_to_overwrite_and_creates_nothing_half_way(v1_pair, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "other.json").write_text("mine")
    assert main(["migrate", *map(str, v1_pair), "-o", str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert "other.json" in err and "--force" in err
    assert sorted(p.name for p in out_dir.iterdir()) == ["other.json"]  # small.json not written either
    assert (out_dir / "other.json").read_text() == "mine"
    assert main(["migrate", *map(str, v1_pair), "-o", str(out_dir), "--force"]) == 0
    assert load_ledger(out_dir / "other.json").id == "other"
    assert sorted(p.name for p in out_dir.iterdir()) == ["other.json", "small.json"]


def test_out_dir_rolls_back_when_a_write_fails(v1_pair, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    real = ledger_package.write_ledger
    calls = []

    def flaky(path, data, *, overwrite):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, data, overwrite=overwrite)

    monkeypatch.setattr(ledger_package, "write_ledger", flaky)  # where cli looks it up
    assert main(["migrate", *map(str, v1_pair), "-o", str(out_dir)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert list(out_dir.iterdir()) == []


def test_out_dir_must_exist(v1_small, tmp_path, capsys):
    assert main(["migrate", str(v1_small), "-o", str(tmp_path / "missing")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
    assert main(["migrate", str(v1_small), "-o", str(v1_small)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_out_dir_with_two_ledgers_of_one_name(v1_small, tmp_path, capsys):
    twin = tmp_path / "twin" / "small.json"
    twin.parent.mkdir()
    twin.write_text(v1_small.read_text())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert main(["migrate", str(v1_small), str(twin), "-o", str(out_dir)]) == 2
    assert "small.json" in capsys.readouterr().err
    assert list(out_dir.iterdir()) == []


def test_out_dir_skips_v2_ledgers(tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    assert main(["migrate", str(SMALL), "-o", str(out_dir)]) == 0
    assert "already v2 (not written)" in capsys.readouterr().out
    assert list(out_dir.iterdir()) == []


def test_a_ledger_that_does_not_load_stops_every_write(v1_pair, capsys):
    bad = v1_pair[0].parent / "bad.json"
    data = json.loads(v1_pair[0].read_text())
    data["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -1
    bad.write_text(json.dumps(data))
    before = {p: p.read_bytes() for p in [*v1_pair, bad]}
    assert main(["migrate", "--in-place", str(v1_pair[0].parent)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: $.points[0].arms.baseline.output_tokens_per_s.median" in err
    assert "nothing written" in err
    assert {p: p.read_bytes() for p in before} == before


def test_unknown_version_is_a_problem(tmp_path, capsys):
    path = tmp_path / "future.json"
    path.write_text(json.dumps({"schema_version": 9}))
    assert main(["migrate", "--in-place", str(path)]) == 1
    assert "this specledger reads versions 1, 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["migrate"],
        ["migrate", "--in-place", "-o", "x", "ledger.json"],
        ["migrate", "--force", "ledger.json"],
        ["migrate", "--in-place", "--force", "ledger.json"],
        ["migrate", "--in-place", "no/such/ledger.json"],
    ],
)
def test_usage_errors(argv, tmp_path, monkeypatch, capsys):
    (tmp_path / "ledger.json").write_text(SMALL.read_text())
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err


BURST = ROOT / "tests" / "data" / "h200-smollm2-copy-burst.json"


def test_replan_keeps_the_conditions_and_the_gpu_and_drops_every_figure():
    source = load_ledger(BURST)
    data = replan_data(source.data, {"window": {"min_s": 2.5, "sized_by": "each arm"}})
    planned = parse_ledger(dump_ledger(data), "planned.json")
    assert planned.status == "planned" and planned.points == [] and planned.is_gpu()
    assert [a["name"] for a in planned.arms] == [a["name"] for a in source.arms]
    assert not any(k in a for a in planned.arms for k in ("effective_config", "kv_cache", "sessions"))
    assert list(planned.grid()) == list(source.grid())
    assert planned.data["protocol"]["window"] == {"min_s": 2.5, "min_rounds": 4, "sized_by": "each arm"}
    assert planned.data["protocol"]["repeats"] == DEFAULT_PROTOCOL["repeats"]
    assert "repeats" not in planned.data["sweep"] and planned.tolerances == source.tolerances
    assert set(planned.data["provenance"]) == {"accelerator"}
    assert source.points  # the input is left as it was
    with pytest.raises(ValueError, match="no setting 'windw'"):
        replan_data(source.data, {"windw": {}})
    # a v3 source's between-start spread is pooled from its own points: the planned ledger has none of them
    measured = load_ledger(ROOT / "ledgers" / "h200-qwen2.5-coder-1.5b.json")
    assert measured.data["start_spread"] and "start_spread" not in replan_data(measured.data)
    # a v3 source's protocol is the base of the replan (its windows and repeats), under --protocol's overrides
    assert replan_data(measured.data)["protocol"] == measured.data["protocol"]
    mine = replan_data(measured.data, {"repeats": {"min": 8}})["protocol"]
    assert mine["repeats"] == {"min": 8, "max": 10} and mine["window"] == measured.data["protocol"]["window"]
    # the card's memory stays with the card (the arms are checked against it), the run's driver does not
    h100 = load_ledger(ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b.json").data
    again = replan_data({**h100, "provenance": {"accelerator": {**h100["provenance"]["accelerator"], "driver": "580"}}})
    assert again["provenance"]["accelerator"] == {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1,
                                                  "memory_gib": 79.65}


def test_replan_cli_writes_once_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "planned.json"
    assert main(["replan", str(BURST), "-o", str(out), "--protocol", '{"repeats": {"min": 6, "max": 10}}']) == 0
    assert "12 grid points" in capsys.readouterr().out
    assert load_ledger(out).data["protocol"]["repeats"] == {"min": 6, "max": 10}
    before = out.read_bytes()
    assert main(["replan", str(BURST), "-o", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["replan", str(BURST), "-o", str(tmp_path / "x.json"), "--protocol", "[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err


def test_replan_of_a_ledger_that_does_not_load_or_a_protocol_the_schema_refuses(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    data = json.loads(BURST.read_text())
    data["provenance"]["date"] = "yesterday"
    bad.write_text(json.dumps(data))
    assert main(["replan", str(bad), "-o", str(tmp_path / "p.json")]) == 1
    err = capsys.readouterr().err
    assert "$.provenance.date" in err and "Traceback" not in err
    out = tmp_path / "q.json"
    assert main(["replan", str(BURST), "-o", str(out), "--protocol", '{"window": {"min_s": -1}}']) == 1
    assert "$.protocol.window.min_s" in capsys.readouterr().err and not out.exists()
