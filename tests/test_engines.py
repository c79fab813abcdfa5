"""Engine lifecycle on the real CPU engine: start errors surface, Ctrl-C leaves no orphan engine processes."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specledger import engines

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


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
    from specledger import engines
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
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        deadline = time.monotonic() + 600
        while not line.startswith("ready") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the script died before the engine was ready"
        worker_pid = int(line.split()[1])
        assert _group_alive(worker_pid), "the worker should lead its own process group"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        for _ in range(30):
            if not _group_alive(worker_pid):
                break
            time.sleep(1)
        assert not _group_alive(worker_pid), "engine processes outlived Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
