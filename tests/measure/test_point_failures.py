"""A point that failed, or a ledger whose engine died, costs no second measurement; arms that would not fit the GPU
are refused before any engine starts.

Why: on 2026-12-05 (reports/evidence/2026-12-05-h100-qwen-bf16-visit2) six arms at 0.15 of an H100 80GB started,
the sixth died of CUDA out of memory at copy:0:64, and each of the next ten arm tests warmed the five live arms
up again before failing on the dead one: about 500 of the session's 1,800 device seconds. The arms and the
measurement here are small fakes (pure logic: which calls happen); the real engine death is in
tests/engine/test_engines.py.
"""

import json

import pytest
from repo_paths import ROOT

from specledger.ledger import parse_ledger
from specledger.measure import engines
from specledger.measure.engine_pool import check_gpu_memory
from specledger.measure.session import PointNotMeasured, SuiteSession


class _Arm:
    dead_reason: str | None = None


def _ledger():
    return parse_ledger((ROOT / "ledgers" / "cpu-smollm2.json").read_text(), "cpu-smollm2.json")


def _session(tmp_path, ledger, arms, monkeypatch, measured):
    session = SuiteSession(root=ROOT, record=True, out_dir=tmp_path)
    session.pool._arms[ledger.id] = arms  # the ledger's engines, as if started

    def measure_one(ledger, key, arms, **_):
        measured.append(key)
        arms["ngram"].dead_reason = "run: vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue"
        raise engines.ArmRunError("arm ngram: run failed in the worker and its engine died", arm="ngram",
                                  engine_dead=True)

    monkeypatch.setattr(session, "_measure_one", measure_one)
    return session


def test_a_failed_point_fails_its_other_arm_tests_without_measuring_again(tmp_path, monkeypatch):
    ledger, measured = _ledger(), []
    arms = {"baseline": _Arm(), "ngram": _Arm()}
    session = _session(tmp_path, ledger, arms, monkeypatch, measured)
    key = ("copy", 0.0, 1)
    with pytest.raises(engines.ArmRunError, match="its engine died"):
        session.measure(ledger, key)
    with pytest.raises(PointNotMeasured, match="copy:0:1 not measured again: it failed once in this session.*"
                                               "ArmRunError: arm ngram: run failed"):
        session.measure(ledger, key)
    assert measured == [key], "the point's second arm test measured it again"


def test_a_dead_engine_stops_every_later_point_of_its_ledger_at_once(tmp_path, monkeypatch):
    ledger, measured = _ledger(), []
    arms = {"baseline": _Arm(), "ngram": _Arm()}
    session = _session(tmp_path, ledger, arms, monkeypatch, measured)
    with pytest.raises(engines.ArmRunError):
        session.measure(ledger, ("copy", 0.0, 64))
    with pytest.raises(PointNotMeasured, match=r"copy:0:8 not measured: an engine of cpu-smollm2 died earlier "
                                               r"in this session \(arm ngram: run: .*EngineDeadError.*"
                                               r"--ledger-only-missing"):
        session.measure(ledger, ("copy", 0.0, 8))
    assert measured == [("copy", 0.0, 64)]
    assert session.pool.dead_arms(ledger.id) == {"ngram": arms["ngram"].dead_reason}


def test_a_point_that_failed_for_a_passing_reason_is_not_remembered(tmp_path, monkeypatch):
    """A busy machine may quieten: the point's next arm test looks again."""
    from specledger.measure.session import BusyMachine

    ledger, calls = _ledger(), []
    session = SuiteSession(root=ROOT, record=True, out_dir=tmp_path)
    session.pool._arms[ledger.id] = {"baseline": _Arm()}

    def busy(*_, **__):
        calls.append(1)
        raise BusyMachine("busy")

    monkeypatch.setattr(session, "_measure_one", busy)
    for _ in range(2):
        with pytest.raises(BusyMachine):
            session.measure(ledger, ("copy", 0.0, 1))
    assert len(calls) == 2


def _h100_like(fraction: float):
    data = json.loads((ROOT / "ledgers" / "h200-qwen2.5-coder-1.5b.json").read_text())
    data["engine_args"]["gpu_memory_utilization"] = fraction
    return parse_ledger(json.dumps(data), "h200-qwen2.5-coder-1.5b.json")


def test_arms_that_do_not_fit_this_gpu_are_refused_before_any_engine_starts():
    """The six Qwen arms at 0.15: 84.3 GiB on the H100's 79.65 GiB, refused; they fit the H200's 140.4 GiB, and at
    0.12 the H100 too. A CPU ledger, or no nvidia-smi, is not checked."""
    with pytest.raises(ValueError, match=r"h200-qwen2.5-coder-1.5b.json: \$.engine_args.gpu_memory_utilization: not "
                                         r"started on this GPU \(79.65 GiB\): the 6 arms do not fit.*84.3 GiB.*at "
                                         r"most 0.14 an arm"):
        check_gpu_memory(_h100_like(0.15), memory_gib=79.65)
    check_gpu_memory(_h100_like(0.15), memory_gib=140.4)
    check_gpu_memory(_h100_like(0.12), memory_gib=79.65)
    check_gpu_memory(_ledger(), memory_gib=1.0)


def test_nvidia_smi_memory_reads_the_smallest_gpu():
    assert engines.memory_gib_of("81559\n") == 79.65
    assert engines.memory_gib_of("143771\n81559\n") == 79.65
    assert engines.memory_gib_of("[N/A]\n") is None and engines.memory_gib_of("") is None


def test_no_arm_up_fails_each_arm_test_with_its_own_start_error(tmp_path):
    """Every arm failed to start: the point is not measured (no IndexError on an empty arm list), and each arm's
    test says why its arm did not start."""
    from specledger.ledger.selection import LedgerPoint
    from specledger.measure import point_check

    ledger = _ledger()
    session = SuiteSession(root=ROOT, record=True, out_dir=tmp_path)
    session.pool._arms[ledger.id] = {}
    session.pool._failed_arms[ledger.id] = {arm["name"]: engines.EngineStartError(f"{arm['name']}: no memory")
                                            for arm in ledger.arms}
    with pytest.raises(PointNotMeasured, match="copy:0:1 not measured: no arm of cpu-smollm2 started"):
        session.measure(ledger, ("copy", 0.0, 1))
    outcome = point_check.check(session, LedgerPoint(ledger, "ngram", "copy", 0.0, 1))
    assert outcome.status == "failed" and "arm ngram did not start:\nngram: no memory" in outcome.message
