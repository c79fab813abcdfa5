"""The tokenizer of an embedded model, built from the GGUF's own vocabulary, merges and special tokens.

Why not transformers' GGUF tokenizer conversion: see `tokenizer_from_reader`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.models.metadata import read_field
from specledger.models.registry import EmbeddedModelError

if TYPE_CHECKING:
    from gguf import GGUFReader
    from tokenizers.normalizers import Normalizer
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import PreTrainedTokenizerFast


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


def gguf_tokens(reader: GGUFReader) -> tuple[list[str], list[int]]:
    """The GGUF's tokens and types without llama.cpp's trailing `[PAD<id>]` fillers.

    llama.cpp pads the token list up to the embedding rows (Qwen2.5: 151665 real tokens, 151936
    rows) with UNUSED `[PAD<id>]` entries that the original tokenizer does not have.
    """
    tokens: list[str] = read_field(reader, "tokenizer.ggml.tokens")
    types: list[int] = read_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    n = len(tokens)
    while n and types[n - 1] == _TOKEN_TYPE_UNUSED and tokens[n - 1] == f"[PAD{n - 1}]":
        n -= 1
    return tokens[:n], types[:n]


def tokenizer_from_reader(reader: GGUFReader, not_special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE from the GGUF's own vocab and merges.

    Why not transformers' GGUF tokenizer conversion: for SmolLM2 it builds a CodeLlama-style
    tokenizer with 49157 entries for a 49152-row model; for Qwen2.5 it keeps the 271 `[PAD...]`
    fillers and splits `<tool_call>` and the FIM tokens into pieces.
    `not_special`: CONTROL tokens to add as plain added tokens (see `EmbeddedModel.not_special`).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    kind = read_field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise EmbeddedModelError(f"only byte-level BPE GGUF tokenizers are supported, not {kind!r}")
    pre = read_field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise EmbeddedModelError(f"unsupported tokenizer.ggml.pre {pre!r}; known: {sorted(_PRE_TOKENIZERS)}")

    tokens, types = gguf_tokens(reader)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise EmbeddedModelError("GGUF vocabulary has duplicate tokens")
    merges: list[tuple[str, str]] = []
    for m in read_field(reader, "tokenizer.ggml.merges"):
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
        idx = read_field(reader, f"tokenizer.ggml.{key}_token_id", None)
        return tokens[idx] if idx is not None and 0 <= idx < len(tokens) else None

    bos, eos = special("bos"), special("eos")
    add_bos = bool(read_field(reader, "tokenizer.ggml.add_bos_token", False))
    add_eos = bool(read_field(reader, "tokenizer.ggml.add_eos_token", False))
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

    arch = read_field(reader, "general.architecture", "")
    kwargs: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": special("padding"),
        "unk_token": special("unknown"),
        "chat_template": read_field(reader, "tokenizer.chat_template", None),
        "clean_up_tokenization_spaces": False,
        "model_max_length": read_field(reader, f"{arch}.context_length", None),
    }
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in kwargs.items() if v is not None})
    if len(fast) != len(tokens):
        raise EmbeddedModelError(f"built tokenizer has {len(fast)} entries, GGUF vocabulary {len(tokens)}")
    return fast


def gguf_tokenizer(gguf_path: Path, not_special: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """The tokenizer built from a GGUF's vocabulary, merges and special-token metadata."""
    from gguf import GGUFReader

    return tokenizer_from_reader(GGUFReader(str(gguf_path)), not_special)
