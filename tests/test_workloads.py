"""Tests for the committed prompt sets and the loader that guards them.

The prompt sets are part of every ledger's claim. A silently broken line or a copy prompt
without a passage would change the measured acceptance rate without anyone noticing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specledger.workloads import (
    WORKLOAD_DIR,
    Prompt,
    WorkloadError,
    cycle_prompts,
    load_workload,
    resolve_fixture,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
# kind -> id prefix; the file is fixtures/workloads/<kind>.jsonl.
SETS: dict[str, str] = {"free-form": "ff", "copy": "cp"}
MIN_PROMPTS = 32
# Instructions that ask for the passage back unchanged: the traffic where ngram drafting pays off.
VERBATIM = re.compile(
    r"^(Repeat|Copy|Return)\b.*\b(exactly|word for word|unchanged)\b|^Fix only the capitali[sz]ation\b"
)
SPECIAL_TOKENS = re.compile(r"<\|[^|]*\|>|<s>|</s>|\[INST\]|<im_start>|<im_end>")


def _words(text: str) -> int:
    return len(text.split())


def _write(tmp_path: Path, *lines: str, name: str = "set.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _line(id_: str, kind: str = "copy", prompt: str = "Repeat this.", **extra: object) -> str:
    return json.dumps({"id": id_, "kind": kind, "prompt": prompt, **extra})


# --- committed sets -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SETS))
def test_committed_set_loads(kind: str) -> None:
    prompts = load_workload(WORKLOAD_DIR / f"{kind}.jsonl")
    assert len(prompts) >= MIN_PROMPTS
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids)
    assert all(p.kind == kind for p in prompts), "kind field must match the file name"
    assert all(re.fullmatch(rf"{SETS[kind]}-\d{{3}}", p.id) for p in prompts), ids
    assert not [p.id for p in prompts if SPECIAL_TOKENS.search(p.prompt)], "chat template is applied later"
    assert len({p.prompt for p in prompts}) == len(prompts), "duplicate prompt text"


def test_free_form_prompts_are_short_asks() -> None:
    """Free-form prompts carry no passage: if they did, ngram drafting would look better than it is."""
    for p in load_workload(WORKLOAD_DIR / "free-form.jsonl"):
        assert 10 <= _words(p.prompt) <= 60, (p.id, _words(p.prompt))
        assert "\n" not in p.prompt, p.id


def test_copy_prompts_carry_a_passage() -> None:
    """Each copy prompt is a short instruction, a blank line, then a real passage to copy from."""
    prompts = load_workload(WORKLOAD_DIR / "copy.jsonl")
    for p in prompts:
        instruction, sep, passage = p.prompt.partition("\n\n")
        assert sep, f"{p.id}: no blank line between instruction and passage"
        assert _words(instruction) <= 25, f"{p.id}: instruction too long"
        assert 40 <= _words(passage) <= 120, (p.id, _words(passage))
    verbatim = [p for p in prompts if VERBATIM.search(p.prompt.partition("\n\n")[0])]
    assert len(verbatim) >= 0.75 * len(prompts), f"only {len(verbatim)}/{len(prompts)} verbatim-style"


# --- malformed files ----------------------------------------------------------------------------


def _raises_at(path: Path, line: int, *fragments: str) -> WorkloadError:
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    msg = str(info.value)
    assert f"{path}:{line}:" in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg
    return info.value


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, _line("cp-001"), '{"id": "cp-002", "kind": "copy", "prompt": ')
    _raises_at(path, 2, "invalid JSON")


def test_missing_prompt_names_field(tmp_path: Path) -> None:
    path = _write(tmp_path, _line("cp-001"), "", json.dumps({"id": "cp-002", "kind": "copy"}))
    _raises_at(path, 3, "missing field 'prompt'")


def test_empty_prompt_rejected(tmp_path: Path) -> None:
    _raises_at(_write(tmp_path, _line("cp-001", prompt="   ")), 1, "'prompt'", "empty")


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, _line("cp-001"), _line("cp-002"), _line("cp-001", prompt="Other."))
    _raises_at(path, 3, "duplicate id 'cp-001'", f"{path}:1")


def test_unknown_field_named(tmp_path: Path) -> None:
    _raises_at(_write(tmp_path, _line("cp-001", tags=["x"])), 1, "unknown field", "'tags'")


def test_wrong_type_named(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps({"id": 7, "kind": "copy", "prompt": "Repeat this."}))
    _raises_at(path, 1, "'id'", "string")


def test_non_object_line(tmp_path: Path) -> None:
    _raises_at(_write(tmp_path, _line("cp-001"), '["a", "list"]'), 2, "JSON object")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    _raises_at(path, 1, "empty")


def test_blank_lines_skipped_and_order_kept(tmp_path: Path) -> None:
    path = _write(tmp_path, "", _line("cp-002", prompt="B"), "   ", _line("cp-001", prompt="A"), "")
    assert load_workload(str(path)) == [Prompt("cp-002", "copy", "B"), Prompt("cp-001", "copy", "A")]


# --- cycle_prompts ------------------------------------------------------------------------------

prompt_lists = st.integers(min_value=1, max_value=12).map(
    lambda k: [Prompt(f"p-{i:03d}", "free-form", f"prompt {i}") for i in range(k)]
)


@given(prompts=prompt_lists, n=st.integers(0, 60), offset=st.integers(0, 100))
def test_cycle_round_robin(prompts: list[Prompt], n: int, offset: int) -> None:
    out = cycle_prompts(prompts, n, offset)
    assert len(out) == n
    k = len(prompts)
    for i, p in enumerate(out):
        assert p is prompts[(offset + i) % k]
    if n >= k:
        assert set(out[:k]) == set(prompts), "every prompt is used before any repeats"


@given(prompts=prompt_lists, n=st.integers(0, 30), offset=st.integers(0, 50))
def test_cycle_offset_wraps(prompts: list[Prompt], n: int, offset: int) -> None:
    assert cycle_prompts(prompts, n, offset) == cycle_prompts(prompts, n, offset + len(prompts))
    assert cycle_prompts(prompts, n, offset) == cycle_prompts(prompts, n, offset % len(prompts))


def test_cycle_edge_cases() -> None:
    assert cycle_prompts([], 0) == []
    with pytest.raises(ValueError):
        cycle_prompts([], 1)
    with pytest.raises(ValueError):
        cycle_prompts([Prompt("a", "copy", "x")], -1)


# --- resolve_fixture ----------------------------------------------------------------------------


def test_workload_dir_is_in_checkout() -> None:
    assert WORKLOAD_DIR == REPO_ROOT / "fixtures" / "workloads"


def test_resolve_fixture_relative_absolute_missing(tmp_path: Path) -> None:
    assert resolve_fixture("fixtures/workloads/copy.jsonl") == REPO_ROOT / "fixtures/workloads/copy.jsonl"
    target = _write(tmp_path, _line("cp-001"))
    assert resolve_fixture("set.jsonl", base=tmp_path) == target
    assert resolve_fixture(str(target)) == target
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        resolve_fixture("fixtures/workloads/nope.jsonl")


# --- lint ---------------------------------------------------------------------------------------

OWN_FILES = ["specledger/workloads.py", "tests/test_workloads.py"]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff not installed")
    result = subprocess.run([ruff, "check", *OWN_FILES], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# --- first_index (where each repeat starts in the prompt cycle) ------------------------------------


@given(n_prompts=st.integers(1, 12), concurrency=st.integers(1, 20), repeat=st.integers(0, 9))
def test_same_repeats_start_at_the_same_prompt(n_prompts: int, concurrency: int, repeat: int) -> None:
    from specledger.measure.procedure import first_index

    assert first_index(repeat, concurrency, n_prompts, "same") == 0
    assert 0 <= first_index(repeat, concurrency, n_prompts, "rotate") < n_prompts


def test_rotating_repeats_start_one_block_further() -> None:
    from specledger.measure.procedure import first_index

    assert [first_index(r, 4, 10, "rotate") for r in range(3)] == [0, 4, 8]
    texts = [f"p{i}" for i in range(10)]
    assert cycle_prompts(texts, 4, first_index(2, 4, 10, "rotate")) == ["p8", "p9", "p0", "p1"]
    with pytest.raises(ValueError, match="repeat_prompts"):
        first_index(0, 4, 10, "shuffle")
