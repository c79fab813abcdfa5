"""Which engine settings a ledger may carry: a ledger from someone else must not run code.

A ledger's ``engine_args``, each arm's ``engine_args`` and ``env``, and its ``speculative_config``
go to vLLM verbatim when the suite starts engines (in-process or as OpenAI servers). Several vLLM
settings load code by name or from the model's folder (``trust_remote_code``, ``worker_cls``,
``worker_extension_cls``, ``distributed_executor_backend``, ``logits_processors``,
``kv_transfer_config``, ``hf_overrides``, ``compilation_config`` passes, ...) and some environment
variables do the same for any process (``LD_PRELOAD``, ``PYTHONPATH``, ``VLLM_PLUGINS``). So a
ledger from a pull request could run code on the GPU runner through ``pytest -m gpu``.

The rule is an allowlist, not a denylist: a setting is passed on only when it is in the sets below,
which hold what measurement needs (memory, batch and length limits, scheduling, dtypes, CUDA
graphs, parallelism, the drafter's own knobs). Anything else is refused before any engine starts,
with the ledger's file, the JSON path and the key, unless the caller trusts the ledger explicitly
(``pytest --ledger-trust``, ``specledger crosscheck --trust``). `specledger validate` and `audit`
never start engines, so they need no trust.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specledger.errors import SpecledgerError
from specledger.ledger.model import Problem, json_path

__all__ = ["ENGINE_ARGS", "ENV", "SPECULATIVE_CONFIG", "UntrustedLedger", "untrusted_settings", "check"]

#: Engine arguments a ledger may set: sizes, limits, scheduling, numerics, graphs, parallelism.
ENGINE_ARGS = frozenset({
    "async_scheduling", "block_size", "cpu_offload_gb", "cuda_graph_sizes", "device", "disable_log_stats",
    "dtype", "enable_chunked_prefill", "enable_prefix_caching", "enforce_eager", "gpu_memory_utilization",
    "kv_cache_dtype", "kv_cache_memory_bytes", "long_prefill_token_threshold", "max_model_len",
    "max_num_batched_tokens", "max_num_partial_prefills", "max_num_seqs", "max_seq_len_to_capture",
    "num_gpu_blocks_override", "pipeline_parallel_size", "quantization", "scheduling_policy", "seed",
    "swap_space", "tensor_parallel_size",
})
#: speculative_config keys a ledger may set (the drafter's model is a name or folder: loading weights
#: runs no code without trust_remote_code, which is not allowed anywhere).
SPECULATIVE_CONFIG = frozenset({
    "method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size", "prompt_lookup_min",
    "prompt_lookup_max", "draft_tensor_parallel_size", "disable_padded_drafter_batch", "quantization",
    "max_model_len", "revision", "code_revision", "draft_sample_method",
})
#: Environment variables an arm may set: engine selection and CPU-engine sizing.
ENV = frozenset({
    "VLLM_USE_V2_MODEL_RUNNER", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ATTENTION_BACKEND",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_FLASH_ATTN_VERSION", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
})


class UntrustedLedger(SpecledgerError, ValueError):
    """The ledger carries engine settings outside the allowlist; nothing was started."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(
            f"{problems[0].file}: engine settings outside specledger's allowlist (a ledger must not be able "
            f"to run code through vLLM); nothing was started:\n{lines}\n"
            "Trust this ledger explicitly to pass them on: pytest --ledger-trust, specledger crosscheck --trust")


def _unknown(where: Mapping[str, Any] | None, allowed: frozenset[str], parts: list[str | int], file: str,
             what: str) -> list[Problem]:
    return [Problem(file, json_path([*parts, key]), f"{what} {key!r} is not allowed")
            for key in (where or {}) if key not in allowed]


def untrusted_settings(data: Mapping[str, Any], file: str) -> list[Problem]:
    """Every engine setting of a ledger outside the allowlist, each with its JSON path (empty: all allowed)."""
    problems = _unknown(data.get("engine_args"), ENGINE_ARGS, ["engine_args"], file, "engine argument")
    for i, arm in enumerate(data.get("arms") or []):
        problems += _unknown(arm.get("engine_args"), ENGINE_ARGS, ["arms", i, "engine_args"], file, "engine argument")
        problems += _unknown(arm.get("env"), ENV, ["arms", i, "env"], file, "environment variable")
        problems += _unknown(arm.get("speculative_config"), SPECULATIVE_CONFIG, ["arms", i, "speculative_config"],
                             file, "speculative_config key")
    return problems


def check(data: Mapping[str, Any], file: str, *, trusted: bool = False) -> None:
    """Raise UntrustedLedger unless every engine setting is allowed or the caller trusts the ledger."""
    if trusted:
        return
    problems = untrusted_settings(data, file)
    if problems:
        raise UntrustedLedger(problems)
