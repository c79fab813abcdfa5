"""pytest-xdist across GPUs: one ledger per worker, each worker on its own GPUs and CPU cores.

The assignment is pure logic (unit and property tests); the plugin's part runs in a child pytest with two
CPU ledgers and a fake measurement (no engine starts), and the pinning itself in a simulated worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from repo_paths import ROOT

from specledger import gpu_assignment, xdist_support
from specledger.gpu_assignment import AssignmentError, assignment, gpus_needed, worker_index


@pytest.mark.parametrize(("worker_id", "index"), [("gw0", 0), ("gw3", 3), ("gw12", 12), ("master", None),
                                                   (None, None), ("", None), ("gwx", None), ("xgw1", None)])
def test_worker_index(worker_id: str | None, index: int | None) -> None:
    assert worker_index(worker_id) == index


def test_each_worker_gets_its_gpu_and_its_slice_of_the_cores() -> None:
    """The rule scripts/gpu-split applied by hand: ledger i on GPU i, cores i*per .. i*per+per-1."""
    first = assignment(0, 2, ["0", "1"], range(16))
    second = assignment(1, 2, ["0", "1"], range(16))
    assert (first.visible_devices, sorted(first.cpus)) == ("0", list(range(8)))
    assert (second.visible_devices, sorted(second.cpus)) == ("1", list(range(8, 16)))
    assert second.describe() == "GPU 1, CPUs 8-15"


def test_parent_device_names_are_handed_out_as_given() -> None:
    """A parent's CUDA_VISIBLE_DEVICES of "4,6" (or UUIDs) is the pool: worker 1 sees "6", not "1"."""
    assert assignment(1, 2, ["4", "6"], range(4)).visible_devices == "6"
    assert assignment(0, 1, ["GPU-a", "GPU-b"], range(4), 2).visible_devices == "GPU-a,GPU-b"


def test_more_workers_than_gpus_is_refused_unless_sharing_is_asked_for() -> None:
    with pytest.raises(AssignmentError, match=r"3 xdist workers need 3 GPUs but 2 are visible.*-n 2"):
        assignment(0, 3, ["0", "1"], range(8))
    shared = [assignment(i, 3, ["0", "1"], range(9), share_gpus=True).visible_devices for i in range(3)]
    assert shared == ["0", "1", "0"]


def test_tensor_parallel_ledgers_get_their_world_size() -> None:
    pairs = [assignment(i, 2, [str(g) for g in range(4)], range(8), 2).visible_devices for i in range(2)]
    assert pairs == ["0,1", "2,3"]
    with pytest.raises(AssignmentError, match=r"2 xdist workers x 2 GPUs each need 4 GPUs but 3"):
        assignment(0, 2, ["0", "1", "2"], range(8), 2)
    with pytest.raises(AssignmentError, match="needs 4 GPUs"):  # sharing cannot split one engine
        assignment(0, 1, ["0", "1"], range(8), 4, share_gpus=True)


def test_too_few_cores_and_bad_indices_are_refused() -> None:
    with pytest.raises(AssignmentError, match="only 1 CPU cores"):
        assignment(0, 2, ["0", "1"], [0])
    with pytest.raises(AssignmentError, match="not one of"):
        assignment(2, 2, ["0", "1"], range(4))


def test_gpus_needed_reads_tensor_and_pipeline_parallel_sizes() -> None:
    tp2 = json.loads((ROOT / "ledgers" / "h200x2-qwen2.5-coder-1.5b-tp2.json").read_text())
    assert gpus_needed(tp2) == 2
    assert gpus_needed(json.loads((ROOT / "ledgers" / "h200-smollm2-copy.json").read_text())) == 1
    assert gpus_needed({"engine_args": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}}) == 4
    assert gpus_needed({"engine_args": {}, "arms": [{"engine_args": {"tensor_parallel_size": 4}}, {}]}) == 4
    assert gpus_needed({"engine_args": {"tensor_parallel_size": None}}) == 1


