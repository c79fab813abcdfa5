"""H200 probe of protocol v3: two SmolLM2 copy points recorded in-process, the window-sizing series, and
`vllm bench serve` on two servers with the same flags, all in one GPU visit.

Run on the GPU machine from the checkout after `bash .stage/assemble` (see ../shared/gpu/README.md), with
PYTHONPATH=/tmp/site:. ; results go to $RESULTS_DIR (default /tmp/results), written as they come:
  <id>.json        the recorded v3 ledger (c=1 and c=64, baseline and ngram k=7, copy, T=0)
  sizing.json      interleaved 2.5 s windows per arm at c=1 and c=64 (CI half-width against GPU seconds)
  bench.json       vllm bench serve, 5 paired runs of 8 rounds per arm at each c, and the agreement
  timeline.json    seconds from the script's start to each phase (engine starts, points, servers, bench)
Why one script: the machine starts bare and device time is the scarce resource, so every phase that
shares the staged engine runs in one visit (../shared/gpu/README.md).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

PROBE_PROTOCOL_OVERRIDES = json.loads(os.environ.get("PROBE_PROTOCOL", '{"window": {"min_s": 5.0, "min_rounds": 4}}'))
CONCURRENCIES = tuple(int(c) for c in os.environ.get("PROBE_CONCURRENCIES", "1,64").split(","))
LEDGER = os.environ.get("PROBE_LEDGER", "ledgers/h200-smollm2-copy.json")  # a CPU ledger for a dry run
SIZING_WINDOW_S = 2.5
SIZING_REPEATS = int(os.environ.get("PROBE_SIZING_REPEATS", "12"))
BENCH_RUNS = int(os.environ.get("PROBE_BENCH_RUNS", "5"))
BENCH_ROUNDS = int(os.environ.get("PROBE_BENCH_ROUNDS", "8"))
BENCH_CONCURRENCIES = tuple(int(c) for c in os.environ.get("PROBE_BENCH_CONCURRENCIES", "1,64").split(","))


def main() -> int:
    from specledger.ledger import Ledger, load_ledger
    from specledger.ledger.model import DEFAULT_PROTOCOL
    from specledger.measure import procedure
    from specledger.measure.session import SuiteSession

    out = Path(os.environ.get("RESULTS_DIR", "/tmp/results"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    timeline: dict[str, float] = {}

    def mark(what: str) -> None:
        timeline[what] = round(time.monotonic() - t0, 1)
        (out / "timeline.json").write_text(json.dumps(timeline, indent=1))

    def log(line: str) -> None:
        print(f"[probe {time.monotonic() - t0:7.1f} s] {line}", flush=True)

    base = load_ledger(Path(LEDGER))
    data = copy.deepcopy(base.data)
    data["id"] = base.id + "-v3-probe"
    data["title"] = "Protocol v3 probe: " + data["title"]
    data["status"] = "planned"
    data["points"] = []
    data.pop("provenance", None)
    data.pop("notes", None)
    data["arms"] = [{k: v for k, v in a.items() if k not in ("effective_config", "kv_cache", "sessions")}
                    for a in data["arms"] if a["name"] in ("baseline", "ngram")]
    protocol = copy.deepcopy(DEFAULT_PROTOCOL)
    for key, value in PROBE_PROTOCOL_OVERRIDES.items():
        protocol[key] = {**protocol[key], **value}
    data["protocol"] = protocol
    data["sweep"] = {**{k: v for k, v in data["sweep"].items() if k == "settle_s"},
                     "temperatures": [0.0], "concurrencies": list(CONCURRENCIES), "repeat_prompts": "same"}
    ledger = Ledger(out / f"{data['id']}.json", data)

    session = SuiteSession(root=Path("."), record=True, out_dir=out, progress=log, force_busy=True,
                           command="scripts/h200-v3-probe.py")
    if os.environ.get("PROBE_BENCH_ONLY"):  # a second try at the bench phase, on the points already recorded
        timeline.update(json.loads((out / "timeline.json").read_text()))
        recorded = load_ledger(out / f"{data['id']}.json")
        points = {c: recorded.find_point("copy", 0.0, c) for c in CONCURRENCIES}
        prompts = procedure.prompts_for(ledger, "copy", Path("."))
        sampling = procedure.sampling_for(ledger, "copy", 0.0)
        return _bench(data, points, prompts, sampling, out, log, mark)
    mark("start")
    arms = session.arms_for(ledger)
    mark("engines up")
    points = {}
    for c in CONCURRENCIES:
        m = session.measure(ledger, ("copy", 0.0, c))
        session.store(ledger, m)
        points[c] = m.point
        mark(f"point c={c} done")

    prompts = procedure.prompts_for(ledger, "copy", Path("."))
    sampling = procedure.sampling_for(ledger, "copy", 0.0)
    sizing: list[dict] = []
    for c in CONCURRENCIES:
        for r in range(SIZING_REPEATS):
            for name in (list(arms) if r % 2 == 0 else list(reversed(list(arms)))):
                res = arms[name].run(prompts=prompts, concurrency=c, sampling=sampling, window_s=SIZING_WINDOW_S)
                sizing.append({"concurrency": c, "repeat": r, "arm": name, "window_s": res["window_s"],
                               "ramp_s": res["ramp_s"], "output_tokens_per_s": res["output_tokens_per_s"],
                               "rounds": res["rounds"], "requests": res["requests"]})
                (out / "sizing.json").write_text(json.dumps(sizing, indent=1))
            log(f"sizing c={c} repeat {r + 1}/{SIZING_REPEATS}")
        mark(f"sizing c={c} done")
    session.close()
    mark("engines closed")
    return _bench(data, points, prompts, sampling, out, log, mark)


def _bench(data, points, prompts, sampling, out, log, mark) -> int:
    from specledger import stats
    from specledger.measure import crosscheck
    from specledger.measure.http import endpoints
    from specledger.models import resolve_model

    model = resolve_model(data["target"]["model"])
    started = endpoints.start_servers(data, model, progress=log, log_dir=str(out))
    mark("servers up")
    bench: dict = {"runs": {}}
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        urls = {name: server.base_url for name, server in started.items()}
        for c in BENCH_CONCURRENCIES:
            res = crosscheck.bench_multiplier(urls, model=model, prompts=prompts, tokenizer=tokenizer,
                                              concurrency=c, output_len=int(sampling["max_tokens"]),
                                              temperature=0.0, baseline="baseline", runs=BENCH_RUNS,
                                              rounds=BENCH_ROUNDS,
                                              progress=log)
            suite = crosscheck.suite_estimate(points[c], "ngram", "baseline")
            agree = crosscheck.agreement(suite, stats.Estimate(**res["multiplier"]))
            res["agreement"] = {"ok": agree.ok, "line": agree.line(), "difference": agree.difference,
                                "allowed": agree.allowed}
            log(agree.line())
            bench["runs"][str(c)] = res
            (out / "bench.json").write_text(json.dumps(bench, indent=1, default=str))
            mark(f"bench c={c} done")
    finally:
        for server in started.values():
            server.stop()
    mark("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
