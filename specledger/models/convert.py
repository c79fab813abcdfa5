"""GGUF weights and metadata as a plain Hugging Face model: config.json, dequantized tensors under
transformers' names, and the checks that a built folder loads the way an engine will load it.

Why: vLLM loads plain Hugging Face folders reliably; its GGUF path is narrower and differs between engines.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.models.files import progress
from specledger.models.metadata import read_field
from specledger.models.registry import EmbeddedModel, EmbeddedModelError

if TYPE_CHECKING:
    from gguf import GGUFReader


@dataclass(frozen=True)
class _GGUFArch:
    """How one GGUF architecture maps onto a transformers model (names, config keys, q/k layout)."""

    model_type: str
    architecture: str
    global_tensors: dict[str, str]
    block_tensors: dict[str, str]
    # llama.cpp's converter interleaves q/k rows for its rotary kernel; undo that for HF layout.
    permute_qk: bool
    config_extra: dict[str, Any] = field(default_factory=dict)


_LLAMA = _GGUFArch(
    model_type="llama",
    architecture="LlamaForCausalLM",
    global_tensors={
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
    },
    block_tensors={
        "attn_norm.weight": "input_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    },
    permute_qk=True,
    config_extra={"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1},
)

# llama.cpp's converter leaves Qwen2's q/k rows alone (its Qwen2Model is not a LlamaModel, and
# transformers' GGUF loader has no qwen2 tensor processor): no permutation. q/k/v have biases.
_QWEN2 = _GGUFArch(
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    global_tensors=_LLAMA.global_tensors,
    block_tensors={
        **_LLAMA.block_tensors,
        "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.bias": "self_attn.v_proj.bias",
    },
    permute_qk=False,
    # Qwen2.5's config: sliding window off (its 32768 window would equal the context anyway).
    config_extra={"hidden_act": "silu", "use_sliding_window": False, "sliding_window": None},
)

# `general.architecture` -> mapping. Add entries for new models.
GGUF_ARCHS: dict[str, _GGUFArch] = {"llama": _LLAMA, "qwen2": _QWEN2}


def gguf_arch(reader: GGUFReader) -> tuple[str, _GGUFArch]:
    name = read_field(reader, "general.architecture")
    if name not in GGUF_ARCHS:
        raise EmbeddedModelError(f"unsupported GGUF architecture {name!r}; known: {sorted(GGUF_ARCHS)}")
    return name, GGUF_ARCHS[name]


def hf_config_dict(reader: GGUFReader, dtype: str = "float32") -> dict[str, Any]:
    """config.json contents from GGUF metadata: a plain config with nothing GGUF-specific in it.

    vocab_size is the embedding's row count, which may exceed the tokenizer (Qwen2.5 pads to 151936).
    """
    name, arch = gguf_arch(reader)
    rope_keys = [k for k in reader.fields if k.startswith(f"{name}.rope.scaling.")]
    if rope_keys:
        raise EmbeddedModelError(f"GGUF rope scaling is not supported yet ({rope_keys})")
    tensor_names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise EmbeddedModelError("GGUF has no token_embd.weight")
    rows = int(embd.shape[-1])  # GGUF lists dims fastest-first: [hidden, rows]
    hidden = int(read_field(reader, f"{name}.embedding_length"))
    heads = int(read_field(reader, f"{name}.attention.head_count"))
    head_dim = int(
        read_field(
            reader,
            f"{name}.attention.key_length",
            read_field(reader, f"{name}.rope.dimension_count", hidden // heads),
        )
    )
    rope_theta = float(read_field(reader, f"{name}.rope.freq_base", 10000.0))
    cfg: dict[str, Any] = {
        "architectures": [arch.architecture],
        "model_type": arch.model_type,
        "vocab_size": int(read_field(reader, f"{name}.vocab_size", rows)),
        "hidden_size": hidden,
        "intermediate_size": int(read_field(reader, f"{name}.feed_forward_length")),
        "num_hidden_layers": int(read_field(reader, f"{name}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(read_field(reader, f"{name}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(read_field(reader, f"{name}.context_length")),
        # float32 -> python float keeps the GGUF's exact value (9.999999747378752e-06), as the original
        # config's 1e-05 was stored in float32 by llama.cpp; the difference is far below numeric noise.
        "rms_norm_eps": float(read_field(reader, f"{name}.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": read_field(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": read_field(reader, "tokenizer.ggml.eos_token_id", None),
        "pad_token_id": read_field(reader, "tokenizer.ggml.padding_token_id", None),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        # Both spellings: transformers 5 reads "dtype", older readers "torch_dtype".
        "dtype": dtype,
        "torch_dtype": dtype,
        # Without it transformers 5 takes any local folder for an old Mistral one and warns about its
        # regex on every tokenizer load. Folders built before this key are otherwise identical.
        "transformers_version": versions().get("transformers", "5.0.0"),
        **arch.config_extra,
    }
    return cfg


def _reverse_permute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation (rotary pairs interleaved per head): HF uses half-split."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def dequantize_threads() -> int:
    """Threads for `dequantize_state`: $SPECLEDGER_DEQUANT_THREADS, else one per core up to 16.

    Why threads: gguf's dequantizers are numpy array arithmetic, which releases the GIL, and a bare GPU
    machine has 16 cores idle while the Qwen pair dequantizes (82 s and 138 s in one thread, GPU time).
    """
    raw = os.environ.get("SPECLEDGER_DEQUANT_THREADS")
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise EmbeddedModelError(f"SPECLEDGER_DEQUANT_THREADS must be a whole number >= 1, not {raw!r}")
        return int(raw)
    return max(1, min(16, os.cpu_count() or 1))


# Elements per dequantization task: 4M (16 MiB of float32, ~0.6 s of one core at the 1.5B embedding's 34 s
# for 233M) keeps the last tasks' tail short, while the 1.5B stays a few hundred tasks, not thousands.
DEQUANT_CHUNK_ELEMENTS = 1 << 22


def dequant_row_chunks(
    rows: int, row_elements: int, chunk_elements: int = DEQUANT_CHUNK_ELEMENTS
) -> list[tuple[int, int]]:
    """Row ranges [a, b) that split a tensor of `rows` rows into tasks of at most ~`chunk_elements`.

    Why: one tensor in one thread made the 1.5B's embedding (34 s) the whole build's critical path.
    Ranges cover 0..rows once, in order; a tensor of at most `chunk_elements` is one range, and a row
    is never split (a quantized row is whole blocks, so rows a..b dequantize alone).
    """
    step = max(1, chunk_elements // max(1, row_elements))
    return [(a, min(a + step, rows)) for a in range(0, rows, step)] or [(0, rows)]


def tensor_row_chunks(t: Any, chunk_elements: int = DEQUANT_CHUNK_ELEMENTS) -> list[tuple[int, int]]:
    """`dequant_row_chunks` for a gguf ReaderTensor, along axis 0 of t.data, or one range for all of it.

    t.data of a quantized tensor is uint8 with one row's bytes on its last axis, and gguf's `dequantize`
    keeps leading axes, so t.data[a:b] dequantizes to rows a..b. A 1-D tensor is never split.
    """
    rows = int(t.data.shape[0])
    if t.data.ndim < 2 or rows < 2:
        return [(0, rows)]
    return dequant_row_chunks(rows, int(t.n_elements) // rows, chunk_elements)


@dataclass
class _Dequant:
    """One GGUF tensor in flight: its float32 rows arrive chunk by chunk; the last chunk finishes it."""

    tensor: Any
    hf: str
    suffix: str
    chunks: list[tuple[int, int]]
    remaining: int = field(init=False)  # chunks not yet written; counts down to the one that finishes
    buffer: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.remaining = len(self.chunks)


def dequantize_state(
    reader: GGUFReader,
    cfg: dict[str, Any],
    threads: int | None = None,
    chunk_elements: int = DEQUANT_CHUNK_ELEMENTS,
) -> dict[str, Any]:
    """All GGUF tensors as torch tensors of cfg["dtype"] under transformers names, in the GGUF's order.

    Each tensor goes through float32 and is cast right away, not a float32 copy of the whole model. The
    tensors are independent, and a tensor of more than `chunk_elements` is split into row ranges
    (`dequant_row_chunks`), so `threads` (default `dequantize_threads()`) share even the biggest one and
    the wall time is about total work / threads, not the embedding's time in one thread. A split tensor's
    chunks are written into one float32 array of its full size, which lives from its first chunk to its
    cast; tasks run in order, so the peak is the result plus at most threads + 1 float32 tensors in flight
    (the 1.5B's embedding: 0.9 GB) plus one float32 chunk per thread. The result depends on neither the
    thread count nor the chunking (tests/models/test_models.py checks both bit for bit).
    """
    import numpy as np
    import torch
    from gguf.quants import dequantize

    _, arch = gguf_arch(reader)
    dtype = getattr(torch, cfg["dtype"])

    def names(t: Any) -> tuple[str, str]:
        if t.name in arch.global_tensors:
            return arch.global_tensors[t.name], ""
        parts = t.name.split(".", 2)
        if len(parts) != 3 or parts[0] != "blk" or parts[2] not in arch.block_tensors:
            raise EmbeddedModelError(f"unexpected GGUF tensor {t.name!r}")
        return f"model.layers.{int(parts[1])}.{arch.block_tensors[parts[2]]}", parts[2]

    def finish(job: _Dequant, w: Any) -> Any:
        """The whole tensor's float32 values -> HF layout and dtype (sees the whole tensor: q/k permute)."""
        t = job.tensor
        expected_shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first
        if w.shape != expected_shape:
            w = w.reshape(expected_shape)
        if arch.permute_qk and job.suffix == "attn_q.weight":
            w = _reverse_permute(w, cfg["num_attention_heads"])
        elif arch.permute_qk and job.suffix == "attn_k.weight":
            w = _reverse_permute(w, cfg["num_key_value_heads"])
        if not (w.flags.writeable and w.flags.c_contiguous):  # float tensors come straight from the mmap
            w = w.copy()
        tensor = torch.from_numpy(w)
        return tensor if dtype == torch.float32 else tensor.to(dtype)

    def run(job: _Dequant, a: int, b: int) -> Any:
        """Dequantize rows a..b; the task that completes the tensor returns it finished, the others None."""
        t = job.tensor
        if len(job.chunks) == 1:  # whole tensor, as before chunking: no staging copy
            return finish(job, np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32))
        part = np.asarray(dequantize(t.data[a:b], t.tensor_type), dtype=np.float32)
        with job.lock:
            if job.buffer is None:
                job.buffer = np.empty((int(t.data.shape[0]), *part.shape[1:]), dtype=np.float32)
            buffer = job.buffer
        buffer[a:b] = part
        del part
        with job.lock:
            job.remaining -= 1
            if job.remaining:
                return None
            job.buffer = None
        return finish(job, buffer)

    jobs = []
    for t in reader.tensors:
        hf, suffix = names(t)
        chunks = tensor_row_chunks(t, chunk_elements)
        jobs.append(_Dequant(t, hf, suffix, chunks))

    state: dict[str, Any] = {}
    t0 = last = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads or dequantize_threads()) as pool:
        # Submitted in the GGUF's order and run first in, first out: a big tensor's chunks go to all threads.
        tasks = [[pool.submit(run, job, a, b) for a, b in job.chunks] for job in jobs]
        try:
            for n, (job, futures) in enumerate(zip(jobs, tasks, strict=True), 1):
                done = [f.result() for f in futures]
                state[job.hf] = next(x for x in done if x is not None)
                if time.monotonic() - last > 10 and n < len(jobs):
                    last = time.monotonic()
                    progress(f"  {n}/{len(jobs)} tensors after {last - t0:.0f}s")
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # don't dequantize the rest for nothing
            raise
    if cfg["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    return state


def check_against_transformers(state: dict[str, Any], cfg: dict[str, Any]) -> None:
    """Every parameter transformers expects is present with the right shape (catches name-map mistakes)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("dtype", "torch_dtype")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg["tie_word_embeddings"]:
        expected.pop("lm_head.weight", None)
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:5]
        extra = sorted(set(got) - set(expected))[:5]
        wrong = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])[:5]
        raise EmbeddedModelError(
            f"weights do not match {cfg['architectures'][0]}: "
            f"missing {missing}, unexpected {extra}, wrong shape {wrong}"
        )


def check_spec(spec: EmbeddedModel, cfg: dict[str, Any], n_tokens: int) -> None:
    problems = []
    if spec.vocab_size is not None and cfg["vocab_size"] != spec.vocab_size:
        problems.append(f"vocab_size {cfg['vocab_size']} != {spec.vocab_size}")
    if spec.tokenizer_size is not None and n_tokens != spec.tokenizer_size:
        problems.append(f"{n_tokens} GGUF tokens (without [PAD] fillers) != {spec.tokenizer_size}")
    if n_tokens > cfg["vocab_size"]:
        problems.append(f"{n_tokens} GGUF tokens > vocab_size {cfg['vocab_size']} embedding rows")
    if spec.tie_word_embeddings is not None and cfg["tie_word_embeddings"] != spec.tie_word_embeddings:
        problems.append(f"tie_word_embeddings {cfg['tie_word_embeddings']} != {spec.tie_word_embeddings}")
    if cfg["head_dim"] < spec.min_head_dim:
        problems.append(f"head_dim {cfg['head_dim']} < {spec.min_head_dim}")
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        problems.append("head_dim * num_attention_heads != hidden_size")
    if problems:
        raise EmbeddedModelError(f"{spec.name}: unexpected GGUF model: " + "; ".join(problems))


def verify_folder(out: Path, cfg: dict[str, Any], n_tokens: int) -> None:
    """Reload what we wrote the way an engine would, so a bad folder never gets a marker."""
    from transformers import AutoConfig, AutoTokenizer

    loaded = AutoConfig.from_pretrained(str(out))
    d = loaded.to_dict()
    leftovers = [k for k in d if "gguf" in k.lower() or k == "quantization_config"]
    if loaded.model_type != cfg["model_type"] or leftovers:
        raise EmbeddedModelError(f"saved config is not a plain {cfg['model_type']} config ({leftovers})")
    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) != n_tokens or len(tok) > loaded.vocab_size:
        raise EmbeddedModelError(
            f"saved tokenizer has {len(tok)} entries, expected {n_tokens} (model rows {loaded.vocab_size})"
        )


def versions() -> dict[str, str]:
    out = {}
    for dist in ("transformers", "tokenizers", "gguf", "torch", "safetensors"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out
