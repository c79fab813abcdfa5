"""A vLLM server's spec-decode counters, read from its Prometheus `/metrics` text.

Why a module of its own: the in-process arms read vLLM's registry directly (`engines`), but a
server only shows its counters as Prometheus text. Parsing goes through `prometheus_client`'s
text parser (not regexes), which also strips the `_total` suffix from counter families, so the
family names match `engines.SPEC_COUNTERS`. The result has the shape of
`engines.read_spec_counters()`, so `counters.delta` works on both. Counters are summed over
the `engine` label (data-parallel servers export one series per engine core). The per-request
timers (`counters.REQUEST_TIMERS`) come along as [sum, count], summed the same way.

No vLLM import: `specledger watch` runs on any machine that can reach the server.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specledger.errors import SpecledgerError
from specledger.measure.counters import REQUEST_TIMERS

__all__ = [
    "COUNTER_FAMILIES",
    "PER_POSITION_FAMILY",
    "EndpointError",
    "SpecMetrics",
    "fetch_text",
    "metrics_url",
    "parse_spec_metrics",
    "read_spec_metrics",
]

#: Counter families (as the parser names them, without `_total`) -> keys of a counters dict.
COUNTER_FAMILIES = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POSITION_FAMILY = "vllm:spec_decode_num_accepted_tokens_per_pos"


class EndpointError(SpecledgerError, RuntimeError):
    """A server cannot be used: unreachable, not vLLM, no spec metrics, a different model. Names what failed."""


@dataclass(frozen=True)
class SpecMetrics:
    """One snapshot of a server's cumulative spec-decode counters."""

    counters: dict[str, Any]
    #: Whether every spec-decode counter family was present (a server without a drafter has none).
    has_spec: bool
    missing: tuple[str, ...]
    #: `model_name` labels seen on vLLM's series (the served model, as the server names it).
    model_names: tuple[str, ...] = ()
    #: Labels of `vllm:cache_config_info` (KV-cache blocks, block size...), empty if absent.
    cache_config: dict[str, str] = field(default_factory=dict)
    #: Cumulative [sum, count] of the per-request timers (counters.REQUEST_TIMERS), as
    #: `engines.read_metrics()` gives them in-process.
    request_timers: dict[str, list[float]] = field(default_factory=dict)


def metrics_url(url: str) -> str:
    """A server root (http://host:port) or a /metrics URL -> the /metrics URL."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else f"{url}/metrics"


def fetch_text(url: str, timeout_s: float = 10.0) -> str:
    """GET `url` as text; EndpointError that names the URL when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        raise EndpointError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointError(f"{url}: server unreachable ({reason})") from None


def parse_spec_metrics(text: str, *, source: str = "/metrics") -> SpecMetrics:
    """Spec-decode counters from Prometheus exposition text (pure: unit-tested on captured text)."""
    totals: dict[str, Any] = {key: 0 for key in COUNTER_FAMILIES.values()}
    per_pos: dict[int, int] = {}
    seen: set[str] = set()
    models: set[str] = set()
    cache_config: dict[str, str] = {}
    timers: dict[str, list[float]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise EndpointError(f"{source}: not Prometheus text ({exc})") from None
    for family in families:
        for sample in family.samples:
            if "model_name" in sample.labels and family.name.startswith("vllm:"):
                models.add(sample.labels["model_name"])
        if family.name == "vllm:cache_config_info" and family.samples:
            cache_config = dict(family.samples[0].labels)
        if family.name in REQUEST_TIMERS:
            total = timers.setdefault(REQUEST_TIMERS[family.name], [0.0, 0.0])
            for s in family.samples:
                if s.name.endswith("_sum"):
                    total[0] += float(s.value)
                elif s.name.endswith("_count"):
                    total[1] += float(s.value)
        if family.name in COUNTER_FAMILIES:
            seen.add(family.name)
            key = COUNTER_FAMILIES[family.name]
            totals[key] += sum(int(s.value) for s in family.samples if s.name.endswith("_total"))
        elif family.name == PER_POSITION_FAMILY:
            seen.add(family.name)
            for s in family.samples:
                if s.name.endswith("_total") and "position" in s.labels:
                    pos = int(s.labels["position"])
                    per_pos[pos] = per_pos.get(pos, 0) + int(s.value)
    totals["accepted_per_position"] = [per_pos.get(i, 0) for i in range(max(per_pos) + 1)] if per_pos else []
    wanted = [*COUNTER_FAMILIES, PER_POSITION_FAMILY]
    missing = tuple(f"{name}_total" for name in wanted if name not in seen)
    return SpecMetrics(totals, has_spec=not missing, missing=missing, model_names=tuple(sorted(models)),
                       cache_config=cache_config, request_timers=timers)


def read_spec_metrics(url: str, timeout_s: float = 10.0) -> SpecMetrics:
    """Fetch and parse a server's /metrics (`url` is the server root or the /metrics URL)."""
    target = metrics_url(url)
    text = fetch_text(target, timeout_s)
    if "vllm:" not in text:
        raise EndpointError(f"{target}: answers, but exports no vllm:* metrics (is it a vLLM server?)")
    return parse_spec_metrics(text, source=target)


def require_spec(metrics: SpecMetrics, url: str) -> None:
    """EndpointError naming the missing counter names when a server exports no spec-decode metrics."""
    if not metrics.has_spec:
        raise EndpointError(f"{metrics_url(url)}: no speculative-decoding metrics (missing "
                            f"{', '.join(metrics.missing)}): was the server started with --speculative-config?")


def model_matches(served: Iterable[str], expected: Iterable[str]) -> bool:
    """Whether a served model name is one of the expected names (paths compare by their last part too)."""
    wanted = {e.rstrip("/") for e in expected if e}
    wanted |= {w.rsplit("/", 1)[-1] for w in wanted}
    for name in served:
        name = name.rstrip("/")
        if name in wanted or name.rsplit("/", 1)[-1] in wanted:
            return True
    return False
