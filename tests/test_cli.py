"""The command line: exit codes 0 (fine), 1 (problems in the ledgers), 2 (usage)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from repo_paths import ROOT, SMALL

from specledger import cli
from specledger.cli import main

REFERENCE = sorted((ROOT / "ledgers").glob("reference-*.json"))


@pytest.fixture
def bad_multiplier(tmp_path) -> Path:
    data = json.loads(SMALL.read_text())
    data["points"][0]["arms"]["eagle"]["multiplier"] = 1.9
    path = tmp_path / "bad-multiplier.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def invalid(tmp_path) -> Path:
    path = tmp_path / "invalid.json"
    data = json.loads(SMALL.read_text())
    data["points"][0]["arms"]["baseline"]["output_tokens_per_s"]["median"] = -1
    path.write_text(json.dumps(data))
    return path


def test_validate_ok(capsys):
    assert main(["validate", str(SMALL)]) == 0
    assert "ok (test-small, measured, 3 points)" in capsys.readouterr().out


def test_validate_reference_ledgers(capsys):
    assert main(["validate", *map(str, REFERENCE)]) == 0
    out = capsys.readouterr().out
    assert all(f"{p}: ok (" in out for p in REFERENCE)


def test_validate_expands_directories(capsys):
    assert main(["validate", str(SMALL.parent)]) == 0
    assert f"{SMALL}: ok (test-small" in capsys.readouterr().out


def test_validate_invalid(invalid, capsys):
    assert main(["validate", str(SMALL), str(invalid)]) == 1
    out = capsys.readouterr().out
    assert (
        f"{invalid}: $.points[0].arms.baseline.output_tokens_per_s.median: -1 is less than the minimum of 0"
        in out
    )
    assert "1 invalid ledger(s)" in out


def test_validate_missing_path_is_usage(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_validate_empty_directory_is_usage(tmp_path):
    assert main(["validate", str(tmp_path)]) == 2


def test_usage_errors_exit_2(capsys):
    assert main(["validate"]) == 2
    assert main(["frobnicate"]) == 2
    assert main([]) == 2
    assert main(["audit", str(SMALL), "--min-severity", "loud"]) == 2


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("validate", "audit", "show", "demo"):
        assert name in out


def test_audit_reference_ledgers_exit_0(capsys):
    assert main(["audit", *map(str, REFERENCE)]) == 0
    out = capsys.readouterr().out
    assert "595/2306 = 0.258, stated as 0.3x: holds at 1 decimal" in out
    assert f"audited {len(REFERENCE)} ledger(s): 0 error(s), 0 warning(s)" in out


def test_audit_error_exits_1(bad_multiplier, capsys):
    assert main(["audit", str(bad_multiplier)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == str(bad_multiplier)
    assert "  error: $.points[0].arms.eagle.multiplier: 180.0/100.0 = 1.800, stated as 1.9" in out
    assert "1 error(s)" in out


def test_audit_load_problem_exits_1(invalid, capsys):
    assert main(["audit", str(SMALL), str(invalid)]) == 1
    assert "1 load problem(s)" in capsys.readouterr().out


def test_audit_min_severity_filters(capsys):
    assert main(["audit", str(SMALL), "--min-severity", "warning"]) == 0
    out = capsys.readouterr().out
    assert "holds" not in out
    assert "no findings at or above warning" in out
    assert "1 info" in out  # counted in the summary even when not shown


def test_show_prints_tables(capsys):
    assert main(["show", str(SMALL), str(ROOT / "ledgers" / "reference-b200-nvfp4-gptq.json")]) == 0
    out = capsys.readouterr().out
    assert "multiplier" in out and "critical_concurrency" in out
    assert "9.19 (between 4 and 16)" in out
    assert "17.47 (between 16 and 64)" in out


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`specledger show L | head -1`: the pipe closes while the tables are printed; the command ends as a process
    that SIGPIPE ended (141), with nothing on stderr (it printed a BrokenPipeError traceback)."""
    ledgers = str(ROOT / "ledgers")  # three times over: 240 kB, far past what a pipe buffers, so a write must fail
    shown = subprocess.Popen([sys.executable, "-m", "specledger.cli", "show", ledgers, ledgers, ledgers],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert shown.stdout.readline()  # the first line, then the reader leaves
    shown.stdout.close()
    assert shown.wait(timeout=120) == 141
    assert shown.stderr.read() == b""


def test_show_invalid_exits_1(invalid, capsys):
    assert main(["show", str(invalid)]) == 1


def test_demo_forwards_everything(monkeypatch):
    seen = []
    fake = types.ModuleType("specledger.demo")
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "specledger.demo", fake)
    assert main(["demo", "--help", "validate", "-x"]) == 3
    assert seen == [["--help", "validate", "-x"]]


def test_demo_missing_is_a_clear_failure(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "specledger.demo", None)
    assert main(["demo"]) == 1
    assert "no specledger.demo module" in capsys.readouterr().err


def test_commands_are_registered():
    assert {"validate", "audit", "show", "demo"} <= set(cli.COMMANDS)


def test_cli_never_imports_vllm_or_engines():
    code = (
        "import sys; from specledger.cli import main; "
        f"rc = main(['audit', {str(SMALL)!r}, '--min-severity', 'error']); "
        f"main(['show', {str(SMALL)!r}]); "
        "bad = [m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', 'specledger.measure.engines'))]; "
        "print('BAD', bad); sys.exit(rc)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "BAD []" in result.stdout


def test_pool_starts_rewrites_only_derived_intervals_and_refuses_to_overwrite_unasked(tmp_path, capsys):
    """The committed Qwen ledger has points of two engine starts: pooling again gives the same ledger (it was pooled
    when written), the measured figures never move, and an existing -o file needs --force."""
    source = ROOT / "ledgers" / "h200-qwen2.5-coder-1.5b.json"
    out = tmp_path / "pooled.json"
    assert main(["pool-starts", str(source), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    before, after = json.loads(source.read_text()), json.loads(out.read_text())
    pooled_over = before["start_spread"]["ngram"]["multiplier"]["points"]  # points of two or more starts
    assert pooled_over >= 2
    assert "ngram multiplier: between-start sd" in said and f"degrees of freedom over {pooled_over} points" in said
    assert re.search(r"ngram multiplier: .* over \d+ points; alike across points\? Bartlett p [01]\.\d{3}\n", said)
    assert after == before
    assert main(["pool-starts", str(source), "-o", str(out)]) == 2
    assert "pass --force" in capsys.readouterr().err
    for point in after["points"]:  # an interval as if the spread had not been pooled: put back
        point["arms"]["ngram"]["multiplier_ci95"] = [0.1, 9.9]
    out.write_text(json.dumps(after))
    assert main(["pool-starts", str(out), "--in-place"]) == 0
    assert json.loads(out.read_text()) == before
    modules = subprocess.run([sys.executable, "-c", "import sys; from specledger.cli import main; "
                              f"main(['pool-starts', {str(source)!r}, '-o', {str(tmp_path / 'x.json')!r}]); "
                              "print('BAD', [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')])"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "BAD []" in modules.stdout, modules.stderr
