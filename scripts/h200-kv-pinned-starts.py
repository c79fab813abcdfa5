"""Issue 17 experiment: start every arm of a ledger at once, each with its KV capacity pinned to the ledger's.

Why: the arms of a GPU ledger start one after another (specledger.measure.engines.start_arms) because vLLM sizes
the KV cache from the free memory it sees while profiling, and a neighbour allocating at the same time shrinks it
(a Qwen ngram server once saw 0.06 GiB). Sequential starts cost 256-455 s of every H200 visit for six arms. And
the sequential default is not stable either: on 2026-12-02 the same six arms got 0.6-1.7% more KV blocks with a
restored compile cache than without. Pinning each arm to the block count the ledger recorded
(`num_gpu_blocks_override`) with an explicit `kv_cache_memory_bytes` (no profiling-based sizing) would make the
capacity a ledger fact instead of a start-time accident, and would let the starts overlap.

This script measures nothing on the ledger: it starts the pinned arms concurrently, compares each arm's KV capacity
and effective config with the ledger's (recorded by sequential default starts), checks that every arm generates,
and writes kv-pinned-starts.json under $RESULTS_DIR. Run on the GPU machine from the checkout with
PYTHONPATH=/tmp/site:. ; on a CPU machine, PIN_LEDGER=ledgers/cpu-smollm2.json makes it a dry run.
The suite's own path for this is `--ledger-kv-sizing pinned` (specledger.measure.engines.pinned); this script
stays as it ran for reports/evidence/2026-12-02-h200-kv-pinned-starts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

LEDGER = os.environ.get("PIN_LEDGER", "ledgers/h200-qwen2.5-coder-1.5b.json")
#: The KV memory each arm may size from (bytes); the pinned block count decides what it allocates.
KV_CACHE_MEMORY_BYTES = int(os.environ.get("PIN_KV_BYTES", str(18 * 2**30)))
PROMPTS = ["Repeat exactly: the quick brown fox jumps over the lazy dog.", "Write one sentence about rivers."]


def main() -> int:
    from specledger.ledger import load_ledger
    from specledger.measure import engines
    from specledger.models.build import resolve_model

    out = Path(os.environ.get("RESULTS_DIR", "/tmp/results"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def log(line: str) -> None:
        print(f"[pin {time.monotonic() - t0:7.1f} s] {line}", flush=True)

    ledger = load_ledger(Path(LEDGER))
    model = resolve_model(ledger.data["target"]["model"])
    log(f"model ready: {model}")
    recorded = {arm["name"]: arm for arm in ledger.arms}
    specs = []
    for spec in engines.arm_specs(ledger.data, model, trusted=True):
        blocks = int(recorded[spec.name]["kv_cache"]["num_blocks"])
        args = {**spec.engine_args, "num_gpu_blocks_override": blocks, "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES}
        specs.append(engines.ArmSpec(name=spec.name, role=spec.role, engine_args=args, env=dict(spec.env)))
    arms = [engines.ArmEngine(spec) for spec in specs]
    report: dict[str, Any] = {"ledger": LEDGER, "kv_cache_memory_bytes": KV_CACHE_MEMORY_BYTES, "arms": {}}
    errors: dict[str, str] = {}
    ready_s: dict[str, float] = {}

    def start(arm: engines.ArmEngine) -> None:
        try:
            arm.start()
            ready_s[arm.spec.name] = round(time.monotonic() - t_start, 1)
            log(f"{arm.spec.name} up at {ready_s[arm.spec.name]} s: KV {arm.info['kv_cache']}")
        except BaseException as exc:  # noqa: BLE001 -- recorded, the others go on
            errors[arm.spec.name] = f"{type(exc).__name__}: {str(exc)[-3000:]}"
            log(f"{arm.spec.name} FAILED: {errors[arm.spec.name][-600:]}")

    try:
        for arm in arms:
            arm.spawn()
        t_start = time.monotonic()
        threads = [threading.Thread(target=start, args=(arm,)) for arm in arms]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report["all_up_s"] = round(time.monotonic() - t_start, 1)
        log(f"{len(ready_s)} of {len(arms)} arms up in {report['all_up_s']} s")
        for arm in arms:
            name = arm.spec.name
            entry: dict[str, Any] = {"ready_s": ready_s.get(name), "error": errors.get(name)}
            if name in ready_s:
                was = recorded[name]
                entry["kv_cache"] = arm.info["kv_cache"]
                entry["kv_cache_recorded"] = was["kv_cache"]
                entry["kv_equal"] = arm.info["kv_cache"]["num_blocks"] == was["kv_cache"]["num_blocks"]
                now_cfg, was_cfg = arm.info["effective_config"], was.get("effective_config") or {}
                entry["config_differences"] = {k: [was_cfg.get(k), now_cfg.get(k)]
                                               for k in sorted(set(now_cfg) | set(was_cfg))
                                               if now_cfg.get(k) != was_cfg.get(k)}
                entry["engine_build_s"] = engines.build_seconds(arm.info)
                passed = arm.prompt_pass(prompts=PROMPTS, concurrency=2,
                                         sampling={"temperature": 0.0, "max_tokens": 16, "top_p": 1.0, "seed": 0})
                entry["pass"] = {k: v for k, v in passed.items() if isinstance(v, (int, float))}
            report["arms"][name] = entry
            log(f"{name}: {json.dumps(entry)[:400]}")
    finally:
        for arm in arms:
            arm.close()
        report["wall_s"] = round(time.monotonic() - t0, 1)
        (out / "kv-pinned-starts.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        log(f"written {out / 'kv-pinned-starts.json'}")
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
