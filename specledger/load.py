"""Closed-loop load: N requests always in flight, the way a fixed pool of users behaves.

The driver knows nothing about vLLM: it calls ``submit(i)`` (an in-process engine or,
later, an HTTP endpoint) and times the whole run. Throughput is output tokens over the
wall time from the first submit to the last completion, so the ramp-down tail (fewer
than N in flight) is part of it; ``requests_for`` keeps that tail small against the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


def requests_for(concurrency: int, multiple: int = 4, minimum: int = 8) -> int:
    """Requests per repeat: ``multiple`` x N, never fewer than ``minimum`` (or N)."""
    return max(multiple * concurrency, minimum, concurrency)


async def closed_loop(submit: Callable[[int], Awaitable[int]], n_requests: int, concurrency: int
                      ) -> dict[str, Any]:
    """Run ``n_requests`` with ``concurrency`` in flight; ``submit(i)`` returns output tokens of request i."""
    if concurrency < 1 or n_requests < 1:
        raise ValueError("closed_loop needs concurrency >= 1 and n_requests >= 1")
    next_index = iter(range(n_requests))
    tokens: list[int] = [0] * n_requests
    latencies: list[float] = [0.0] * n_requests

    async def user() -> None:
        for i in next_index:  # one shared iterator: each user takes the next request when its last ends
            t0 = time.perf_counter()
            tokens[i] = await submit(i)
            latencies[i] = time.perf_counter() - t0

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(min(concurrency, n_requests))))
    wall = time.perf_counter() - start
    total = sum(tokens)
    return {
        "requests": n_requests,
        "concurrency": concurrency,
        "output_tokens": total,
        "wall_s": wall,
        "output_tokens_per_s": total / wall if wall > 0 else 0.0,
        "latency_s": {"median": sorted(latencies)[n_requests // 2], "max": max(latencies)},
    }