def test_group_of_reads_the_ledger_from_the_parameter_id() -> None:
    """The controller's own grouping (pytest 9.2 no longer lets xdist append '@group' to node ids)."""
    groups = {"cpu-smollm2-ngram-copy:0:1": "cpu-smollm2"}
    assert gpu_assignment.group_of("tests/engine/test_ledgers.py::test_point[cpu-smollm2-ngram-copy:0:1]", groups) \
        == "cpu-smollm2"
    assert gpu_assignment.group_of("tests/engine/test_ledgers.py::test_point[other]", groups) is None
    assert gpu_assignment.group_of("tests/test_stats.py::test_x", groups) is None
    assert gpu_assignment.group_of("tests/a[b].py::test_point[cpu-smollm2-ngram-copy:0:1]", groups) \
        == "cpu-smollm2"


def test_cpu_ranges() -> None:
    assert gpu_assignment.cpu_ranges({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert gpu_assignment.cpu_ranges([]) == ""


@given(st.data())
def test_workers_never_share_gpus_or_cores(data: st.DataObject) -> None:
    n_gpus = data.draw(st.integers(1, 16), label="gpus")
    per = data.draw(st.integers(1, n_gpus), label="gpus per worker")
    n_workers = data.draw(st.integers(1, n_gpus // per), label="workers")
    cpus = data.draw(st.sets(st.integers(0, 255), min_size=n_workers, max_size=128), label="cpus")
    gpus = [f"GPU-{g}" for g in range(n_gpus)]
    shares = [assignment(i, n_workers, gpus, cpus, per) for i in range(n_workers)]
    used_gpus = [g for a in shares for g in a.gpus]
    assert all(len(a.gpus) == per for a in shares)
    assert len(used_gpus) == len(set(used_gpus)) == n_workers * per and set(used_gpus) <= set(gpus)
    used_cpus = [c for a in shares for c in a.cpus]
    assert len(used_cpus) == len(set(used_cpus)) and set(used_cpus) <= cpus  # disjoint
    assert {len(a.cpus) for a in shares} == {len(cpus) // n_workers}  # equal shares
    assert len(cpus) - len(used_cpus) < n_workers  # only a remainder too small to share stays unused


@given(n_gpus=st.integers(1, 16), extra=st.integers(1, 16), per=st.integers(1, 4))
def test_more_workers_than_gpu_slots_always_raises(n_gpus: int, extra: int, per: int) -> None:
    n_workers = n_gpus // per + extra
    with pytest.raises(AssignmentError):
        assignment(0, n_workers, [str(g) for g in range(n_gpus)], range(1024), per)


def test_detect_gpus_prefers_the_parents_list_then_nvidia_smi() -> None:
    def smi(listing: str, rc: int = 0):
        def run(cmd, **kwargs):
            assert cmd == ["nvidia-smi", "-L"]
            return subprocess.CompletedProcess(cmd, rc, listing, "")
        return run

    listing = "GPU 0: NVIDIA H200 (UUID: GPU-a)\nGPU 1: NVIDIA H200 (UUID: GPU-b)\n"
    assert gpu_assignment.detect_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, run=smi(listing)) == ["2", "3"]
    assert gpu_assignment.detect_gpus({"CUDA_VISIBLE_DEVICES": ""}, run=smi(listing)) == []
    assert gpu_assignment.detect_gpus({}, run=smi(listing)) == ["0", "1"]


def test_detect_gpus_without_nvidia_smi_asks_torch_in_a_child_or_finds_none(monkeypatch) -> None:
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if cmd[0] == "nvidia-smi":
            raise FileNotFoundError("nvidia-smi")
        return subprocess.CompletedProcess(cmd, 0, "3\n", "")

    monkeypatch.setattr(gpu_assignment.importlib.util, "find_spec", lambda name: object())
    assert gpu_assignment.detect_gpus({}, run=run) == ["0", "1", "2"]
    assert calls[1][0] == sys.executable and "torch.cuda.device_count()" in calls[1][-1]  # never in this process
    monkeypatch.setattr(gpu_assignment.importlib.util, "find_spec", lambda name: None)
    assert gpu_assignment.detect_gpus({}, run=run) == []


def test_a_simulated_worker_is_pinned_to_the_second_gpu_and_half(monkeypatch) -> None:
    """What the plugin's pytest_configure does on worker gw1 of 2 under CUDA_VISIBLE_DEVICES=0,1 (fake CPU list
    and affinity call: this process keeps its own)."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    pinned: list[frozenset[int]] = []
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    got = gpu_assignment.pin_worker(cpus=range(8), setaffinity=pinned.append)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert pinned == [frozenset({4, 5, 6, 7})] and got is not None and got.cpus == pinned[0]
    assert before is None or os.sched_getaffinity(0) == before


def test_pinning_leaves_the_controller_and_gpu_less_machines_alone(monkeypatch) -> None:
    calls: list[frozenset[int]] = []
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_assignment.pin_worker(cpus=range(8), setaffinity=calls.append) is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_assignment.pin_worker(cpus=range(8), setaffinity=calls.append) is None
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and calls == []
    env = {"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "3"}
    with pytest.raises(AssignmentError):
        gpu_assignment.pin_worker(env, gpus=["0", "1"], cpus=range(8), setaffinity=calls.append)
    assert "CUDA_VISIBLE_DEVICES" not in env and calls == []


def test_gpu_ids_from_nvidia_smi_get_its_numbering(monkeypatch) -> None:
    env = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
    monkeypatch.setattr(gpu_assignment, "detect_gpus", lambda environ: ["0", "1", "2", "3"])
    got = gpu_assignment.pin_worker(env, gpus_per_worker=2, cpus=range(4), setaffinity=lambda cpus: None)
    assert got is not None and env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_the_plugin_reads_gpu_selection_from_the_mark_expression() -> None:
    selects = xdist_support.selects_gpu
    assert selects("gpu") and selects("") and selects("gpu or engine")
    assert not xdist_support.selects_gpu("not gpu") and not xdist_support.selects_gpu("not engine and not gpu")
    assert not xdist_support.selects_gpu("engine")


RECORD_WORKER = '''
"""Test-only plugin: the committed point stands in for a measurement; which xdist worker measured it is noted."""
import copy
import json
import os

from specledger.measure import procedure, session


def fake_measure(self, ledger, key):
    if (ledger.id, key) in self._cache:  # one measurement per point, for all of its arms
        return self._cache[(ledger.id, key)]
    with open(os.environ["WORKER_LOG"], "a") as log:
        log.write(json.dumps([ledger.id, os.environ.get("PYTEST_XDIST_WORKER"), list(key)]) + "\\n")
    point = copy.deepcopy(ledger.find_point(*key))
    timings = {name: [{"window_s": 5.0, "output_tokens": int(v * 5), "output_tokens_per_s": v}
                      for v in res["output_tokens_per_s"]["repeats"]] for name, res in point["arms"].items()}
    return self._cache.setdefault((ledger.id, key), procedure.PointMeasurement(key, point, timings, 0.1))


session.SuiteSession.measure = fake_measure
'''


def _child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a child pytest that imports a plugin from `tmp_path`. Without this test's own xdist
    worker variables: under an outer `pytest -n`, the child read PYTEST_XDIST_WORKER, took itself for a worker and
    pinned itself as one (three tests here failed so)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}
    path = os.pathsep.join(p for p in (str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, **extra}


def test_loadgroup_runs_each_ledger_on_one_worker(tmp_path: Path) -> None:
    """`-n 2 --dist loadgroup` over two ledgers: every point of a ledger on one worker, the ledgers on two."""
    pytest.importorskip("xdist")
    (tmp_path / "record_worker.py").write_text(RECORD_WORKER)
    log = tmp_path / "workers.jsonl"
    env = _child_env(tmp_path, WORKER_LOG=str(log))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/engine/test_ledgers.py", "-p", "no:cacheprovider", "-p",
         "record_worker", "-v", "-m", "not gpu", "-o", "addopts=", "-n", "2", "--dist", "loadgroup",
         "--ledger", "ledgers/cpu-smollm2.json", "--ledger", "ledgers/cpu-smollm2-policy.json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    measured: dict[str, int] = defaultdict(int)
    for line in log.read_text().splitlines():
        ledger_id, worker, _ = json.loads(line)
        workers[ledger_id].add(worker)
        measured[ledger_id] += 1
    assert set(workers) == {"cpu-smollm2", "cpu-smollm2-policy"}, out[-3000:]
    for ledger_id in ("cpu-smollm2", "cpu-smollm2-policy"):
        committed = json.loads((ROOT / "ledgers" / f"{ledger_id}.json").read_text())["points"]
        assert measured[ledger_id] == len(committed)  # every committed point, once
        assert len(workers[ledger_id]) == 1 and None not in workers[ledger_id], workers
    assert workers["cpu-smollm2"] != workers["cpu-smollm2-policy"], workers
    # Also the points without figures (skipped before any measurement) ran on their ledger's worker.
    ran: dict[str, set[str]] = defaultdict(set)
    for line in proc.stdout.splitlines():
        if line.startswith("[gw") and "::test_point[" in line:
            test_id = line.split("::test_point[", 1)[1].split("]", 1)[0]
            ledger_id = "cpu-smollm2-policy" if test_id.startswith("cpu-smollm2-policy-") else "cpu-smollm2"
            ran[ledger_id].add(line.split("]", 1)[0].lstrip("["))
    assert ran == dict(workers), proc.stdout[-3000:]
    # A worker's terminal is not shown: its progress and verdict table come through stderr, marked with it.
    assert {line.split("]", 1)[0] + "]" for line in proc.stderr.splitlines()
            if line.endswith("] specledger verdicts")} == {"[gw0]", "[gw1]"}, proc.stderr[-3000:]


REPORT_PINNING = '''
"""Test-only plugin: each process notes the GPUs and cores it ended up with once configured."""
import json
import os

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    with open(os.environ["PIN_LOG"], "a") as log:
        log.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("CUDA_VISIBLE_DEVICES"),
                              sorted(os.sched_getaffinity(0))]) + "\\n")
'''


def _gpu_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[list]]:
    """A child `pytest -m gpu` over two GPU ledgers, told by CUDA_VISIBLE_DEVICES that two GPUs exist; every
    point is deselected (-k), so nothing but configuration and collection runs."""
    pytest.importorskip("xdist")
    (tmp_path / "report_pinning.py").write_text(REPORT_PINNING)
    log = tmp_path / "pins.jsonl"
    env = _child_env(tmp_path, PIN_LOG=str(log), CUDA_VISIBLE_DEVICES="0,1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/engine/test_ledgers.py", "-p", "no:cacheprovider", "-p",
         "report_pinning", "-q", "-m", "gpu", "-o", "addopts=", "-k", "no-such-point",
         "--ledger", "ledgers/h200-smollm2-copy.json", "--ledger", "ledgers/h200-smollm2-free-form.json", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return proc, [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity (Linux)")
def test_real_workers_are_pinned_to_their_gpu_and_cores(tmp_path: Path) -> None:
    proc, pins = _gpu_run(tmp_path, "-n", "2", "--dist", "loadgroup")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out[-3000:]  # 5: every test deselected
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // 2
    by_worker = {worker: (visible, cpus) for worker, visible, cpus in pins}
    assert by_worker == {None: ("0,1", cores), "gw0": ("0", cores[:per]), "gw1": ("1", cores[per:2 * per])}, pins


def test_more_workers_than_gpus_or_another_dist_mode_is_refused(tmp_path: Path) -> None:
    proc, pins = _gpu_run(tmp_path, "-n", "3", "--dist", "loadgroup")
    assert proc.returncode == 4 and "3 xdist workers need 3 GPUs but 2 are visible" in proc.stderr, proc.stderr
    assert all(worker is None for worker, *_ in pins)  # refused before any worker started
    proc, _ = _gpu_run(tmp_path, "-n", "2")
    assert proc.returncode == 4 and "need --dist loadgroup" in proc.stderr, proc.stderr


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity (Linux)")
def test_n_auto_makes_one_worker_per_gpu_slot(tmp_path: Path) -> None:
    """scripts/gpu-run's `-n auto`: two one-GPU ledgers on two GPUs get two workers; with the tensor-parallel
    ledger (2 GPUs) in the run, every worker needs two, so one worker gets both."""
    _, pins = _gpu_run(tmp_path, "-n", "auto", "--dist", "loadgroup")
    assert sorted(visible for worker, visible, _ in pins if worker) == ["0", "1"], pins
    (tmp_path / "pins.jsonl").unlink()
    _, pins = _gpu_run(tmp_path, "-n", "auto", "--dist", "loadgroup",
                       "--ledger", "ledgers/h200x2-qwen2.5-coder-1.5b-tp2.json")
    assert [(worker, visible) for worker, visible, _ in pins if worker] == [("gw0", "0,1")], pins
