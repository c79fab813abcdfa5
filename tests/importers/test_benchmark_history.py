"""Saved pytest-benchmark runs renamed from the old test ids (``copy-T0-c1``) to the point grammar (``copy:0:1``).

The input is a real run: the benchmark JSON an H200 recording wrote on 2026-12-04 (reports/evidence), whose 24
rows carry the old ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import ROOT

from specledger.cli import main
from specledger.importers.benchmark_history import BenchmarkHistoryError, rename_history, renamed_id
from specledger.ledger.selection import point_test_id

REAL_RUN = ROOT / "reports/evidence/2026-12-04-h200-qwen-bf16-free-form/run/benchmark-record.json"
NAME = st.from_regex(r"[a-z][a-z0-9.]*(-[a-z0-9.]+){0,3}", fullmatch=True)


@given(ledger=NAME, arm=NAME, workload=NAME, temperature=st.floats(0, 2, allow_subnormal=False),
       concurrency=st.integers(1, 4096))
def test_an_old_id_renames_to_the_id_the_suite_gives_that_point_now(ledger, arm, workload, temperature, concurrency):
    old = f"{ledger}-{arm}-{workload}-T{temperature:g}-c{concurrency}"
    assert renamed_id(old) == point_test_id(ledger, arm, (workload, temperature, concurrency))
    assert renamed_id(f"test_point[{old}]") == f"test_point[{renamed_id(old)}]"
    assert renamed_id(renamed_id(old)) == renamed_id(old)


def _history(tmp_path: Path) -> Path:
    folder = tmp_path / ".benchmarks" / "Linux-CPython-3.12-64bit"
    folder.mkdir(parents=True)
    shutil.copy(REAL_RUN, folder / "0001_record.json")
    return folder / "0001_record.json"


def test_a_real_run_is_renamed_only_with_write_and_its_figures_stay(tmp_path, capsys):
    run = _history(tmp_path)
    before = run.read_bytes()
    assert main(["rename-benchmark-ids", str(tmp_path / ".benchmarks")]) == 0
    assert run.read_bytes() == before, "a dry run wrote"
    assert "would rename 96 id field(s)" in capsys.readouterr().out  # 24 rows x name, fullname, param, params

    assert main(["rename-benchmark-ids", str(tmp_path / ".benchmarks"), "--write"]) == 0
    old, new = json.loads(before), json.loads(run.read_text())
    assert len(new["benchmarks"]) == 24
    for was, now in zip(old["benchmarks"], new["benchmarks"], strict=True):
        assert now["param"] == renamed_id(was["param"]) != was["param"]
        assert now["fullname"].endswith(f"[{now['param']}]") and now["name"].endswith(f"[{now['param']}]")
        assert f"({now['param']})" in now["params"]["ledger_point"]
        assert (now["stats"], now["extra_info"], now["group"]) == (was["stats"], was["extra_info"], was["group"])
    assert not [r for r in rename_history([run], write=False) if r.fields], "a second pass found more to rename"


def test_a_file_that_is_no_benchmark_run_is_named_and_nothing_is_written(tmp_path, capsys):
    run = _history(tmp_path)
    before = run.read_bytes()
    stray = run.parent / "0002_other.json"
    stray.write_text(json.dumps({"benchmarks": {"not": "a list"}}))
    assert main(["rename-benchmark-ids", str(tmp_path / ".benchmarks"), "--write"]) == 1
    err = capsys.readouterr().err
    assert str(stray) in err and "$.benchmarks" in err
    assert run.read_bytes() == before, "a good file was written although another one was refused"
    with pytest.raises(BenchmarkHistoryError, match=r"\$\.benchmarks\[0\]"):
        stray.write_text(json.dumps({"benchmarks": ["row"]}))
        rename_history([stray], write=True)
