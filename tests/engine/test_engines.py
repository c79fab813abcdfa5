"""Engine lifecycle on the real CPU engine: start errors surface, Ctrl-C leaves no orphan engine processes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from repo_paths import ROOT

from specledger.measure import engines, procedure
from specledger.measure.http import servers

pytestmark = pytest.mark.engine



def _small_baseline() -> engines.ArmSpec:
    """SmolLM2 as one small CPU baseline arm: the cheapest real engine these lifecycle tests can start."""
    from specledger.models import resolve_model

    return engines.ArmSpec(name="baseline", role="baseline", engine_args={
        "model": resolve_model("embedded:smollm2"), "dtype": "float32", "max_model_len": 512,
        "enforce_eager": True, "max_num_seqs": 2})


def test_a_bad_model_fails_the_start_with_the_workers_traceback(tmp_path):
    spec = engines.ArmSpec(name="broken", role="baseline",
                           engine_args={"model": str(tmp_path / "no-such-model"), "dtype": "float32"})
    arm = engines.ArmEngine(spec, start_timeout_s=300)
    with pytest.raises(engines.EngineStartError, match="arm broken: start failed in the worker") as info:
        arm.start()
    assert "Traceback" in str(info.value)
    assert not arm.alive


SCRIPT = textwrap.dedent("""
    import sys, time
    from specledger.measure import engines
    from specledger.models import resolve_model

    if __name__ == "__main__":
        spec = engines.ArmSpec(name="baseline", role="baseline", engine_args={
            "model": resolve_model("embedded:smollm2"), "dtype": "float32", "max_model_len": 512,
            "enforce_eager": True, "max_num_seqs": 2})
        with engines.ArmEngine(spec) as arm:
            print("ready", arm.info["pid"], flush=True)
            time.sleep(600)
""")


def test_ctrl_c_shuts_the_engine_down_and_leaves_no_orphans(tmp_path):
    script = tmp_path / "hold_engine.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_CPU_KVCACHE_SPACE="1")
    # A runner started in the background (nohup ... &) hands SIGINT down as ignored, and Python then
    # installs no KeyboardInterrupt handler: give the script the Ctrl-C a terminal would deliver.
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = ""
        deadline = time.monotonic() + 600
        while not line.startswith("ready") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the script died before the engine was ready"
        worker_pid = int(line.split()[1])
        assert servers.group_alive(worker_pid), "the worker should lead its own process group"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        for _ in range(30):
            if not servers.group_alive(worker_pid):
                break
            time.sleep(1)
        assert not servers.group_alive(worker_pid), "engine processes outlived Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_tensor_parallel_arguments_reach_the_engine_arguments(tmp_path):
    """TP for the target and the drafter travel from the ledger to vLLM's own argument class unchanged."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    ledger = {
        "target": {"model": "embedded:smollm2", "dtype": "bfloat16", "max_model_len": 4096},
        "engine_args": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.4},
        "arms": [
            {"name": "baseline", "role": "baseline"},
            {"name": "draft", "role": "speculative",
             "speculative_config": {"method": "draft_model", "model": "target", "num_speculative_tokens": 4,
                                    "draft_tensor_parallel_size": 1}},
        ],
    }
    target = str(tmp_path)  # an existing local folder: vLLM resolves hub ids at argument time
    specs = engines.arm_specs(ledger, target)
    assert [s.engine_args["tensor_parallel_size"] for s in specs] == [2, 2]
    draft = specs[1].engine_args["speculative_config"]
    assert draft["draft_tensor_parallel_size"] == 1 and draft["model"] == target
    args = AsyncEngineArgs(**specs[1].engine_args)
    assert args.tensor_parallel_size == 2
    assert args.speculative_config["draft_tensor_parallel_size"] == 1


def test_topology_summary_reads_nvidia_smi_topo():
    topo = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\t X \tNV18\t0-31\t0\n"
            "GPU1\tNV18\t X \t0-31\t0\n")
    assert engines.topology_summary(topo) == "GPU0-GPU1 NV18"
    assert engines.topology_summary("no gpus here") is None


def test_a_spawned_worker_imports_and_waits_without_building_an_engine(tmp_path):
    """start_arms spawns every worker first: imports overlap, engine builds (GPU memory) do not."""
    spec = engines.ArmSpec(name="idle", role="baseline",
                           engine_args={"model": str(tmp_path / "never-built"), "dtype": "float32"})
    arm = engines.ArmEngine(spec).spawn()
    try:
        assert arm._conn.poll(300), "the worker never reported its imports"
        assert arm._conn.recv() == {"ok": True, "stage": "imported"}
        time.sleep(2)
        children = subprocess.run(["pgrep", "-P", str(arm._proc.pid)], capture_output=True, text=True).stdout
        assert arm.alive and not children.split(), "no engine (core process) before the start command"
        pid = arm._proc.pid
    finally:
        arm.close()
    assert not arm.alive and not servers.group_alive(pid)


