"""Reading a GGUF's metadata as plain Python values, across gguf releases (the tokenizer and the converter
both read it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specledger.models.registry import EmbeddedModelError

if TYPE_CHECKING:
    from gguf import GGUFReader


MISSING = object()


def read_field(reader: GGUFReader, key: str, default: Any = MISSING) -> Any:
    """A GGUF metadata value as a Python value (str, int, float, bool or list)."""
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None:
        if default is MISSING:
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
