"""The engines of a measuring session: each ledger's arms, started once, shared, failed or closed.

Its own module because starting engines is a concern apart from measuring and recording points
(specledger.measure.session): which ledger owns the open engines, whether a ledger can measure on
another's (same arms: no second start), which arms failed to start, what each start cost, and that
only one ledger's engines run at a time (idle vLLM engines still take CPU and would skew the next
ledger's figures). The session asks it for arms and their infos and never touches an engine itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specledger.ledger import Ledger, gpu_memory
from specledger.ledger.model import is_gpu_ledger, json_path
from specledger.measure import engines
from specledger.render.tables import config_differences

if TYPE_CHECKING:
    from specledger.measure.http.endpoints import HTTPMode

Progress = Callable[[str], None]


def recorded_kv_blocks(ledger: Ledger) -> dict[str, int]:
    """Each arm's KV block count as the ledger recorded it ($.arms[*].kv_cache.num_blocks), for pinned starts."""
    return {arm["name"]: int(arm["kv_cache"]["num_blocks"]) for arm in ledger.arms
            if (arm.get("kv_cache") or {}).get("num_blocks")}


def check_gpu_memory(ledger: Ledger, memory_gib: float | None = None) -> None:
    """Refuse, before any engine starts, arms that would not fit side by side on this machine's GPU
    (`gpu_memory.device_memory_problem`; `memory_gib` defaults to nvidia-smi's). Why: on 2026-12-05 six arms
    started on an H100 80GB, and the sixth died of CUDA out of memory at the second point, after 900 device s."""
    if not is_gpu_ledger(ledger.data):
        return
    memory_gib = engines.gpu_memory_gib() if memory_gib is None else memory_gib
    fractions = gpu_memory.arm_fractions(ledger.data)
    if memory_gib is None or fractions is None:
        return
    problem = gpu_memory.device_memory_problem(fractions, memory_gib)
    if problem is not None:
        raise ValueError(f"{ledger.path}: {json_path(gpu_memory.setting_path(ledger.data))}: "
                         f"not started on this GPU ({memory_gib:g} GiB): {problem}")


