"""Ledger arms over HTTP: OpenAI-compatible vLLM servers (live ones, or started from the ledger).

Teams run vLLM as a server with speculation fixed per endpoint at start. An `HTTPArm` plays the
part of an in-process `engines.ArmEngine` for `procedure`: `run(prompts=, concurrency=, sampling=,
window_s=)` is one steady-state window (`driver.steady_window`) and returns the same dict, with token
times from the SSE chunks (`return_token_ids` says how many tokens each chunk brought), so the same
paired, interleaved protocol and the same verdicts verify a ledger through the API.

Both modes must see the same tokens: prompts are rendered with the chat template here
(`engines.chat_token_ids`, the in-process path's own function) and sent as token ids to
`/v1/completions`, streaming, with the sampling of the in-process `SamplingParams` (seed + i per
request). Output tokens are the server's own count (`usage`, via `stream_options`). Counters
are deltas of the server's `/metrics` around each run, so nothing else may send traffic to a
measured endpoint meanwhile.

Servers started here take their flags from the ledger arm (`server_args`), so an HTTP run
of a ledger starts the configuration its in-process run used. No vLLM import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specledger.measure import counters, driver
from specledger.measure.http import server_metrics, servers
from specledger.measure.http.server_metrics import EndpointError

__all__ = ["EndpointError", "HTTPArm", "open_arms", "server_args", "start_servers"]

Progress = Callable[[str], None]

#: Engine arguments that are not server flags (the model goes in as --model by `servers`).
_NOT_FLAGS = {"model", "disable_log_stats"}


def server_args(engine_args: Mapping[str, Any], extra: Sequence[str] = ()) -> list[str]:
    """Server flags equivalent to an arm's engine arguments (`engines.arm_specs`), minus --model.

    `dtype: float32` -> `--dtype float32`, `enforce_eager: true` -> `--enforce-eager`, a false
    boolean -> `--no-...`, dicts (speculative_config) as JSON, None left out. `--generation-config
    vllm` keeps the server from applying the checkpoint's sampling defaults that an in-process
    `SamplingParams` never sees.
    """
    args: list[str] = []
    for key, value in engine_args.items():
        if key in _NOT_FLAGS or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, Mapping | list):
            args += [flag, json.dumps(value, separators=(",", ":"))]
        else:
            args += [flag, str(value)]
    if "generation_config" not in engine_args:
        args += ["--generation-config", "vllm"]
    return [*args, *extra]


def _server_env(arm_env: Mapping[str, str]) -> dict[str, str]:
    """CPU defaults where the caller's environment sets nothing (tox's KV size wins), then the arm's own."""
    env = {k: v for k, v in servers.CPU_ENV.items() if k not in os.environ}
    env.update(arm_env)
    return env


