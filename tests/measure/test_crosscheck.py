"""The cross-check against `vllm bench serve`: result parsing, the agreement rule, the bench's requests, a real run.

Unit tests run on captured bench results (vLLM 0.32 from the CPU engine, 0.26 from the H200) and a fake
bench. The engine test (`specledger crosscheck` on live CPU servers: ngram must win on copy in vLLM's own
benchmark too, with the ledger's acceptance length) lives in tests/engine/test_http.py, on that module's
servers: two server starts fewer, more than two minutes of CI on a slow CPU.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest
from repo_paths import DATA, ROOT

from specledger import stats
from specledger.ledger import load_ledger
from specledger.measure import crosscheck
from specledger.measure.http import servers
from specledger.stats import Estimate

LEDGER = ROOT / "ledgers" / "cpu-smollm2.json"
BENCH = DATA / "bench"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    crosscheck.add_arguments(parser)
    return parser


# --------------------------------------------------------------------------------------------
# pure parts
# --------------------------------------------------------------------------------------------


def test_repo_root_is_the_checkout():
    """The suite's session reads the workloads' prompts under it; a module move once pointed it at specledger/."""
    assert crosscheck.REPO_ROOT == ROOT
    assert (crosscheck.REPO_ROOT / "ledgers").is_dir() and (crosscheck.REPO_ROOT / "fixtures").is_dir()


def test_bench_results_of_both_versions_parse_with_acceptance_as_a_fraction():
    ngram = crosscheck.parse_bench_result(json.loads((BENCH / "ngram-c1.json").read_text()))  # vLLM 0.32
    assert ngram["output_tokens_per_s"] == pytest.approx(18.00452254870501)
    assert ngram["duration_s"] == pytest.approx(10.6639873109998) and ngram["completed"] == 6
    assert ngram["ttft_s"]["median"] == pytest.approx(0.49841530449975835)
    assert ngram["tpot_s"]["mean"] == pytest.approx(0.030361213026886833)
    assert ngram["acceptance"] == {"acceptance_rate": pytest.approx(130 / 164), "acceptance_length": pytest.approx(
        1 + 130 / 41), "drafts": 41, "draft_tokens": 164, "accepted_tokens": 130}
    assert "acceptance" not in crosscheck.parse_bench_result(json.loads((BENCH / "baseline-c1.json").read_text()))
    old = crosscheck.parse_bench_result(json.loads((BENCH / "vllm-0.26-ngram-h200-c8.json").read_text()))
    assert old["output_tokens_per_s"] == pytest.approx(2298.0466524891453) and old["completed"] == 64
    assert old["acceptance"]["acceptance_rate"] == pytest.approx(0.585376468881474)
    assert old["acceptance"]["acceptance_length"] == pytest.approx(5.075757575757576)


def test_bench_result_in_wrong_units_or_with_failures_is_refused():
    data = json.loads((BENCH / "ngram-c1.json").read_text())
    with pytest.raises(ValueError, match="not accepted/draft_tokens in percent"):
        crosscheck.parse_bench_result({**data, "spec_decode_acceptance_rate": 130 / 164})
    with pytest.raises(RuntimeError, match="2 request.s. failed"):
        crosscheck.parse_bench_result({**data, "failed": 2})


def test_agreement_at_its_boundary():
    # half-widths 0.375 and 0.5 (exact in binary): the combined half-width is exactly 0.625
    suite = Estimate(value=1.0, low=0.625, high=1.375, n=5)
    at = crosscheck.agreement(suite, Estimate(value=1.625, low=1.0, high=2.0, n=5))
    assert at.allowed == 0.625 and at.difference == 0.625 and at.ok
    past = crosscheck.agreement(suite, Estimate(value=1.625 + 2**-20, low=1.0, high=2.0, n=5))
    assert not past.ok
    assert "x1.000 [0.625, 1.375] (n=5)" in past.line() and "x1.625 [1.000, 2.000]" in past.line()
    assert "DISAGREE" in past.line() and "agree" in at.line()
    # an asymmetric interval counts by its half-width (0.3 here, not its upper reach 0.5); non-finite: never
    assert crosscheck.agreement(Estimate(1.0, 0.9, 1.5, 5), Estimate(1.29, 1.2, 1.3, 5)).ok  # 0.29 <= hypot(.3,.05)
    assert not crosscheck.agreement(Estimate(1.0, 0.9, 1.5, 5), Estimate(1.45, 1.44, 1.46, 5)).ok
    assert not crosscheck.agreement(suite, Estimate(1.0, math.nan, math.nan, 5)).ok
    assert at.judged and past.judged


def test_an_agreement_over_fewer_than_five_runs_is_shown_not_judged():
    """CI's run of 2026-12-02: three bench runs, per-run ratios 1.28, 1.90, 1.90, a bootstrap interval that cannot
    reach past them, and a DISAGREE against the suite's five repeats. Below five runs the line says so."""
    suite = Estimate(value=2.027, low=1.966, high=2.088, n=5)
    few = crosscheck.agreement(suite, Estimate(value=1.685, low=1.283, high=1.901, n=3))
    assert not few.ok and not few.judged
    assert few.line().endswith("allowed: not judged (DISAGREE on these intervals, but a side has fewer than 5 runs, "
                               "too few for its bootstrap interval)")
    assert crosscheck.agreement(suite, Estimate(value=1.685, low=1.283, high=1.901, n=5)).judged


