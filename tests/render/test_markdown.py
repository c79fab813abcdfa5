"""Markdown report: conditions, the points as the tables have them, and image links that resolve."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from repo_paths import ROOT
from repo_paths import SMALL as SMALL_PATH

from specledger.cli import main
from specledger.ledger import load_ledger, parse_ledger
from specledger.ledger.model import DEFAULT_PROTOCOL
from specledger.render.markdown import effective_config_differences, markdown_table, write_report

H200 = load_ledger(ROOT / "tests" / "data" / "h200-smollm2.json")
INT4 = load_ledger(ROOT / "ledgers" / "reference-b200-int4.json")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


def _planned():
    data = json.loads(SMALL_PATH.read_text())
    data.update(status="planned", points=[], id="planned-small")
    for key in ("provenance", "critical_concurrency", "claims"):
        data.pop(key)
    return parse_ledger(json.dumps(data), "planned.json")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str]:
    path = write_report([H200, INT4, _planned()], tmp_path_factory.mktemp("out") / "report.md")
    return path, path.read_text(encoding="utf-8")


def test_sections_and_conditions(report):
    _, text = report
    assert text.startswith("# specledger report\n")
    for heading in ("## h200-smollm2", "## reference-b200-int4", "## planned-small"):
        assert f"\n{heading}\n" in text
    h200 = text.split("## h200-smollm2")[1].split("\n## ")[0]
    assert "- **Engine:** vllm 0.26.0 (torch 2.11.0+cu130, Python 3.12.3)" in h200
    assert "- **Accelerator:** 1x NVIDIA H200 (cuda, driver 580.159.04)" in h200
    assert "dtype bfloat16" in h200
    assert (
        '| ngram | speculative | `{"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 2, '
        '"prompt_lookup_max": 4}` | - | 1,260,592 | -1.4% | 307.76 at 4,096 ctx; 153.88 at 8,192 ctx |'
    ) in h200
    assert "| `async_scheduling` | `true` | `false` | `false` | `false` |" in h200
    assert "num_gpu_blocks` |" not in h200
    assert "- free-form at temperature 1.0, c=16 and c=64, is not recorded" in h200  # notes


def test_points_and_critical_rows(report):
    _, text = report
    assert "| ngram | copy | 0 | 4 | 786 | 912 | 1.16x | 1.00x | 5.19 | 0.600 | 53% |" in text
    assert "| ngram | copy | 0 | 64 | 13,274 | 7,935 | 0.60x | 0.73x | 5.24 | 0.609 | 30% |" in text
    assert "| dflash2 | free-form | n/a | 8 | - | - | 0.82x | - | - | - | - |" in text
    assert "| dflash2 | free-form | n/a | 1, 2, 4, 8 | 4.76 (between 4 and 8) |" in text
    assert "| ngram | free-form | 1 | 1, 2, 4, 8 | below 1.0 from c=1 (no crossing within c=1..8) |" in text


def test_image_links_exist_on_disk(report):
    path, text = report
    links = IMAGE.findall(text)
    assert links == [
        "report_files/h200-smollm2-multiplier.png",
        "report_files/h200-smollm2-throughput.png",
        "report_files/h200-smollm2-acceptance.png",
        "report_files/reference-b200-int4-multiplier.png",
    ]
    for link in links:
        image = path.parent / link
        assert image.is_file() and image.read_bytes()[:4] == b"\x89PNG"
    assert "- skipped: reference-b200-int4: no throughput plot" in text


def test_planned_ledger_says_so(report):
    _, text = report
    planned = text.split("## planned-small")[1]
    assert "No measured points yet (status planned)." in planned
    assert "_No plots: planned-small: nothing to plot: no measured points (status planned)._" in planned


def test_effective_config_differences():
    names, rows = effective_config_differences(H200)
    assert names == ["baseline", "matched-baseline", "ngram", "draft-self"]
    assert dict(rows) == {
        "async_scheduling": [True, False, False, False],
        "use_v2_model_runner": [True, False, False, False],
    }
    data = json.loads(json.dumps(H200.data))
    data["arms"][1]["effective_config"].pop("max_num_seqs")
    names, rows = effective_config_differences(parse_ledger(json.dumps(data), "x.json"))
    assert dict(rows)["max_num_seqs"] == [64, "(absent)", 64, 64]


def test_markdown_table():
    assert markdown_table(["a", "b"], [["x|y", 1.5]], right=[False, True]) == ("| a | b |\n|---|---:|\n| x\\|y | 1.5 |")
    with pytest.raises(ValueError, match="row has 1 cells, table has 2 columns"):
        markdown_table(["a", "b"], [["only"]])


def test_cli_report(tmp_path, capsys):
    out = tmp_path / "sub" / "small.md"
    assert main(["report", str(SMALL_PATH), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    text = out.read_text()
    assert "| eagle | copy | 0 | 1 | 100 | 180 | 1.80x | 1.90x | 2.50 | 0.375 | 3% |" in text
    assert all((out.parent / link).is_file() for link in IMAGE.findall(text))
    assert main(["report", str(SMALL_PATH), "-o", str(tmp_path)]) == 2  # a directory is not a report name
    assert main(["report", str(SMALL_PATH)]) == 2


def _v3_small():
    """measured-small as a protocol v3 ledger: no fixed repeat count, and CIs on its first point."""
    data = json.loads(SMALL_PATH.read_text())
    data["id"] = "v3-small"
    del data["sweep"]["repeats"]
    data["protocol"] = {**copy.deepcopy(DEFAULT_PROTOCOL), "repeats": {"min": 6, "max": 10}}
    eagle = data["points"][0]["arms"]["eagle"]
    eagle.update(multiplier_ci95=[1.61, 2.02], multiplier_vs_matched_ci95=[1.7, 2.1])
    return parse_ledger(json.dumps(data), "v3.json")


def test_a_v3_ledger_reports_its_repeat_range_and_every_ci(tmp_path):
    """A v3 sweep states no repeat count (the report used to fail on it), and a v3 multiplier is shown
    with its CI: a verdict without its uncertainty would be a single number again."""
    text = write_report([_v3_small()], tmp_path / "v3.md").read_text()
    assert "c = 1, 4, 16; 6 to 10 paired repeats of steady-state windows (protocol v3) per point" in text
    assert "| eagle | copy | 0 | 1 | 100 | 180 | 1.80x (1.61..2.02) | 1.90x (1.70..2.10) | 2.50 | 0.375 | 3% |" in text
    assert "| eagle | copy | 0 | 4 |" in text and "(1.61..2.02)" not in text.split("| eagle | copy | 0 | 4 |")[1]


def test_a_ledger_of_several_starts_reports_each_start_beside_its_host(tmp_path):
    """The report shows which start made a wide interval: the H100 ledger's second lease ran the host loop at about
    twice the time, and its row says so; a ledger of one start each has no such section."""
    h100 = load_ledger(ROOT / "ledgers" / "h100-qwen2.5-coder-1.5b.json")
    text = write_report([h100], tmp_path / "h100.md").read_text()
    section = text.split("### Engine starts")[1].split("\n### ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ngram | copy | 0 | 8 |")]
    assert len(rows) == 2
    host = [float(row.split("|")[10]) for row in rows]
    assert host[1] > 1.5 * host[0]
    assert "### Engine starts" not in write_report([H200], tmp_path / "h200.md").read_text()