class HTTPArm:
    """One arm served over HTTP; `run` has the contract of `engines.ArmEngine.run`."""

    def __init__(self, name: str, base_url: str, *, tokenizer: Any, role: str = "speculative",
                 server: servers.VLLMServer | None = None, timeout_s: float = 1800.0) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.role = role
        self.tokenizer = tokenizer
        self.server = server
        self.timeout_s = timeout_s
        self.served_model = ""
        self.info: dict[str, Any] = {}

    # -- checks ---------------------------------------------------------------------------------------
    def check(self, expected_models: Sequence[str], *, speculative: bool) -> HTTPArm:
        """Reachable, serves the ledger's model, exports spec counters if it drafts; EndpointError otherwise."""
        models_url = f"{self.base_url}/v1/models"
        try:
            listing = json.loads(server_metrics.fetch_text(models_url))
            served = [m["id"] for m in listing["data"]] + [m.get("root") or "" for m in listing["data"]]
        except (ValueError, KeyError, TypeError):
            raise EndpointError(f"{models_url}: not an OpenAI model list") from None
        if not served:
            raise EndpointError(f"{models_url}: the server lists no model")
        if not server_metrics.model_matches(served, expected_models):
            raise EndpointError(f"arm {self.name}: {self.base_url} serves {listing['data'][0]['id']!r}, "
                                f"but the ledger's model is {expected_models[0]!r}"
                                + (f" ({expected_models[-1]})" if len(expected_models) > 1 else ""))
        self.served_model = listing["data"][0]["id"]
        metrics = server_metrics.read_spec_metrics(self.base_url)
        if speculative:
            server_metrics.require_spec(metrics, self.base_url)
        version = ""
        with contextlib.suppress(EndpointError, ValueError, KeyError):
            version = json.loads(server_metrics.fetch_text(f"{self.base_url}/version"))["version"]
        self.info = _info(self.base_url, self.served_model, version, metrics)
        return self

    # -- measuring -------------------------------------------------------------------------------------
    def _settled_metrics(self, settle_s: float = 0.2, limit_s: float = 3.0) -> server_metrics.SpecMetrics:
        """Metrics once two reads agree: the last step's stats reach the API process just after its output."""
        time.sleep(settle_s)
        last = server_metrics.read_spec_metrics(self.base_url)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            time.sleep(settle_s)
            now = server_metrics.read_spec_metrics(self.base_url)
            if now.counters == last.counters and now.request_timers == last.request_timers:
                break
            last = now
        return last

    def run(self, *, prompts: list[str], concurrency: int, sampling: Mapping[str, Any], window_s: float,
            first_index: int = 0) -> dict[str, Any]:
        """One steady-state window over streaming completions; counters and request timers are /metrics deltas."""
        return self._measured(prompts, concurrency, sampling, window_s, first_index)

    def prompt_pass(self, *, prompts: list[str], concurrency: int, sampling: Mapping[str, Any]) -> dict[str, Any]:
        """Every prompt once, each to its end (``driver.prompt_pass``); counters are /metrics deltas."""
        return self._measured(prompts, concurrency, sampling, None, 0)

    def _measured(self, prompts: list[str], concurrency: int, sampling: Mapping[str, Any], window_s: float | None,
                  first_index: int) -> dict[str, Any]:
        from specledger.measure.engines import chat_token_ids  # no vLLM import at module level there

        token_ids = [chat_token_ids(self.tokenizer, p) for p in prompts]
        before = server_metrics.read_spec_metrics(self.base_url)
        result = asyncio.run(self._window(token_ids, concurrency, sampling, window_s, first_index))
        after = self._settled_metrics()
        result["counters"] = counters.delta(before.counters, after.counters)
        result["request_time_s"] = counters.request_times(before.request_timers, after.request_timers)
        return result

    async def _window(self, token_ids: list[list[int]], concurrency: int, sampling: Mapping[str, Any],
                      window_s: float | None, first_index: int) -> dict[str, Any]:
        """One window, or with ``window_s`` None one prompt pass."""
        import aiohttp

        seed = sampling.get("seed")
        url = f"{self.base_url}/v1/completions"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout,
                                         connector=aiohttp.TCPConnector(limit=max(1, concurrency))) as http:

            async def submit(i: int, trace: driver.RequestTrace) -> None:
                body = {
                    "model": self.served_model,
                    "prompt": token_ids[i % len(token_ids)],
                    "max_tokens": int(sampling["max_tokens"]),
                    "temperature": float(sampling.get("temperature", 0.0)),
                    "top_p": float(sampling.get("top_p", 1.0)),
                    "ignore_eos": bool(sampling.get("ignore_eos", False)),
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "return_token_ids": True,  # each SSE chunk names its tokens: a spec step can bring several
                }
                if seed is not None:
                    body["seed"] = int(seed) + i
                await _stream_completion(http, url, body, trace)

            if window_s is None:
                return await driver.prompt_pass(submit, concurrency=concurrency, n_prompts=len(token_ids),
                                              timeout_s=self.timeout_s)
            return await driver.steady_window(submit, concurrency=concurrency, window_s=window_s,
                                            first_index=first_index, n_prompts=len(token_ids))

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


async def _stream_completion(http: Any, url: str, body: Mapping[str, Any], trace: driver.RequestTrace) -> None:
    """POST one streaming completion and read it to [DONE], recording each chunk's tokens as they arrive.

    Closing the connection (the window's close cancels this coroutine) makes the server abort the request.
    A server that dies or drops the connection mid-stream is an EndpointError naming the URL.
    """
    import aiohttp

    try:
        await _read_stream(http, url, body, trace)
    except aiohttp.ClientError as exc:
        raise EndpointError(f"{url}: connection lost mid-request ({type(exc).__name__}: {exc})") from None


async def _read_stream(http: Any, url: str, body: Mapping[str, Any], trace: driver.RequestTrace) -> None:
    async with http.post(url, json=body) as response:
        if response.status != 200:
            raise EndpointError(f"{url}: HTTP {response.status}: {(await response.text())[:500]}")
        usage = None
        async for raw in response.content:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("error"):
                raise EndpointError(f"{url}: error in stream: {event['error']}")
            for choice in event.get("choices") or []:
                ids = choice.get("token_ids") or []
                trace.add(len(ids) if ids else int(bool(choice.get("text"))), ids)
            if event.get("usage"):
                usage = event["usage"]
    if usage is None:
        raise EndpointError(f"{url}: stream ended without usage (stream_options.include_usage unsupported?)")


def _info(base_url: str, served_model: str, version: str, metrics: server_metrics.SpecMetrics
          ) -> dict[str, Any]:
    """What an endpoint says about itself: the session's summary reads kv_cache and effective_config."""
    cc = metrics.cache_config
    blocks = int(cc["num_gpu_blocks"]) if cc.get("num_gpu_blocks", "None").isdigit() else 0
    block = int(cc["block_size"]) if cc.get("block_size", "None").isdigit() else 0
    return {
        "endpoint": base_url,
        "served_model": served_model,
        "engine": {"name": "vllm (server)", "version": version or "unknown"},
        "kv_cache": {"num_blocks": blocks, "block_size": block, "tokens": blocks * block},
        "effective_config": {"block_size": block or None,
                             "num_gpu_blocks": blocks or None,
                             "spec_metrics": metrics.has_spec},
    }


