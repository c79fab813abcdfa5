"""The nightly GPU workflow verifies every GPU ledger once, each on a runner with the GPUs its engines span.

The file is read as YAML, as GitHub reads it: an unquoted step name holding ': ' had made it unparsable."""

from __future__ import annotations

import yaml
from repo_paths import ROOT

from specledger.gpu_assignment import gpus_needed
from specledger.ledger import load_ledger

WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "gpu-nightly.yml").read_text())
GROUPS = WORKFLOW["jobs"]["verify"]["strategy"]["matrix"]["include"]
GPU_LEDGERS = {f"ledgers/{p.name}": load_ledger(p) for p in sorted((ROOT / "ledgers").glob("*.json"))}
GPU_LEDGERS = {path: ledger for path, ledger in GPU_LEDGERS.items()  # what pytest -m gpu measures; not references
               if ledger.is_gpu() and ledger.status != "reference"}


def test_every_gpu_ledger_is_in_exactly_one_group():
    listed = [path for group in GROUPS for path in group["ledgers"].split()]
    assert sorted(listed) == sorted(GPU_LEDGERS)  # none missing, none twice, none that pytest -m gpu would not run


def test_a_group_runs_on_a_runner_with_the_gpus_its_ledgers_span():
    for group in GROUPS:
        needed = max(gpus_needed(GPU_LEDGERS[path].data) for path in group["ledgers"].split())
        label = "gpu" if needed == 1 else f"gpu-x{needed}"
        assert group["runner"] == label, f"group {group['group']} needs {needed} GPUs per engine"


def test_the_verify_step_keeps_the_exit_status_of_the_verification():
    run = next(step["run"] for step in WORKFLOW["jobs"]["verify"]["steps"] if "gpu-run verify" in step.get("run", ""))
    assert "| tee" not in run or "pipefail" in run  # a pipe into tee, without pipefail, turned failures green
    assert "continue-on-error" not in next(s for s in WORKFLOW["jobs"]["verify"]["steps"] if s.get("run") == run)