def test_a_window_streams_token_times_and_times_its_requests_inside_the_engine():
    """A steady-state window on the real engine: token times from DELTA outputs, engine timers as deltas."""
    spec = _small_baseline()
    sampling = {"temperature": 0.0, "max_tokens": 16}
    prompts = ["Say hello.", "Count to five."]
    with engines.ArmEngine(spec) as arm:
        # Warm up and size the windows as the protocol does (4 request latencies at least): a fixed 2 s
        # window held no whole request on a CPU 3x slower than this test's first machine.
        warm = arm.run(prompts=prompts, concurrency=2, sampling=sampling, window_s=2.0)
        window_s = procedure.window_for({"window": {"min_s": 2.0, "min_rounds": 4}}, [warm["request_latency_median_s"]])
        runs = [arm.run(prompts=prompts, concurrency=2, sampling=sampling, window_s=window_s) for _ in range(2)]
    for res in runs:
        times = res["request_time_s"]
        assert 0 < times["engine"] <= times["end_to_end"] * 1.01, times
        assert res["counters"]["drafts"] == 0 and res["output_tokens"] > 0 and res["requests"] >= 1
        assert res["ramp_s"] > 0 and res["window_s"] == pytest.approx(window_s, abs=0.2)
        assert res["ttft_s"] and all(0 < t < res["request_latency_median_s"] for t in res["ttft_s"])
        assert res["itl_s"] and res["tpot_s"] and max(res["tpot_s"]) < max(res["itl_s"]) * 16
        assert times["end_to_end"] <= res["request_latency_median_s"] * 1.5  # the client saw what the engine did
        # the machine's CPU time during the window (Linux reports steal): the engine's own work shows as busy
        assert 0 <= res["cpu_steal_share"] < 1 and 0 < res["cpu_busy_share"] <= 1, res
        assert 0.5 < res["host_slice_ms"] < 500 and abs(res["opened_unix_s"] - time.time()) < 3600, res
    # the same prompts at T=0 give the same tokens in both windows (what the lossless check relies on)
    assert runs[0]["outputs"]["0"] == runs[1]["outputs"]["0"] and len(runs[0]["outputs"]["0"]) > 0


def test_an_engine_that_dies_mid_run_is_known_dead_and_is_not_asked_again():
    """The engine core killed under a started arm (as CUDA out of memory killed one on 2026-12-05): the next window
    fails with engine_dead, and the one after fails at once, without another wait on the dead engine."""
    spec = _small_baseline()
    sampling = {"temperature": 0.0, "max_tokens": 8}
    with engines.ArmEngine(spec) as arm:
        assert arm.run(prompts=["Say hello."], concurrency=1, sampling=sampling, window_s=0.5)["output_tokens"] > 0
        cores = subprocess.run(["pgrep", "-P", str(arm._proc.pid)], capture_output=True, text=True).stdout.split()
        assert cores, "the worker should have an engine core process"
        for pid in cores:
            os.kill(int(pid), signal.SIGKILL)
        with pytest.raises(engines.ArmRunError) as first:
            arm.run(prompts=["Say hello."], concurrency=1, sampling=sampling, window_s=0.5, timeout_s=120)
        assert first.value.engine_dead and first.value.arm == "baseline" and arm.dead_reason, str(first.value)
        t0 = time.monotonic()
        with pytest.raises(engines.ArmRunError, match="its engine died earlier in this session"):
            arm.run(prompts=["Say hello."], concurrency=1, sampling=sampling, window_s=0.5)
        assert time.monotonic() - t0 < 1.0


def test_a_terminated_worker_takes_its_engine_core_with_it():
    """SIGTERM to the arm's worker (a kill, a pkill of a test run) ends the engine core too: orphaned engine cores
    once held 7 GiB of this machine, and the next run's CPU engines could not allocate their KV cache."""
    spec = _small_baseline()
    with engines.ArmEngine(spec) as arm:
        worker = arm._proc.pid
        cores = subprocess.run(["pgrep", "-P", str(worker)], capture_output=True, text=True).stdout.split()
        assert cores, "the worker should have an engine core process"
        os.kill(worker, signal.SIGTERM)
        for _ in range(30):
            arm._proc.is_alive()  # reaps the worker once it is gone: a zombie would still count in its group
            if not servers.group_alive(worker):
                break
            time.sleep(1)
        assert not servers.group_alive(worker), "the engine core outlived its terminated worker"


