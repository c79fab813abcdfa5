"""Start a ledger's arms once, one after another, and stop: the compile caches fill, nothing is measured.

Run on the GPU machine under `scripts/gpu-visit start python3 scripts/gpu-warm-cache.py [LEDGER] [ARM...]`
(default: ledgers/h200-smollm2-copy.json, arm baseline). gpu-visit points vLLM's, Inductor's, Triton's and
FlashInfer's caches into one folder and brings it back in parts for the next visit. Why: a visit with device
time left over but too little for a point can still pay a later visit's engine builds in advance. It writes
$RESULTS_DIR/warm-cache.json: each arm's start seconds, engine-build seconds, KV tokens and effective config,
and which FlashInfer JIT modules the start built, so the before/after of issue 17 comes from a real start.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _flashinfer_modules(root: Path) -> list[str]:
    """The FlashInfer JIT modules (shared objects) under the cache folder gpu-visit set."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.so")) if root.is_dir() else []


def main(argv: list[str]) -> int:
    from specledger.ledger import load_ledger
    from specledger.measure import engines
    from specledger.models import resolve_model

    ledger = load_ledger(argv[0] if argv else "ledgers/h200-smollm2-copy.json")
    arms = argv[1:] or ["baseline"]
    out = Path(os.environ.get("RESULTS_DIR", "/tmp/results"))
    out.mkdir(parents=True, exist_ok=True)
    flashinfer = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", Path.home())) / ".cache" / "flashinfer"
    before = _flashinfer_modules(flashinfer)
    t0 = time.monotonic()
    model = resolve_model(ledger.data["target"]["model"])
    model_s = time.monotonic() - t0
    started_arms: dict[str, dict[str, object]] = {}
    for spec in engines.arm_specs(ledger.data, model, arms, source=str(ledger.path)):
        started = time.monotonic()
        (arm,) = engines.start_arms([spec], progress=lambda m: print(f"[warm-cache] {m}", flush=True))
        try:
            build_s = engines.build_seconds(arm.info)
            started_arms[spec.name] = {
                "start_s": round(time.monotonic() - started, 1),
                "engine_build_s": None if build_s is None else round(build_s, 1),
                "kv_cache": arm.info.get("kv_cache"),
                "effective_config": arm.info.get("effective_config"),
            }
        finally:
            arm.close()
    built = sorted(set(_flashinfer_modules(flashinfer)) - set(before))
    report = {"ledger": ledger.id, "model_build_s": round(model_s, 1), "arms": started_arms,
              "flashinfer_modules_before": before, "flashinfer_modules_built": built}
    (out / "warm-cache.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "arms"}, indent=1))
    for name, arm_report in started_arms.items():
        print(f"[warm-cache] {name}: start {arm_report['start_s']} s, build {arm_report['engine_build_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
