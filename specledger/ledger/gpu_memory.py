"""Whether a GPU ledger's arms fit side by side on one GPU: one rule, used by `validate` (from the file, before any
GPU time is spent) and by the engine pool (from the GPU it is about to start on).

A ledger's arms run side by side, one vLLM engine each, and vLLM gives each engine `gpu_memory_utilization` of the
whole GPU. Two things must hold:
- the fractions add up to at most `MAX_SUMMED_GPU_MEMORY_UTILIZATION`, or the arms started last cannot start;
- each engine also holds memory outside its fraction (CUDA context, CUDA graphs, the drafter's buffers), so on a
  small GPU the shares plus that extra must fit the card. On 2026-12-05 six Qwen2.5-Coder-1.5B arms at 0.15 all
  started on an H100 80GB (79.18 GiB) and held 12.58-13.90 GiB each at copy:0:64, 0.70-2.02 GiB over their
  11.88 GiB share; the sixth died of CUDA out of memory mid-run, after 900 device seconds
  (reports/evidence/2026-12-05-h100-qwen-bf16-visit2). The same arms fit the H200's 140.4 GiB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ENGINE_GIB_BEYOND_SHARE", "MAX_SUMMED_GPU_MEMORY_UTILIZATION", "VLLM_DEFAULT_GPU_MEMORY_UTILIZATION",
           "arm_fractions", "device_memory_problem", "setting_path", "summed_fraction_problem"]

#: vLLM's own default for `gpu_memory_utilization`, which an arm gets when neither it nor the ledger sets one.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: The most the arms' fractions may add up to: every arm's engine runs side by side on the same GPU(s), and
#: each process also holds a CUDA context outside its fraction.
MAX_SUMMED_GPU_MEMORY_UTILIZATION = 0.95
#: GiB one engine process holds beyond its `gpu_memory_utilization` share: the most measured (2.02 GiB, an ngram
#: arm of vLLM 0.26 at copy:0:64 on 2026-12-05), rounded up.
ENGINE_GIB_BEYOND_SHARE = 2.1


def arm_fractions(data: Mapping[str, Any]) -> list[tuple[str, float]] | None:
    """Each arm's `gpu_memory_utilization` (its own, else the ledger's, else vLLM's default); None when a value is
    not a number (the schema reports that)."""
    shared = data.get("engine_args") if isinstance(data.get("engine_args"), Mapping) else {}
    out = []
    for arm in data.get("arms") or ():
        if not isinstance(arm, Mapping):
            continue
        own = arm.get("engine_args") if isinstance(arm.get("engine_args"), Mapping) else {}
        value = own.get("gpu_memory_utilization",
                        shared.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        out.append((str(arm.get("name")), float(value)))
    return out


def setting_path(data: Mapping[str, Any]) -> list[str]:
    """Where a problem with the fractions is reported: the ledger-wide setting when there is one, else the arms."""
    shared = data.get("engine_args") if isinstance(data.get("engine_args"), Mapping) else {}
    return ["engine_args", "gpu_memory_utilization"] if "gpu_memory_utilization" in shared else ["arms"]


def _listed(fractions: Iterable[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {fraction:g}" for name, fraction in fractions)


def summed_fraction_problem(fractions: list[tuple[str, float]]) -> str | None:
    """Why the arms cannot all start whatever the GPU (their fractions add up past the cap), or None."""
    total = sum(f for _, f in fractions)
    if total <= MAX_SUMMED_GPU_MEMORY_UTILIZATION + 1e-9:
        return None
    return (f"the {len(fractions)} arms run side by side on each GPU, and their gpu_memory_utilization adds up to "
            f"{total:.2f} ({_listed(fractions)}); vLLM reserves each engine's fraction of the whole GPU, so the arms "
            f"started last would not start: keep the sum at most {MAX_SUMMED_GPU_MEMORY_UTILIZATION} (arms not "
            f"setting it get vLLM's default, {VLLM_DEFAULT_GPU_MEMORY_UTILIZATION})")


def device_memory_problem(fractions: list[tuple[str, float]], memory_gib: float) -> str | None:
    """Why the arms do not fit a GPU of `memory_gib` GiB (their shares plus `ENGINE_GIB_BEYOND_SHARE` each), or
    None; the message names the largest equal fraction that would fit."""
    if not fractions or memory_gib <= 0:
        return None
    total = sum(f for _, f in fractions)
    n = len(fractions)
    needed_gib = total * memory_gib + n * ENGINE_GIB_BEYOND_SHARE
    if needed_gib <= memory_gib + 1e-9:
        return None
    largest = math.floor((memory_gib - n * ENGINE_GIB_BEYOND_SHARE) / (n * memory_gib) * 200) / 200
    fix = (f"lower gpu_memory_utilization to at most {largest:g} an arm" if largest > 0
           else "run fewer arms side by side")
    return (f"the {n} arms do not fit side by side on a {memory_gib:.1f} GiB GPU: their shares ({_listed(fractions)}; "
            f"{total:.2f} x {memory_gib:.1f} = {total * memory_gib:.1f} GiB) plus the {ENGINE_GIB_BEYOND_SHARE} GiB "
            f"each engine holds beyond its share (CUDA context, CUDA graphs, drafter buffers) come to "
            f"{needed_gib:.1f} GiB, and an engine that runs out mid-run dies with every later point: {fix}")