class _FakeTokenizer:
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages: list[dict[str, str]], *, tokenize: bool, add_generation_prompt: bool
                            ) -> str:
        assert not tokenize and add_generation_prompt
        return f"<user>{messages[0]['content']}</user><assistant>"


def test_jsonl_holds_the_chat_rendered_prompts(tmp_path):
    path = crosscheck.write_bench_jsonl(tmp_path / "d.jsonl", ["a", "b\n\"c\""], _FakeTokenizer())
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [{"prompt": "<user>a</user><assistant>"}, {"prompt": "<user>b\n\"c\"</user><assistant>"}]

    class Plain:
        chat_template = None

    assert crosscheck.render_prompt(Plain(), "x") == "x"


def test_rendered_text_is_the_suites_token_ids():
    """The server tokenizes the text without special tokens: it must get the ids the suite sends."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from specledger.measure.engines import chat_token_ids
    from specledger.models import resolve_model

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model("embedded:smollm2"))
    except Exception as e:  # noqa: BLE001 - no built model here: nothing to compare
        pytest.skip(f"SmolLM2 tokenizer not available: {e}")
    for prompt in load_prompts()[:3]:
        text = crosscheck.render_prompt(tokenizer, prompt)
        assert tokenizer.encode(text, add_special_tokens=False) == chat_token_ids(tokenizer, prompt)


def load_prompts() -> list[str]:
    from specledger.measure.procedure import prompts_for

    return prompts_for(load_ledger(LEDGER), "copy", ROOT)


def test_bench_multiplier_interleaves_pairs_and_rotates_prompts(monkeypatch):
    calls: list[dict[str, Any]] = []
    speed = {"http://b": 20.0, "http://s": 30.0}

    def fake_run(url: str, model: str, dataset: Path, **kw: Any) -> dict[str, Any]:
        prompts = [json.loads(line)["prompt"] for line in Path(dataset).read_text().splitlines()]
        calls.append({"url": url, "prompts": prompts, **kw})
        tps = speed[url] + len(calls)  # a drifting machine: every run a little faster
        res: dict[str, Any] = {"output_tokens_per_s": tps, "completed": kw["num_prompts"], "duration_s": 1.0}
        if url == "http://s":
            res["acceptance"] = {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 30, "acceptance_length": 4.0,
                                 "acceptance_rate": 0.75}
        return res

    monkeypatch.setattr(crosscheck, "bench_run", fake_run)
    prompts = [f"p{i}" for i in range(5)]
    out = crosscheck.bench_multiplier({"base": "http://b", "spec": "http://s"}, model="/m", prompts=prompts,
                                      tokenizer=_FakeTokenizer(), concurrency=2, output_len=64, temperature=0.0,
                                      baseline="base", runs=3, rounds=2, progress=lambda _: None)
    assert [c["url"] for c in calls] == ["http://b", "http://s", "http://s", "http://b", "http://b", "http://s"]
    assert all(c["num_prompts"] == 4 and c["concurrency"] == 2 and c["output_len"] == 64 for c in calls)
    assert [c["num_warmups"] for c in calls] == [2, 2, 0, 0, 0, 0]
    assert all(c["add_special_tokens"] is False for c in calls)  # the template rendered them: no BOS again
    assert calls[0]["prompts"] == calls[1]["prompts"] == [f"<user>p{i}</user><assistant>" for i in (0, 1, 2, 3)]
    assert calls[2]["prompts"][0] == "<user>p4</user><assistant>"  # run 1 goes on where run 0 stopped
    assert out["output_tokens_per_s"] == {"base": [21.0, 24.0, 25.0], "spec": [32.0, 33.0, 36.0]}
    expected = stats.multiplier_estimate([32.0, 33.0, 36.0], [21.0, 24.0, 25.0])
    assert Estimate(**out["multiplier"]) == expected
    assert out["acceptance"]["acceptance_length"] == 4.0 and out["acceptance"]["acceptance_rate"] == 0.75


def test_suite_estimate_takes_the_v3_interval_else_bootstraps_the_repeats():
    point = {"arms": {"baseline": {"output_tokens_per_s": {"repeats": [20.0, 22.0, 21.0]}},
                      "ngram": {"output_tokens_per_s": {"repeats": [30.0, 35.0, 31.0]}, "multiplier": 1.524}}}
    assert crosscheck.suite_estimate(point, "ngram", "baseline") == stats.multiplier_estimate(
        [30.0, 35.0, 31.0], [20.0, 22.0, 21.0])
    point["arms"]["ngram"]["multiplier_ci95"] = [1.4, 1.7]
    assert crosscheck.suite_estimate(point, "ngram", "baseline") == Estimate(1.524, 1.4, 1.7, 3)


def test_command_usage_and_unreachable_servers(capsys):
    def run(*argv: str) -> int:
        return crosscheck.run(_parser().parse_args([str(LEDGER), *argv]))

    assert run("--point", "copy:zero:2", "--arm", "ngram") == 2
    assert run("--point", "nope:0:2", "--arm", "ngram") == 2
    assert run("--point", "copy:0:2", "--arm", "ngram", "--endpoint", "ngram=http://x") == 2
    assert run("--point", "copy:0:2", "--arm", "baseline") == 2
    capsys.readouterr()
    dead = f"http://127.0.0.1:{servers.free_port()}"
    assert run("--point", "copy:0:2", "--arm", "ngram", "--endpoint", f"baseline={dead}",
               "--endpoint", f"ngram={dead}") == 3
    assert "server unreachable" in capsys.readouterr().err

