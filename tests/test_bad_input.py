"""Bad input (issue 15): each kind is rejected in one line naming the file (and the JSON path),
with exit 1 and no traceback, quickly, and without stopping the check of the other files."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_paths import DATA, ROOT, SMALL

from specledger.cli import main
from specledger.ledger.safe_read import MAX_INPUT_BYTES, MAX_JSON_DEPTH

BENCH = DATA / "bench"
#: A claim that holds against SMALL (id test-small), so a report's verdict shows its ledgers still load.
HOLDS = "eagle is 1.8x <!-- claim: test-small eagle copy T=0 c=1 multiplier = 1.8 -->\n"


def _small() -> dict:
    return json.loads(SMALL.read_text())


def _no_traceback(*texts: str) -> None:
    assert not any("Traceback" in t for t in texts)


def _ledgers(tmp_path: Path, bad_text: str) -> tuple[Path, Path, Path]:
    """A folder holding a bad ledger (a.json) and a good one after it (b.json)."""
    folder = tmp_path / "ledgers"
    folder.mkdir()
    bad = folder / "a.json"
    bad.write_text(bad_text)
    good = Path(shutil.copy(SMALL, folder / "b.json"))
    return folder, bad, good


# 1 -------------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.get_int_max_str_digits() == 0, reason="int-str conversion limit disabled")
def test_an_integer_of_thousands_of_digits_is_one_problem_at_its_path(tmp_path, capsys):
    digits = sys.get_int_max_str_digits() + 700
    data = _small()
    data["points"][0]["concurrency"] = "BIG"
    text = json.dumps(data).replace('"BIG"', "9" * digits)
    folder, bad, good = _ledgers(tmp_path, text)
    assert main(["validate", str(bad)]) == 1
    out, err = capsys.readouterr()
    limit = sys.get_int_max_str_digits()
    assert out.splitlines()[0] == (
        f"{bad}: $.points[0].concurrency: an integer of {digits:,} digits; at most {limit:,} are read"
    )
    assert main(["validate", str(folder)]) == 1  # DIR mode: the later file is still checked
    out, err = capsys.readouterr()
    assert out.splitlines()[1].startswith(f"{good}: ok (test-small")
    assert out.splitlines()[-1] == "1 invalid ledger(s)"
    _no_traceback(out, err)


# 2 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [300, 100_000])  # below and far above Python's recursion limit
def test_a_deeply_nested_ledger_does_not_break_validate_or_the_audit_of_the_others(tmp_path, capsys, depth):
    folder, bad, good = _ledgers(tmp_path, '{"id": "deep", "x": ' + "[" * depth + "]" * depth + "}")
    assert main(["validate", str(folder)]) == 1
    out, err = capsys.readouterr()
    first = out.splitlines()[0]
    assert first.startswith(f"{bad}: $") and first.endswith(f"nested deeper than {MAX_JSON_DEPTH} levels")
    assert out.splitlines()[1].startswith(f"{good}: ok")
    _no_traceback(out, err)

    report = tmp_path / "r.md"
    report.write_text(HOLDS)
    assert main(["audit-report", str(report), "--ledgers", str(folder)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith(f"warning: ledger does not load: {bad}: $")
    assert lines[-1] == "1 claims: 1 hold, 0 fail, 0 unresolved; 0 unaudited numbers"
    _no_traceback(out, err)


def test_nesting_up_to_the_limit_still_parses(tmp_path):
    """The depth limit refuses only what is deeper: a free-form field nested MAX_JSON_DEPTH deep loads."""
    data = _small()
    inner = MAX_JSON_DEPTH - 3  # $ -> arms -> [0] -> engine_args
    data["arms"][0]["engine_args"] = {"nested": json.loads("[" * (inner - 1) + "]" * (inner - 1))}
    (tmp_path / "l.json").write_text(json.dumps(data))
    assert main(["validate", str(tmp_path / "l.json")]) == 0
    data["arms"][0]["engine_args"] = {"nested": json.loads("[" * inner + "]" * inner)}
    (tmp_path / "l.json").write_text(json.dumps(data))
    assert main(["validate", str(tmp_path / "l.json")]) == 1


# 3 -------------------------------------------------------------------------------------------


def test_a_report_that_is_not_utf8_fails_alone(tmp_path, capsys):
    bad = tmp_path / "bad.md"
    bad.write_bytes(b"ok\ncaf\xe9 1.8x\n")
    good = tmp_path / "good.md"
    good.write_text(HOLDS)
    assert main(["audit-report", str(bad), str(good), "--ledgers", str(SMALL)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"error: {bad}: not UTF-8 text: invalid continuation byte at byte 6 (line 2)"
    assert out.splitlines()[-1] == "1 claims: 1 hold, 0 fail, 0 unresolved; 0 unaudited numbers"
    _no_traceback(out, err)


# 4 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("temperature", "٠.٥", "metadata temperature '٠.٥' is not a number written in ASCII digits"),
        ("accelerator_count", "٨", "metadata accelerator_count '٨' is not a count written in ASCII digits"),
        ("accelerator_count", "²", "metadata accelerator_count '²' is not a count written in ASCII digits"),
        ("max_concurrency", "٤", "max_concurrency is '٤', not a whole number"),
    ],
)
def test_non_ascii_digits_in_a_bench_result_are_refused(tmp_path, capsys, field, value, says):
    """float("٠.٥") is 0.5 and "²".isdigit() is true: both must be refused, not read (or crash int())."""
    files = []
    for name in ("baseline-c1.json", "ngram-c1.json"):
        data = json.loads((BENCH / name).read_text())
        data[field] = value
        files.append(tmp_path / name)
        files[-1].write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    out_file = tmp_path / "out.json"
    assert main(["import-bench", *map(str, files), "--id", "x", "-o", str(out_file)]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"{files[0]}: {says}"
    assert not out_file.exists()
    _no_traceback(out, err)


def test_a_non_ascii_digit_as_a_json_number_is_invalid_json(tmp_path, capsys):
    text = (BENCH / "baseline-c1.json").read_text().replace('"max_concurrency": 1', '"max_concurrency": ١')
    bad = tmp_path / "b.json"
    bad.write_text(text, encoding="utf-8")
    assert main(["import-bench", str(bad), "--id", "x", "-o", str(tmp_path / "out.json")]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"{bad}: $: invalid JSON at line 1, column ")
    _no_traceback(out, err)


# 5 -------------------------------------------------------------------------------------------


def test_import_bench_out_into_a_missing_folder_or_onto_a_folder(tmp_path, capsys):
    """-o is a file in an existing folder (bad input otherwise, exit 1), checked before anything is read."""
    base = ["import-bench", *(str(BENCH / f"{arm}-c1.json") for arm in ("baseline", "ngram")), "--id", "x"]
    missing = tmp_path / "no" / "such" / "out.json"
    assert main([*base, "-o", str(missing)]) == 1
    out, err = capsys.readouterr()
    assert err == (
        f"specledger import-bench: error: -o {missing}: {missing.parent} no such directory (create it first)\n"
    )
    assert not (tmp_path / "no").exists()
    folder = tmp_path / "existing"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    assert main([*base, "-o", str(folder), "--force"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"specledger import-bench: error: -o {folder}: is a directory, expected a ledger file name")
    assert len(err.splitlines()) == 1
    assert [p.name for p in folder.iterdir()] == ["keep.txt"]


# 6 -------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child, so that a regression that blocks on a FIFO or reads /dev/zero times out."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "specledger.cli", *args], capture_output=True, text=True, timeout=30, env=env, cwd=ROOT
    )


COMMANDS = {
    "validate": lambda path, tmp: ["validate", path],
    "audit": lambda path, tmp: ["audit", path],
    "audit-report": lambda path, tmp: ["audit-report", path, "--ledgers", str(SMALL)],
    "import-bench": lambda path, tmp: ["import-bench", path, "--id", "x", "-o", str(tmp / "out.json")],
    "pool-starts": lambda path, tmp: ["pool-starts", path, "-o", str(tmp / "pooled.json")],
    "compare": lambda path, tmp: ["compare", str(SMALL), path],
    "estimate": lambda path, tmp: ["estimate", path],
}


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs FIFOs and /dev/zero")
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_fifo_or_a_link_to_dev_zero_is_not_a_regular_file(tmp_path, name):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a character device")):
        started = time.monotonic()
        result = _cli(*COMMANDS[name](str(path), tmp_path))
        assert time.monotonic() - started < 20
        assert result.returncode == 1, result.stderr
        said = result.stdout + result.stderr
        assert str(path) in said and f"not a regular file ({kind})" in said  # audit names the file a line above
        assert len(said.splitlines()) <= 3
        _no_traceback(said)


def test_a_file_over_the_size_limit_is_too_large(tmp_path, capsys):
    big = tmp_path / "big.json"
    with big.open("wb") as handle:  # sparse: nothing is written, and nothing should be read
        handle.truncate(MAX_INPUT_BYTES + 1)
    assert main(["validate", str(big)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == (
        f"{big}: $: too large: {MAX_INPUT_BYTES + 1:,} bytes; a ledger may be at most "
        f"{MAX_INPUT_BYTES // 2**20} MiB (specledger.ledger.safe_read.MAX_INPUT_BYTES)"
    )


# 7 -------------------------------------------------------------------------------------------


def test_thousands_of_duplicated_points_are_reported_once_with_a_count_and_quickly(tmp_path, capsys):
    data = _small()
    data["points"] += [copy.deepcopy(data["points"][0]) for _ in range(10_000)]
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data))
    started = time.monotonic()
    assert main(["validate", str(path)]) == 1
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{path}: $.points[3]: duplicate point (workload 'copy', temperature 0.0, concurrency 1): "
        "$.points[0] and 10,000 later points ($.points[3], $.points[4], $.points[5], ...) have the same conditions",
        "1 invalid ledger(s)",
    ]
    assert elapsed < 10  # each copy is schema-checked once, not 10,000 times (that took over 15 s)


def test_a_schema_error_in_copied_points_is_still_reported(tmp_path, capsys):
    data = _small()
    data["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -1
    data["points"] += [copy.deepcopy(data["points"][0]) for _ in range(3)]
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: $.points[0].arms.baseline.output_tokens_per_s.median: " in out
    assert "$.points[0] and 3 later points ($.points[3], $.points[4], $.points[5])" in out


def test_many_duplicated_conditions_are_capped(tmp_path, capsys):
    data = _small()
    for c in range(100, 115):  # 15 conditions, each twice
        for _ in range(2):
            point = copy.deepcopy(data["points"][0])
            point["concurrency"] = c
            data["points"].append(point)
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data))
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12 and all("duplicate point" in line for line in lines[:10])
    assert lines[10] == f"{path}: $.points: and 5 more duplicated conditions (5 duplicate points in all)"


# 8 -------------------------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_a_report_that_links_to_a_device_is_not_a_regular_file(tmp_path, capsys):
    report = tmp_path / "r.md"
    report.symlink_to("/dev/null")
    assert main(["audit-report", str(report), "--ledgers", str(SMALL)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == (
        f"error: {report}: not a regular file (a character device); a report must be a plain file"
    )
    assert "no such report" not in out + err
    (tmp_path / "gone.md").symlink_to(tmp_path / "nothing-here.md")  # a dangling link is still "no such"
    assert main(["audit-report", str(tmp_path / "gone.md"), "--ledgers", str(SMALL)]) == 2
    assert "no such report" in capsys.readouterr().err


# accepted silently before ---------------------------------------------------------------------


def _eagle(d: dict) -> dict:
    return d["points"][0]["arms"]["eagle"]


def _baseline(d: dict) -> dict:
    return d["points"][0]["arms"]["baseline"]


def _set(d: dict, where: str, value) -> None:
    *parents, last = where.split(".")
    target = d
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value


SILENT = {
    "a baseline that states a multiplier": (
        lambda d: _set(d, "points.0.arms.baseline.multiplier", 1.0),
        "$.points[0].arms.baseline.multiplier: arm 'baseline' is a baseline: it drafts nothing"),
    "a baseline that carries draft counters": (
        lambda d: _set(d, "points.0.arms.baseline.acceptance", copy.deepcopy(_eagle(d)["acceptance"])),
        "$.points[0].arms.baseline.acceptance: arm 'baseline' is a baseline"),
    "a provenance date that is not a date": (
        lambda d: _set(d, "provenance.date", "last Tuesday"),
        "$.provenance.date: 'last Tuesday' is not an ISO 8601 date"),
    "a measured ledger with no points": (
        lambda d: _set(d, "points", []), "$.points: a measured ledger holds no points"),
    "a measured ledger with points but no repeats": (
        lambda d: [r["output_tokens_per_s"].pop("repeats", None) for p in d["points"] for r in p["arms"].values()],
        "$.points[0]: a measured point states no arm's repeats"),
    "a planned ledger that holds measured points": (
        lambda d: (d.update(status="planned"), d.pop("provenance")),
        "$.points[0]: a planned ledger holds figures here"),
    "a repeat count that disagrees with sweep.repeats": (
        lambda d: _baseline(d)["output_tokens_per_s"]["repeats"].append(100.0),
        "$.points[0].arms.baseline.output_tokens_per_s.repeats: 4 repeats, but sweep.repeats says 3"),
    "a speculative arm at 0 tok/s that still reports output tokens": (
        lambda d: (_eagle(d)["output_tokens_per_s"].update(repeats=[0.0, 0.0, 0.0], median=0.0, min=0.0, max=0.0),
                   _eagle(d).update(output_tokens=500)),
        "$.points[0].arms.eagle.output_tokens: 500 output tokens at 0 tok/s"),
}


@pytest.mark.parametrize("kind", list(SILENT))
def test_contradictory_figures_are_refused_with_their_json_path(kind, tmp_path, capsys):
    change, expected = SILENT[kind]
    data = _small()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert f"{path}: {expected}" in out + err, out + err
    _no_traceback(out, err)


def test_a_median_that_cannot_be_the_middle_of_its_repeats_is_an_audit_error(tmp_path, capsys):
    """Repeats 99.0, 100.0, 101.5: an odd count, so the median is one of them (stored rounded alike);
    100.1 is within a unit of 100.0 (the old slack) but cannot be the middle."""
    data = _small()
    _baseline(data)["output_tokens_per_s"]["median"] = 100.1
    path = tmp_path / "median.json"
    path.write_text(json.dumps(data))
    assert main(["audit", str(path)]) == 1
    out = capsys.readouterr().out
    assert "$.points[0].arms.baseline.output_tokens_per_s.median: median 100.1 disagrees with the median of " \
           "the repeats, 100.0 [repeats]" in out, out
    _baseline(data)["output_tokens_per_s"]["median"] = 100.0
    path.write_text(json.dumps(data))
    main(["audit", str(path)])
    assert "[repeats]" not in capsys.readouterr().out


def test_crosscheck_of_a_ledger_that_does_not_load_is_refused_before_any_server(tmp_path, capsys):
    data = _small()
    data["provenance"]["date"] = "last Tuesday"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert main(["crosscheck", str(path), "--point", "copy:0:1", "--arm", "eagle"]) == 1
    out, err = capsys.readouterr()
    assert f"{path}: $.provenance.date" in err
    _no_traceback(out, err)