def expected_models(ledger_data: Mapping[str, Any], model_path: str) -> list[str]:
    """Names a server of this ledger may report: the reference, its resolved folder, the target's name."""
    target = ledger_data["target"]
    return [target["model"], model_path, target.get("name") or ""]


def start_servers(ledger_data: Mapping[str, Any], model_path: str, *, progress: Progress = print,
                  log_dir: str | os.PathLike[str] | None = None, extra_args: Sequence[str] = (),
                  source: str = "ledger", trusted: bool = False) -> dict[str, servers.VLLMServer]:
    """One server per ledger arm, flags from the arm (one after another); all stopped if one fails."""
    from specledger.measure.engines import arm_specs

    started: dict[str, servers.VLLMServer] = {}
    try:
        for spec in arm_specs(ledger_data, model_path, source=source, trusted=trusted):
            args = dict(spec.engine_args)
            speculative = args.pop("speculative_config", None)
            t0 = time.monotonic()
            progress(f"starting server for arm {spec.describe()}")
            log_path = None if log_dir is None else os.path.join(log_dir, f"{spec.name}-server.log")
            server = servers.VLLMServer(args["model"], speculative_config=speculative,
                                        args=server_args(args, extra_args), env=_server_env(spec.env),
                                        log_path=log_path)
            started[spec.name] = server
            server.start()
            progress(f"server {spec.name} ready at {server.base_url} in {time.monotonic() - t0:.0f} s")
    except BaseException:
        for server in started.values():
            server.stop()
        raise
    return started


def open_arms(ledger_data: Mapping[str, Any], model_path: str, urls: Mapping[str, str], *,
              servers_by_arm: Mapping[str, servers.VLLMServer] | None = None) -> dict[str, HTTPArm]:
    """HTTPArms for every arm of the ledger, each checked (reachable, model, spec metrics)."""
    from transformers import AutoTokenizer

    arms = {a["name"]: a for a in ledger_data["arms"]}
    missing = [name for name in arms if name not in urls]
    if missing:
        raise EndpointError(f"no endpoint for arm(s) {', '.join(missing)} of ledger {ledger_data['id']} "
                            f"(given: {', '.join(f'{k}={v}' for k, v in urls.items()) or 'none'})")
    unknown = [name for name in urls if name not in arms]
    if unknown:
        raise EndpointError(f"endpoint(s) for arm(s) {', '.join(unknown)} that ledger {ledger_data['id']} "
                            f"does not have (its arms: {', '.join(arms)})")
    names = expected_models(ledger_data, model_path)
    out: dict[str, HTTPArm] = {}
    for name, arm in arms.items():  # every endpoint is checked before anything is loaded or measured
        speculative = bool(arm.get("speculative_config"))
        out[name] = HTTPArm(name, urls[name], tokenizer=None, role=arm["role"],
                            server=(servers_by_arm or {}).get(name)).check(names, speculative=speculative)
    tokenizer_ref = (ledger_data.get("engine_args") or {}).get("tokenizer")
    if tokenizer_ref:
        from specledger.models import resolve_model

        tokenizer_ref = resolve_model(tokenizer_ref)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_ref or model_path)
    for arm_ in out.values():
        arm_.tokenizer = tokenizer
    return out


class HTTPMode:
    """How a session reaches a ledger's arms over HTTP: live endpoints (`urls`), or servers it starts.

    With `urls` (arm name -> server root) the servers are someone else's and are left running;
    without, one server per arm is started from the ledger and stopped with the session.
    """

    def __init__(self, urls: Mapping[str, str] | None = None, *, log_dir: str | os.PathLike[str] | None = None,
                 extra_args: Sequence[str] = (), trusted: bool = False) -> None:
        self.urls = dict(urls) if urls else None
        self.trusted = trusted
        self.log_dir = log_dir
        self.extra_args = tuple(extra_args)

    def open(self, ledger: Any, model_path: str, progress: Progress = print) -> dict[str, HTTPArm]:
        if self.urls is not None:
            progress(f"{ledger.id}: HTTP mode, live endpoints "
                     + ", ".join(f"{k}={v}" for k, v in self.urls.items()))
            return open_arms(ledger.data, model_path, self.urls)
        started = start_servers(ledger.data, model_path, progress=progress, log_dir=self.log_dir,
                                extra_args=self.extra_args, source=str(ledger.path), trusted=self.trusted)
        try:
            return open_arms(ledger.data, model_path, {k: s.base_url for k, s in started.items()},
                             servers_by_arm=started)
        except BaseException:
            for server in started.values():
                server.stop()
            raise