class EnginePool:
    """Each ledger's arms (in-process engines, or HTTP endpoints in HTTP mode), kept for the session.

    ``infos_by_ledger`` holds each started ledger's arm infos (engine, KV cache, effective config) by arm name;
    it outlives ``close``, since a ledger's recording and summary still read it after its engines are gone.
    """

    def __init__(self, *, progress: Progress, http: HTTPMode | None = None, trusted: bool = False,
                 kv_sizing: str = "default", compile_first: bool = False) -> None:
        self.progress = progress
        self.http = http
        self.trusted = trusted
        self.kv_sizing = kv_sizing
        #: build the arms once side by side to fill vLLM's compile cache before their own starts
        #: (`engines.compile_at_once`), where those go one after another
        self.compile_first = compile_first
        self._compiled: list[engines.ArmSpec] = []  # arms the compile phase has built in this session
        self.infos_by_ledger: dict[str, dict[str, Any]] = {}
        self._arms: dict[str, dict[str, Any]] = {}
        self._failed_start: dict[str, BaseException] = {}
        self._failed_arms: dict[str, dict[str, BaseException]] = {}
        self._model_build_s: dict[str, float] = {}
        self._engine_starts_s: dict[str, float] = {}
        self._open_specs: tuple[str, list[engines.ArmSpec]] | None = None  # (ledger id, its arms) of open engines
        self._shared_with: dict[str, str] = {}  # ledger id -> the ledger whose engines it measured on

    def arms_for(self, ledger: Ledger) -> dict[str, Any]:
        """The ledger's arms, started and warmed once; a start that failed fails again without a second try."""
        if ledger.id in self._failed_start:
            from specledger.ledger.trust import UntrustedLedger

            if isinstance(self._failed_start[ledger.id], UntrustedLedger):
                raise self._failed_start[ledger.id]
            raise RuntimeError(f"{ledger.id}: engines failed to start earlier in this session") \
                from self._failed_start[ledger.id]
        if ledger.id not in self._arms:
            from specledger.ledger import trust
            from specledger.models import resolve_model

            try:  # before the model build: an untrusted ledger is refused at once
                if self.http is None or self.http.urls is None:
                    trust.check(ledger.data, str(ledger.path), trusted=self.trusted)
            except BaseException as exc:
                self._failed_start[ledger.id] = exc
                raise
            t_model = time.monotonic()
            model = resolve_model(ledger.data["target"]["model"])
            t0 = time.monotonic()
            self._model_build_s[ledger.id] = t0 - t_model
            specs = None if self.http is not None else \
                engines.arm_specs(ledger.data, model, source=str(ledger.path), trusted=self.trusted)
            if specs is not None and self.kv_sizing == "pinned":
                try:
                    specs = engines.pinned(specs, recorded_kv_blocks(ledger))
                except ValueError as exc:
                    self._failed_start[ledger.id] = exc
                    raise ValueError(f"{ledger.path}: $.arms[*].kv_cache.num_blocks: --ledger-kv-sizing pinned: "
                                     f"{exc}") from exc
            if specs is not None and self._open_specs is not None \
                    and all(spec in self._open_specs[1] for spec in specs):
                return self._share_engines(ledger, self._open_specs[0], specs)
            if specs is not None:
                try:
                    check_gpu_memory(ledger)
                except ValueError as exc:
                    self._failed_start[ledger.id] = exc
                    raise
            # One ledger's engines at a time: idle vLLM engines still take CPU (the CPU
            # engine's workers spin), which would skew the next ledger's measurements.
            self.close()
            failures: dict[str, BaseException] = {}
            try:
                if specs is None:
                    arms = self.http.open(ledger, model, self.progress)
                else:
                    if self.compile_first and engines.wants_compile_phase(specs) \
                            and not all(spec in self._compiled for spec in specs):
                        engines.compile_at_once(specs, progress=self.progress)
                        self._compiled += specs  # a later start of the same arms (--ledger-starts) finds it warm
                    started = engines.start_arms(specs, progress=self.progress, failures=failures)
                    arms = {arm.spec.name: arm for arm in started}
                    self._open_specs = (ledger.id, specs)
            except BaseException as exc:
                self._failed_start[ledger.id] = exc
                raise
            self._failed_arms[ledger.id] = failures
            self._engine_starts_s[ledger.id] = self._engine_starts_s.get(ledger.id, 0.0) + time.monotonic() - t0
            self._arms[ledger.id] = arms
            self.infos_by_ledger[ledger.id] = {name: arm.info for name, arm in arms.items()}
            self.progress(f"{ledger.id}: {len(arms)} arms up in {time.monotonic() - t0:.0f} s")
            diffs = config_differences({n: i["effective_config"] for n, i in self.infos_by_ledger[ledger.id].items()})
            for key, values in diffs.items():
                self.progress(f"{ledger.id}: arms differ in {key}: {values}")
        return self._arms[ledger.id]

    def _share_engines(self, ledger: Ledger, owner: str, specs: list[engines.ArmSpec]) -> dict[str, Any]:
        """Measure `ledger` on the engines `owner` started: each of its arms is one of them (same name, model,
        engine arguments and environment), so a second start would cost GPU seconds (and a minute an arm on
        a slow CPU) and buy nothing. Engines it does not use close first: an idle engine still takes CPU.
        Its KV cache and effective config are those engines'; its provenance names the owner."""
        names = {spec.name for spec in specs}
        owned = self._arms[owner]
        extra = {name: arm for name, arm in owned.items() if name not in names}
        for arm in extra.values():
            arm.close()
        if extra:  # a ledger that held a closed engine starts its arms again when it next measures
            self._arms = {lid: arms for lid, arms in self._arms.items()
                          if not any(arm is gone for arm in arms.values() for gone in extra.values())}
            self._open_specs = (ledger.id, specs)
        self._arms[ledger.id] = {name: arm for name, arm in owned.items() if name in names}
        self.infos_by_ledger[ledger.id] = {name: info for name, info in self.infos_by_ledger[owner].items()
                                           if name in names}
        self._failed_arms[ledger.id] = {name: exc for name, exc in self._failed_arms.get(owner, {}).items()
                                        if name in names}
        self._engine_starts_s[ledger.id] = 0.0
        self._shared_with[ledger.id] = owner
        closed = f"; closed {', '.join(sorted(extra))}, which it does not use" if extra else ""
        self.progress(f"{ledger.id}: measured on the engines of {owner} (the same arms: no second start{closed})")
        return self._arms[ledger.id]

    def arm_failure(self, ledger: Ledger, arm: str) -> BaseException | None:
        """The start error of an arm that could not start (its tests fail with it)."""
        return self._failed_arms.get(ledger.id, {}).get(arm)

    def dead_arms(self, ledger_id: str) -> dict[str, str]:
        """Arms of the ledger's open engines that cannot serve again, with why (``ArmEngine.dead_reason``; HTTP
        endpoints have none)."""
        return {name: why for name, arm in self._arms.get(ledger_id, {}).items()
                if (why := getattr(arm, "dead_reason", None)) is not None}

    def infos(self, ledger_id: str) -> dict[str, Any]:
        """The ledger's arm infos by arm name; empty before its engines started."""
        return self.infos_by_ledger.get(ledger_id, {})

    def model_build_s(self, ledger_id: str) -> float:
        """Seconds the ledger's target model took to resolve (build or fetch) before its engines started."""
        return self._model_build_s.get(ledger_id, 0.0)

    def engine_starts_s(self, ledger_id: str) -> float:
        """Seconds spent starting the ledger's engines, over all its starts (0 when it shared another's)."""
        return self._engine_starts_s.get(ledger_id, 0.0)

    def shared_with(self, ledger_id: str) -> str | None:
        """The ledger whose engines this one measured on (None: its own), for its provenance."""
        return self._shared_with.get(ledger_id)

    def close(self) -> None:
        """Close every open engine once (ledgers that shared engines hold the same ones); infos stay."""
        closed: set[int] = set()
        for arms in self._arms.values():
            for arm in arms.values():
                if id(arm) not in closed:
                    closed.add(id(arm))
                    arm.close()
        self._arms.clear()
        self._open_specs = None
