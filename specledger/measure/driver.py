"""Steady-state closed-loop load (protocol v3): N users always in flight, measured inside a window.

Why a window: a closed-loop "round" of N requests at concurrency N starts every request at
once and ends with the last straggler, so it measures a burst (prefill of N prompts, then a
tail with fewer than N in flight). On the H200 that flipped ngram's multiplier at c=64 from
1.41x (steady state, and vLLM's own benchmark) to 0.39x (one round). Here each user sends its
next request as soon as its last one ends; the window opens once every user has finished its
first request (the synchronized first round, the ramp, is excluded) and closes ``window_s``
later, when the requests still in flight are aborted (no drain). Throughput counts only the
output tokens whose arrival time, taken from the stream, lies inside the window.

The driver knows nothing about vLLM: ``submit(i, trace)`` streams request ``i`` (an
in-process engine or an HTTP endpoint) and calls ``trace.add`` on every delta; cancelling it
aborts the request. Everything returned is plain data, so it crosses a process pipe.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specledger.errors import SpecledgerError
from specledger.measure import fingerprint

#: ITL samples kept per window (systematic subsample): percentiles need no more, and the
#: result crosses a process pipe.
MAX_ITL_SAMPLES = 5000


@dataclass
class RequestTrace:
    """One request as the client saw it: when it was sent, and when each streamed delta arrived."""

    index: int
    user: int
    sent_at: float
    token_times: list[float] = field(default_factory=list)
    token_counts: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    done_at: float | None = None

    def add(self, n_tokens: int, token_ids: Sequence[int] = ()) -> None:
        """Record a delta of ``n_tokens`` arriving now (a speculative step may bring several)."""
        if n_tokens <= 0:
            return
        self.token_times.append(time.perf_counter())
        self.token_counts.append(n_tokens)
        self.output.extend(token_ids)


Submit = Callable[[int, RequestTrace], Awaitable[None]]


class RampTimeout(SpecledgerError, RuntimeError):
    """Not every user finished a first request in time: the window never opened."""


async def steady_window(submit: Submit, *, concurrency: int, window_s: float, first_index: int = 0,
                        ramp_timeout_s: float = 1800.0, n_prompts: int | None = None) -> dict[str, Any]:
    """One repeat: ramp (every user finishes one request), then a ``window_s`` window; returns its figures."""
    if concurrency < 1 or window_s <= 0:
        raise ValueError("steady_window needs concurrency >= 1 and window_s > 0")
    traces: list[RequestTrace] = []
    indices = itertools.count(first_index)
    first_done: set[int] = set()
    everyone_started = asyncio.Event()
    closed = False

    async def user(u: int) -> None:
        while not closed:
            trace = RequestTrace(next(indices), u, time.perf_counter())
            traces.append(trace)
            await submit(trace.index, trace)
            trace.done_at = time.perf_counter()
            if u not in first_done:
                first_done.add(u)
                if len(first_done) == concurrency:
                    everyone_started.set()

    host_before_ms = fingerprint.host_slice_ms()  # before any request is in flight
    t_start = time.perf_counter()
    users = [asyncio.create_task(user(u)) for u in range(concurrency)]
    opener = asyncio.create_task(everyone_started.wait())
    try:
        await _wait_or_raise(users, opener, ramp_timeout_s)
        if not opener.done():
            raise RampTimeout(f"not every one of {concurrency} users finished a request within {ramp_timeout_s:.0f} s")
        t_open = time.perf_counter()
        opened_unix_s = time.time()
        cpu_open = fingerprint.cpu_snapshot()
        await _wait_or_raise(users, None, window_s)
        t_close = time.perf_counter()
        cpu = fingerprint.cpu_shares(cpu_open, fingerprint.cpu_snapshot())
    finally:
        closed = True
        opener.cancel()
        for task in users:
            task.cancel()  # aborts what is still in flight: tokens after the close are not counted
        await asyncio.gather(*users, opener, return_exceptions=True)
    host_ms = max(host_before_ms, fingerprint.host_slice_ms())  # after: the requests are closed or aborted
    return summarize(traces, t_start=t_start, t_open=t_open, t_close=t_close, concurrency=concurrency,
                     n_prompts=n_prompts, cpu=cpu, host_slice_ms=host_ms, opened_unix_s=opened_unix_s)


class PassTimeout(SpecledgerError, RuntimeError):
    """A prompt pass did not finish every prompt in time."""


async def prompt_pass(submit: Submit, *, concurrency: int, n_prompts: int,
                      timeout_s: float = 1800.0) -> dict[str, Any]:
    """Every prompt once, ``concurrency`` users in flight, each request to its end: a count-sized run.

    Why, beside the windows: a window is time-sized, so which prompts it covers, and where it cuts
    the last one, move with the engine's speed. At c=1 a window sees the first few prompts only, and
    a slower machine sees fewer, so a figure that belongs to the tokens (the acceptance length)
    would move with speed. A pass sends the same requests, with the same seeds, on any machine and
    at any speed. Index i is prompt i (its seed is seed + i), as in a window's first round.
    """
    if concurrency < 1 or n_prompts < 1:
        raise ValueError("prompt_pass needs concurrency >= 1 and n_prompts >= 1")
    traces: list[RequestTrace] = []
    indices = iter(range(n_prompts))

    async def user(u: int) -> None:
        for i in indices:  # one shared iterator: each index is taken by exactly one user
            trace = RequestTrace(i, u, time.perf_counter())
            traces.append(trace)
            await submit(i, trace)
            trace.done_at = time.perf_counter()

    t_start = time.perf_counter()
    users = [asyncio.create_task(user(u)) for u in range(min(concurrency, n_prompts))]
    try:
        await _wait_or_raise(users, None, timeout_s)
        if not all(task.done() for task in users):
            raise PassTimeout(f"a pass over {n_prompts} prompts at concurrency {concurrency} did not end "
                              f"within {timeout_s:.0f} s ({sum(t.done_at is not None for t in traces)} done)")
    finally:
        for task in users:
            task.cancel()
        await asyncio.gather(*users, return_exceptions=True)
    seconds = time.perf_counter() - t_start
    latencies = [tr.done_at - tr.sent_at for tr in traces if tr.done_at is not None]
    return {
        "concurrency": concurrency,
        "requests": len(traces),
        "seconds": seconds,
        "output_tokens": sum(sum(tr.token_counts) for tr in traces),
        "request_latency_median_s": statistics.median(latencies) if latencies else None,
        "outputs": {str(tr.index): list(tr.output) for tr in sorted(traces, key=lambda tr: tr.index)},
    }


async def _wait_or_raise(users: list[asyncio.Task], opener: asyncio.Task | None, timeout_s: float) -> None:
    """Wait for ``opener`` (or the timeout); a user that fails ends the run with its error."""
    waiting = [*users, *([opener] if opener else [])]
    deadline = time.perf_counter() + timeout_s
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        done, _ = await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not opener and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if opener is not None and opener.done():
            return
        waiting = [t for t in waiting if not t.done()]
        if not waiting:
            return


def summarize(traces: Sequence[RequestTrace], *, t_start: float, t_open: float, t_close: float, concurrency: int,
              n_prompts: int | None = None, cpu: fingerprint.CpuShares | None = None,
              host_slice_ms: float | None = None, opened_unix_s: float | None = None) -> dict[str, Any]:
    """The window's figures from the request traces (pure: unit-tested without an engine); `cpu`, where the
    platform gives it, is how the machine's CPU time went during the window; `host_slice_ms` the slower of the host
    speed slices timed before the ramp and after the close; `opened_unix_s` the wall clock at the window's opening,
    to match it with a machine's telemetry."""
    window_s = t_close - t_open
    tokens = sum(n for tr in traces for t, n in zip(tr.token_times, tr.token_counts, strict=True)
                 if t_open <= t < t_close)
    finished = [tr for tr in traces if tr.done_at is not None and tr.token_times]
    inside = [tr for tr in finished if tr.sent_at >= t_open and tr.done_at <= t_close]
    latencies = [tr.done_at - tr.sent_at for tr in finished]  # type: ignore[operator]
    ttft = [tr.token_times[0] - tr.sent_at for tr in inside]
    tpot = [(tr.token_times[-1] - tr.token_times[0]) / (sum(tr.token_counts) - 1)
            for tr in inside if sum(tr.token_counts) > 1]
    itl = [b - a for tr in inside for a, b in itertools.pairwise(tr.token_times)]
    if len(itl) > MAX_ITL_SAMPLES:
        step = len(itl) / MAX_ITL_SAMPLES
        itl = [itl[int(k * step)] for k in range(MAX_ITL_SAMPLES)]
    outputs: dict[int, list[int]] = {}
    for tr in sorted(finished, key=lambda tr: tr.index):
        key = tr.index % n_prompts if n_prompts else tr.index
        outputs.setdefault(key, list(tr.output))
    median_latency = statistics.median(latencies) if latencies else None
    return {
        "longest_gap_s": longest_gap(traces, t_open, t_close),
        "cpu_steal_share": cpu.steal if cpu else None,
        "cpu_busy_share": cpu.busy if cpu else None,
        "host_slice_ms": host_slice_ms,
        "opened_unix_s": opened_unix_s,
        "concurrency": concurrency,
        "window_s": window_s,
        "ramp_s": t_open - t_start,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / window_s if window_s > 0 else 0.0,
        "requests": sum(1 for tr in finished if t_open <= tr.done_at < t_close),  # type: ignore[operator]
        "requests_sent": len(traces),
        "request_latency_median_s": median_latency,
        "rounds": window_s / median_latency if median_latency else None,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "itl_s": itl,
        "outputs": {str(k): v for k, v in outputs.items()},
    }


def longest_gap(traces: Sequence[RequestTrace], t_open: float, t_close: float) -> float:
    """The longest stretch of the window in which no request received a token (its edges included).

    A whole-engine stall (a pause of the engine core, the host, or the client's event loop) shows
    here, while a slower but steady rate does not: a window whose throughput falls with a long gap
    was stalled, not slow, which tells which of the two a noisy point suffers from.
    """
    times = sorted(t for tr in traces for t in tr.token_times if t_open <= t < t_close)
    edges = [t_open, *times, t_close]
    return max((b - a for a, b in itertools.pairwise(edges)), default=t_close - t_open)
