"""Rejoin the acceptance passes that this visit's recording dropped (run once, from the project root).

Why: `replication._acceptance` compared the committed pass's request count with the added one's for equality, so at
a point's third start (committed 86 requests = two passes of 43, added 43) it kept only the added pass. The ledger
at e7d8db9 holds the earlier passes' counts as measured; the ledger this visit wrote holds the added pass's. This
joins the two with the fixed function, the one a recording uses, at the points that had two starts before this
visit and three after it. No throughput, multiplier or window figure is touched.
    python reports/evidence/2026-12-03-h200-qwen-bf16-third-starts/rejoin_acceptance.py
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from specledger.ledger import figures, io
from specledger.measure import replication

PATH = Path("ledgers/h200-qwen2.5-coder-1.5b.json")
NOTE = ("2026-12-03: the third start's recording at copy c=1, 8 and 16 kept only its own acceptance pass (a bug in "
        "replication._acceptance, fixed); the two earlier passes' counts, as committed at e7d8db9, were joined to it "
        "by reports/evidence/2026-12-03-h200-qwen-bf16-third-starts/rejoin_acceptance.py with the fixed function. "
        "Only acceptance counts moved.")
BEFORE = json.loads(subprocess.check_output(["git", "show", f"e7d8db9:{PATH}"]))

if __name__ == "__main__":
    ledger = io.load_ledger(PATH)
    before = {(p["workload"], p["temperature"], p["concurrency"]): p for p in BEFORE["points"]}
    for point in ledger.data["points"]:
        key = (point["workload"], point["temperature"], point["concurrency"])
        old_point = before[key]
        first = next(iter(point["arms"]))
        old_starts = len(set(figures.engine_starts(old_point["arms"][first])))
        new_starts = len(set(figures.engine_starts(point["arms"][first])))
        if not (old_starts == 2 and new_starts == 3):
            continue
        for name, arm in point["arms"].items():
            old_acc, new_acc = old_point["arms"][name].get("acceptance"), arm.get("acceptance")
            if not old_acc or not new_acc or new_acc["requests"] > old_acc["requests"]:
                continue  # nothing to join, or joined already
            k = (ledger.arm(name).get("speculative_config") or {}).get("num_speculative_tokens")
            joined = replication._acceptance(old_acc, new_acc, k, ledger)
            lengths = f"{old_acc['acceptance_length']} and {new_acc['acceptance_length']}"
            print(f"{key} {name}: requests {old_acc['requests']} + {new_acc['requests']} -> {joined['requests']},"
                  f" L {lengths} -> {joined['acceptance_length']}")
            arm["acceptance"] = joined
            arm["speculative_tokens_per_step"] = round(joined["draft_tokens"] / joined["drafts"], 3)
    if NOTE not in ledger.data["notes"]:
        ledger.data["notes"].append(NOTE)
    io.write_ledger(PATH, ledger.data, overwrite=True)
