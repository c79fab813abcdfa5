"""A ledger from someone else must not run code through engine settings (specledger.ledger.trust)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from repo_paths import CPU_LEDGER, ROOT

from specledger.cli import main
from specledger.ledger import iter_ledger_paths, load_ledger, trust
from specledger.measure import engines


def _hostile(tmp_path: Path) -> Path:
    data = json.loads(CPU_LEDGER.read_text())
    data["id"] = "hostile"
    data["engine_args"]["trust_remote_code"] = True
    data["arms"][0]["engine_args"] = {"worker_extension_cls": "evil.Extension"}
    data["arms"][1]["env"] = {"LD_PRELOAD": "/tmp/evil.so", "VLLM_USE_V2_MODEL_RUNNER": "0"}
    data["arms"][1]["speculative_config"]["worker_cls"] = "evil.Worker"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("path", iter_ledger_paths([ROOT / "ledgers", ROOT / "tests" / "data"]), ids=lambda p: p.name)
def test_every_committed_ledger_needs_no_trust(path: Path) -> None:
    ledger = load_ledger(path)
    assert trust.untrusted_settings(ledger.data, str(path)) == []


def test_each_setting_outside_the_allowlist_is_named_with_its_json_path(tmp_path: Path) -> None:
    path = _hostile(tmp_path)
    data = load_ledger(path).data
    problems = trust.untrusted_settings(data, str(path))
    assert [(p.json_path, p.message) for p in problems] == [
        ("$.engine_args.trust_remote_code", "engine argument 'trust_remote_code' is not allowed"),
        ("$.arms[0].engine_args.worker_extension_cls", "engine argument 'worker_extension_cls' is not allowed"),
        ("$.arms[1].env.LD_PRELOAD", "environment variable 'LD_PRELOAD' is not allowed"),
        ("$.arms[1].speculative_config.worker_cls", "speculative_config key 'worker_cls' is not allowed"),
    ]
    assert all(p.file == str(path) for p in problems)
    with pytest.raises(trust.UntrustedLedger, match="hostile.json") as info:
        engines.arm_specs(data, "/models/x", source=str(path))
    assert "--ledger-trust" in str(info.value)
    specs = engines.arm_specs(data, "/models/x", source=str(path), trusted=True)  # the user's explicit choice
    assert specs[0].engine_args["trust_remote_code"] is True


def test_pytest_refuses_a_hostile_ledger_before_any_engine_starts(inner_pytest: pytest.Pytester,
                                                                  tmp_path: Path) -> None:
    path = _hostile(tmp_path)
    t0 = time.monotonic()
    result = inner_pytest.runpytest_inprocess(
        str(ROOT / "tests" / "engine" / "test_ledgers.py"), "-p", "no:cacheprovider", "-q", "-m", "not gpu",
        "-o", "addopts=", "--ledger", str(path), "--ledger-points", "copy:0:1", "-p", "no:benchmark")
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    result.assert_outcomes(failed=2)
    assert "$.engine_args.trust_remote_code" in out and "$.arms[1].env.LD_PRELOAD" in out
    assert "Traceback" not in out and "starting arm" not in out
    assert time.monotonic() - t0 < 120


def test_crosscheck_refuses_a_hostile_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _hostile(tmp_path)
    assert main(["crosscheck", str(path), "--point", "copy:0:2", "--arm", "ngram"]) == 1
    err = capsys.readouterr().err
    assert "$.arms[1].speculative_config.worker_cls" in err and "--trust" in err