def test_ledgers_with_the_same_arms_share_one_start_and_others_get_their_own(tmp_path):
    """Two ledgers whose arms are the same engines (model, engine arguments, environment) are measured on one
    start: a second one costs GPU seconds and buys nothing. A ledger with other arms gets its own engines, and
    the shared ones close first, so idle engines never run beside measured ones."""
    import copy
    import json

    from specledger.ledger import parse_ledger
    from specledger.ledger.migrate import replan_data
    from specledger.measure.session import SuiteSession

    data = replan_data(json.loads((ROOT / "ledgers" / "cpu-smollm2.json").read_text()))
    data["arms"] = [arm for arm in data["arms"] if arm["role"] == "baseline"]
    data["target"]["max_model_len"] = 512
    other = copy.deepcopy(data)
    other["id"], other["engine_args"]["max_num_seqs"] = "other-arms", 2
    same = copy.deepcopy(data)
    same["id"] = "same-arms"
    first, twin, different = (parse_ledger(json.dumps(d), str(tmp_path / f"{d['id']}.json"))
                              for d in (data, same, other))
    lines: list[str] = []
    session = SuiteSession(root=ROOT, record=False, progress=lines.append)
    try:
        arms = session.arms_for(first)
        assert session.arms_for(twin)["baseline"] is arms["baseline"]
        assert session.time_breakdown(twin.id)["engines_shared_with"] == first.id
        assert session.time_breakdown(twin.id)["engine_starts"] == 0.0
        assert session.time_breakdown(first.id)["engine_builds"]["baseline"] > 0
        assert sum("starting arm baseline" in line for line in lines) == 1
        fresh = session.arms_for(different)["baseline"]
        assert fresh is not arms["baseline"] and not arms["baseline"].alive and fresh.alive
        assert sum("starting arm baseline" in line for line in lines) == 2
    finally:
        session.close()


def test_pinned_arms_start_at_once_with_the_kv_capacity_their_ledger_recorded():
    """--ledger-kv-sizing pinned on the real CPU engine: cpu-smollm2's arms start together, each with the block
    count the ledger recorded, and say so in their effective config (num_gpu_blocks_override)."""
    from specledger.ledger import load_ledger
    from specledger.measure.engine_pool import recorded_kv_blocks
    from specledger.measure.session import SuiteSession

    ledger = load_ledger(ROOT / "ledgers" / "cpu-smollm2.json")
    recorded = recorded_kv_blocks(ledger)
    assert set(recorded) == {arm["name"] for arm in ledger.arms}
    lines: list[str] = []
    session = SuiteSession(root=ROOT, record=False, progress=lines.append, kv_sizing="pinned")
    try:
        arms = session.arms_for(ledger)
        for name, arm in arms.items():
            assert arm.info["kv_cache"]["num_blocks"] == recorded[name]
            assert arm.info["effective_config"]["num_gpu_blocks_override"] == recorded[name]
        assert any(line.startswith(f"starting {len(recorded)} arms at once, KV pinned") for line in lines), lines
        out = arms["baseline"].prompt_pass(prompts=["Say hello."], concurrency=1,
                                           sampling={"temperature": 0.0, "max_tokens": 8})
        assert out["output_tokens"] > 0
    finally:
        session.close()


def test_the_compile_phase_builds_real_arms_side_by_side_with_a_small_pinned_kv_cache_and_closes_them():
    """engines.compile_at_once on the real CPU engine: two arms build at once, each pinned to one request of its
    max_model_len (the override path every GPU arm takes there), and both are closed when it returns. On the CPU
    engine no ledger asks for it (its arms already build at once), so this is the only test of a real start."""
    from dataclasses import replace

    first = _small_baseline()
    specs = [first, replace(first, name="baseline-2")]
    lines: list[str] = []
    elapsed_s = engines.compile_at_once(specs, progress=lines.append)
    ready = [line for line in lines if line.startswith("arm baseline-2 ready after")]
    assert ready and ready[0].endswith("tokens, pinned)"), lines
    assert int(ready[0].rsplit("KV cache ", 1)[1].split()[0]) >= 512, "one request of max_model_len fits"
    assert lines[-1].startswith("compile phase: 2 of 2 arms built side by side and closed in"), lines
    assert elapsed_s > 0
    assert not any(arm.spec.name.startswith("baseline") for arm in engines._LIVE), "an arm was left running"
    assert not engines.wants_compile_phase(specs)  # the CPU engine's arms need no compile phase
