"""A measuring session: one measurement per point, atomic recording.

Shared by the pytest plugin and the demo so both measure the same way. Engines of a
ledger start on first use and stay up for the session (specledger.measure.engine_pool: they are expensive to
start; each point warms them up at its own concurrency, see specledger.measure.procedure); a point is measured once
for all its arms and cached, so two drafters in one ledger share the baseline run. The
session also decides what a measurement may be compared with (the machine fingerprint),
refuses to record on a busy machine, and says when a point needs more repeats. With ``starts``
above one, the engines start that many times and every planned point is measured in each start
(``_measure_in_starts``), so a point's interval covers the host's drift between starts.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specledger.analysis import verdict
from specledger.errors import SpecledgerError
from specledger.ledger import Ledger, figures, write_ledger
from specledger.ledger.io import remove_stale_temporaries
from specledger.ledger.model import SCHEMA_VERSION, LedgerError
from specledger.ledger.selection import point_label, point_test_id
from specledger.measure import engines, fingerprint, procedure, recording, replication
from specledger.measure.engine_pool import EnginePool
from specledger.render.tables import config_differences

if TYPE_CHECKING:
    from specledger.measure.http.endpoints import HTTPMode

Progress = Callable[[str], None]


class BusyMachine(SpecledgerError, RuntimeError):
    """Recording refused: other processes are using the CPU, and their load would land in the figures."""


class StoreRefused(SpecledgerError, RuntimeError):
    """Not measured: an earlier point of this ledger was measured and then refused by the ledger's own rules, and
    every later point would be refused with it (the working ledger holds the refused point)."""


class PointNotMeasured(SpecledgerError, RuntimeError):
    """Not measured, at once: the point already failed in this session (a point is measured once for all its arm
    tests, and so fails once), or an arm of its ledger has a dead engine that no later window can run on. Why: on
    2026-12-05 an arm died of CUDA out of memory, and each of the next ten arm tests warmed the five live arms up
    again before failing on the dead one, 500 device seconds spent on nothing."""


class SuiteSession:
    def __init__(self, *, root: Path, record: bool, out_dir: Path | None = None,
                 progress: Progress = print, command: str | None = None, only_missing: bool = False,
                 http: HTTPMode | None = None, force_busy: bool = False, adaptive: bool = True,
                 budget_s: float | None = None, trusted: bool = False, full_protocol: bool = False,
                 kv_sizing: str = "default", starts: int = 1, add_start: bool = False,
                 start_repeats: int | None = None, compile_first: bool = False) -> None:
        if http is not None and record:
            raise ValueError("HTTP mode verifies only: a ledger's figures are recorded with in-process engines "
                             "(over HTTP the tokens/s include the client and server overhead)")
        self.http = http
        self.root = root
        self.record = record
        self.only_missing = only_missing
        self.out_dir = out_dir
        self.progress = progress
        self.command = command
        self.force_busy = force_busy
        self.adaptive = adaptive
        self.budget_s = budget_s
        self.trusted = trusted
        self.full_protocol = full_protocol
        if kv_sizing not in ("default", "pinned"):
            raise ValueError(f"kv_sizing must be 'default' or 'pinned', not {kv_sizing!r}")
        self.kv_sizing = kv_sizing
        if starts < 1:
            raise ValueError(f"starts must be at least 1, not {starts!r}")
        if starts > 1 and http is not None:
            raise ValueError("several engine starts need in-process engines: over HTTP the servers are not ours "
                             "to restart")
        self.starts = starts
        self._planned: dict[str, list[tuple[str, float, int]]] = {}
        if add_start and (not record or only_missing):
            raise ValueError("adding a start to recorded points needs --ledger-record, without --ledger-only-missing "
                             "(which skips the points it would add to)")
        self.add_start = add_start
        if start_repeats is not None and (start_repeats < 2 or (starts < 2 and not add_start)):
            raise ValueError(f"start_repeats={start_repeats!r}: the paired repeats of each arm in each engine start, "
                             "at least 2, with several starts (--ledger-starts) or --ledger-add-start")
        self.start_repeats = start_repeats
        self._starts_added: set[tuple[str, tuple[str, float, int]]] = set()
        self._first_stored: set[tuple[str, tuple[str, float, int]]] = set()  # points this run measured first
        self.pool = EnginePool(progress=progress, http=http, trusted=trusted, kv_sizing=kv_sizing,
                               compile_first=compile_first)
        self.results: list[tuple[str, Any]] = []
        self._machines: dict[str, dict[str, Any] | None] = {}
        self._host: dict[str, Any] | None = None  # this host's fingerprint without engines (start_elsewhere)
        self._cache: dict[tuple[str, tuple[str, float, int]], procedure.PointMeasurement] = {}
        self._recorded: dict[str, Ledger] = {}
        self._started = time.monotonic()
        self._started_at = _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
        self._stored: set[tuple[str, tuple[str, float, int]]] = set()
        self._targets: dict[Path, Path] = {}
        self._refused: dict[str, str] = {}  # ledger id -> why a store was refused (no point of it is measured after)
        self._failed: dict[tuple[str, tuple[str, float, int]], BaseException] = {}  # points that raised, by key

    # -- engines (specledger.measure.engine_pool) ----------------------------------------------------------
    def arms_for(self, ledger: Ledger) -> dict[str, Any]:
        """The ledger's arms (in-process engines, or HTTP endpoints in HTTP mode), started and warmed once."""
        return self.pool.arms_for(ledger)

    def arm_failure(self, ledger: Ledger, arm: str) -> BaseException | None:
        """The start error of an arm that could not start (its tests fail with it)."""
        return self.pool.arm_failure(ledger, arm)

    def infos(self, ledger_id: str) -> dict[str, Any]:
        """The ledger's arm infos by arm name; empty before its engines started."""
        return self.pool.infos(ledger_id)

    # -- measuring ---------------------------------------------------------------------------------------
    def over_budget(self, ledger: Ledger, key: tuple[str, float, int]) -> str | None:
        """Why no further point may start (None: it may): it would end past ``budget_s`` seconds after the session
        began. It is expected to take as long as the slowest point so far, or as long as it took in the ledger's
        earlier runs when that is longer (`recording.recorded_point_seconds`). Why the second: on 2026-12-04 a
        point that had taken 412 s started after points of at most 211 s, and the visit's timeout struck in it."""
        if self.budget_s is None:
            return None
        elapsed = time.monotonic() - self._started
        slowest = max((m.wall_s for m in self._cache.values()), default=0.0)
        earlier = recording.recorded_point_seconds(ledger.data.get("provenance"), point_label(key))
        if elapsed + max(slowest, earlier or 0.0) <= self.budget_s:
            return None
        why = (f"{point_label(key)} took {earlier:.0f} s in an earlier run of {ledger.id}"
               if earlier is not None and earlier > slowest else f"the slowest point took {slowest:.0f} s")
        return f"time budget: {elapsed:.0f} s spent, {why}, the budget is {self.budget_s:.0f} s ({self._resume(key)})"

    def _resume(self, key: tuple[str, float, int]) -> str:
        """The run that measures a point the budget left out. Why not always --ledger-only-missing: that skips a
        point the ledger has, so an added start or a verification left out by the budget was pointed at a run that
        measures nothing there (2026-12-07: free-form c=8 of an add-start visit, left out twice)."""
        if self.record and not self.add_start:
            return "resume with --ledger-record --ledger-only-missing"
        mode = "--ledger-record --ledger-add-start " if self.record else ""
        return f"measure it with {mode}--ledger-points {point_label(key)}"

    def cached(self, ledger: Ledger, key: tuple[str, float, int]) -> procedure.PointMeasurement | None:
        return self._cache.get((ledger.id, key))

    def machine(self, ledger: Ledger) -> dict[str, Any] | None:
        """This machine's fingerprint as the ledger's engines see it (None over HTTP: the server's is unknown;
        None, and not kept, before the ledger's engines are up: a fingerprint taken then would say nothing, and
        kept it made every later point of the run comparable with any machine)."""
        if ledger.id not in self._machines:
            infos = self.pool.infos(ledger.id)
            info = next(iter(infos.values()), None)
            if self.http is None and not info:
                return None
            machine = None if self.http is not None else fingerprint.machine_fingerprint(
                accelerator=info.get("accelerator"), engine=info.get("engine"), torch_version=info.get("torch_version"))
            if machine is not None:  # the engines are up and idle: the host's speed as the measurement will find it
                machine.update(fingerprint.host_state())
            self._machines[ledger.id] = machine
        return self._machines[ledger.id]

    def not_comparable(self, ledger: Ledger, key: tuple[str, float, int] | None = None) -> str | None:
        """Why this run's speed figures cannot be set against the ledger's (None: they can): against the
        machine of the run that recorded point `key` when the ledger keeps its runs."""
        if self.http is not None:
            return "measured over HTTP (tokens/s include the client and the server's API process)"
        current = self.machine(ledger)
        if current is None:
            return None
        recorded = self._recorded_machine(ledger, key)
        return fingerprint.another_machine(recorded, current)

    def start_elsewhere(self, ledger: Ledger, key: tuple[str, float, int]) -> str | None:
        """With ``add_start``: why this run's start of point ``key`` cannot join the ledger's, as far as the host
        tells before any engine starts (None: it may; the GPU, driver and engine are compared again when the start
        is stored). Why: a 2026-12-06 H100 visit measured three points for 340 s on another host, each refused only
        when stored."""
        if not self.add_start or self.http is not None or ledger.find_point(*key) is None:
            return None
        if self._host is None:
            self._host = fingerprint.machine_fingerprint()
        recorded = self._recorded_machine(ledger, key)
        return fingerprint.another_machine(recorded, self._host, keys=fingerprint.HOST_KEYS)

    def host_note(self, ledger: Ledger, key: tuple[str, float, int] | None = None) -> str | None:
        """The host's speed here beside the recording run's, for the verdict's notes (None: not known for both)."""
        current = self.machine(ledger)
        return None if current is None else fingerprint.host_state_note(self._recorded_machine(ledger, key), current)

    @staticmethod
    def _recorded_machine(ledger: Ledger, key: tuple[str, float, int] | None) -> dict[str, Any] | None:
        """The machine of the run that recorded point ``key`` (the ledger's latest without a key or without runs)."""
        prov = ledger.data.get("provenance") or {}
        run = recording.run_of_point(prov, point_label(key)) if key is not None else None
        return (run or prov).get("machine")

    def _more_rule(self, ledger: Ledger, key: tuple[str, float, int]) -> procedure.MoreRule | None:
        """When a point gets more repeats: an inconclusive verdict (verify), or a CI wider than half the band
        (record). None when this run's start joins others (``add_start``): the point's interval is then over its
        starts, which more windows of this one start cannot narrow."""
        if not self.adaptive or self.add_start:
            return None
        spec_arms = [a["name"] for a in ledger.speculative_arms()]
        if self.record:
            half = float(ledger.tolerances["multiplier_rel"]) / 2

            def wide(point: dict[str, Any], _: int) -> bool:
                for name in spec_arms:
                    res = point["arms"].get(name) or {}
                    lo, hi = res.get("multiplier_ci95") or (None, None)
                    if lo is not None and res.get("multiplier") and (hi - lo) / 2 / res["multiplier"] > half:
                        return True
                return False

            return wide
        committed = ledger.find_point(*key)
        if committed is None or self.not_comparable(ledger, key) is not None:
            return None
        if ledger.data.get("start_spread") or any(figures.arm_start_count(arm) > 1
                                                  for arm in committed["arms"].values()):
            return None  # judged over engine starts: more windows of this one start cannot settle it

        def unsettled(point: dict[str, Any], _: int) -> bool:
            return any(verdict.compare_point(ledger, a["name"], committed, point).outcome == "inconclusive"
                       for a in ledger.arms if a["name"] in point["arms"] and a["name"] in committed["arms"])

        return unsettled

    def _within_budget(self, rule: procedure.MoreRule | None, key: tuple[str, float, int]
                       ) -> procedure.MoreRule | None:
        """``rule``, but two more repeats run only when they would end within ``budget_s``: the time a repeat takes
        is taken as the point's time so far over its repeats (warm-up and acceptance pass included, so it errs
        long). Why: a visit's timeout that strikes mid-point takes every window of that point with it (2026-12-04:
        a 412 s point), while a point that stops at the protocol's repeats is still measured, its CI as wide as
        it is. Made when the point's measurement begins."""
        if rule is None or self.budget_s is None:
            return rule
        point_began = time.monotonic()

        def more(point: dict[str, Any], repeats: int) -> bool:
            if not rule(point, repeats):
                return False
            now = time.monotonic()
            two_more_s = 2 * (now - point_began) / max(repeats, 1)
            if now - self._started + two_more_s <= self.budget_s:
                return True
            self.progress(f"{point_label(key)}: {repeats} repeats do not settle it, but 2 more (about "
                          f"{two_more_s:.0f} s) would end past the time budget ({now - self._started:.0f} of "
                          f"{self.budget_s:.0f} s spent): it stays at {repeats} repeats")
            return False

        return more

    def _protocol(self, ledger: Ledger, key: tuple[str, float, int]) -> dict[str, Any] | None:
        """The protocol a point is measured under: None (the ledger's own) when recording, with
        ``full_protocol``, or where the verdict asserts speed; ``procedure.shown_only_protocol`` for a
        verification whose speed figures (a policy arm's bar among them) are only shown (``not_comparable``)."""
        if self.record or self.full_protocol:
            return None
        why = self.not_comparable(ledger, key)
        if why is None:
            return None
        cut = procedure.shown_only_protocol(procedure.protocol_for(ledger))
        self.progress(f"{ledger.id} {point_label(key)}: speed figures are shown, not asserted ({why}): "
                      f"{cut['warmup']['max_windows']} warm-up window and {cut['repeats']['min']} repeats "
                      "per arm (--ledger-full-protocol measures the ledger's own)")
        return cut

    def measure(self, ledger: Ledger, key: tuple[str, float, int]) -> procedure.PointMeasurement:
        cache_key = (ledger.id, key)
        if cache_key not in self._cache and ledger.id in self._refused:
            # a GPU visit once measured three more points (about 740 device seconds), each refused in turn
            raise StoreRefused(f"{ledger.path}: {point_label(key)} not measured: {self._refused[ledger.id]}; every "
                               "later point of this ledger would be refused with it")
        if cache_key not in self._cache:
            self._refuse_known_failure(ledger, key)
            elsewhere = self.start_elsewhere(ledger, key)
            if elsewhere is not None:  # before any engine starts or window runs
                raise replication.StartMismatch(f"{ledger.path}: point {point_label(key)}: not measured, since "
                                                f"--ledger-add-start could not add its start: {elsewhere}")
            if self.starts > 1:
                with self._remembering_failure(cache_key):
                    self._measure_in_starts(ledger, key)
            else:
                arms = self.arms_for(ledger)  # first: the protocol depends on the machine the engines see
                protocol = self._protocol(ledger, key)
                if self.add_start and self.start_repeats is not None:
                    protocol = self._repeats_per_start(ledger, protocol, self.start_repeats)
                with self._remembering_failure(cache_key):
                    m = self._measure_one(ledger, key, arms, protocol=protocol,
                                          more=self._within_budget(self._more_rule(ledger, key), key))
                self._cache[cache_key] = m
                self._announce(ledger, key, m)
        return self._cache[cache_key]

    @contextlib.contextmanager
    def _remembering_failure(self, cache_key: tuple[str, tuple[str, float, int]]) -> Iterator[None]:
        """Remember a measurement that raised, so that the point's other arm tests fail at once
        (`_refuse_known_failure`); a busy machine is not remembered, since the load may pass."""
        try:
            yield
        except BusyMachine:
            raise
        except Exception as exc:
            self._failed[cache_key] = exc
            raise

    def _refuse_known_failure(self, ledger: Ledger, key: tuple[str, float, int]) -> None:
        """Raise `PointNotMeasured` when measuring `key` can only fail again: it failed before in this session, or
        an arm of the ledger has a dead engine (``dead_reason``, engines.ArmEngine)."""
        earlier = self._failed.get((ledger.id, key))
        if earlier is not None:
            first = str(earlier).strip().splitlines()[0] if str(earlier).strip() else type(earlier).__name__
            raise PointNotMeasured(f"{ledger.path}: {point_label(key)} not measured again: it failed once in this "
                                   f"session, in an earlier arm test ({type(earlier).__name__}: {first})")
        dead = self.pool.dead_arms(ledger.id)
        if dead:
            arms = "; ".join(f"arm {name}: {why}" for name, why in dead.items())
            raise PointNotMeasured(f"{ledger.path}: {point_label(key)} not measured: an engine of {ledger.id} died "
                                   f"earlier in this session ({arms}), and every window on it would fail; "
                                   "resume in a new session with --ledger-record --ledger-only-missing")

    def plan(self, ledger: Ledger, key: tuple[str, float, int]) -> None:
        """Say that point `key` of `ledger` will be measured in this session: with several engine starts, the
        first point measured measures every planned point of its ledger in every start."""
        keys = self._planned.setdefault(ledger.id, [])
        if key not in keys:
            keys.append(key)

    def _measure_one(self, ledger: Ledger, key: tuple[str, float, int], arms: dict[str, Any], *,
                     protocol: dict[str, Any] | None, more: procedure.MoreRule | None = None,
                     start: int | None = None, passes: dict[str, Any] | None = None) -> procedure.PointMeasurement:
        """One point in the engines as they are now, with the machine's load before and after."""
        if not arms:  # every arm failed to start (the pool remembers why, and each arm's test shows its own)
            raise PointNotMeasured(f"{ledger.path}: {point_label(key)} not measured: no arm of {ledger.id} "
                                   "started (each arm's test shows its start error)")
        threshold = float(procedure.protocol_for(ledger)["busy_others_cpu_share"])
        before = fingerprint.sample_load(1.0)
        busy = fingerprint.is_busy(before, threshold)
        if busy:
            message = fingerprint.busy_message(before, threshold, top=fingerprint.top_other_processes())
            if self.record and not self.force_busy:
                raise BusyMachine(f"{ledger.id} {key[0]}:{key[1]:g}:{key[2]}: not recorded: {message}")
            self.progress(f"{ledger.id}: WARNING {message}")
        m = procedure.measure_point(ledger, arms, *key, root=self.root, progress=self.progress, more=more,
                                    protocol=protocol, start=start, passes=passes)
        after = fingerprint.sample_load(1.0)
        m.point["load"] = {"before": before.as_json(), "after": after.as_json()}
        if busy:
            m.point["busy"] = True
        return m

    def _measure_in_starts(self, ledger: Ledger, key: tuple[str, float, int]) -> None:
        """Every planned point of `ledger` in each of ``starts`` engine starts, then one point each from all starts.

        Why: windows of one start share its host state, and on a lent H200 the multiplier moved between starts by
        more than one start's interval (reports/evidence/2026-12-03-h200-affinity-ab). Each start measures every
        point with a share of the repeats, the points' order rotated from start to start, so each point's
        windows spread over the whole run; its interval is then taken over the starts (stats.replicated_estimate).
        No repeats are added adaptively here: more starts, not more windows of one start, narrow that interval."""
        keys = [k for k in self._planned.get(ledger.id, []) if (ledger.id, k) not in self._cache]
        if key not in keys:
            keys.insert(0, key)
        parts: dict[tuple[str, float, int], list[procedure.PointMeasurement]] = {k: [] for k in keys}
        last_start_s = 0.0
        for start in range(self.starts):
            if start:
                spent = time.monotonic() - self._started
                if self.budget_s is not None and spent + last_start_s > self.budget_s:
                    self.progress(f"{ledger.id}: engine start {start + 1} of {self.starts} not begun: {spent:.0f} s "
                                  f"spent, the last start took {last_start_s:.0f} s, the budget is "
                                  f"{self.budget_s:.0f} s")
                    break
                self.progress(f"{ledger.id}: engine start {start + 1} of {self.starts}: the arms start again")
                self.close()
            t0 = time.monotonic()
            arms = self.arms_for(ledger)
            shift = start % len(keys)
            for k in keys[shift:] + keys[:shift]:
                own = self._protocol(ledger, k) or procedure.protocol_for(ledger)
                protocol = self._repeats_per_start(ledger, own, self.start_repeats
                                                   or max(2, -(-int(own["repeats"]["min"]) // self.starts)))
                first = parts[k][0].passes if parts[k] else None
                parts[k].append(self._measure_one(ledger, k, arms, protocol=protocol, start=start, passes=first))
            last_start_s = time.monotonic() - t0
        for k, measured in parts.items():
            m = procedure.merge_starts(ledger, measured)
            m.point["load"] = {"before": measured[0].point["load"]["before"],
                               "after": measured[-1].point["load"]["after"]}
            if any(part.point.get("busy") for part in measured):
                m.point["busy"] = True
            self._cache[(ledger.id, k)] = m
            self._announce(ledger, k, m)

    @staticmethod
    def _repeats_per_start(ledger: Ledger, protocol: dict[str, Any] | None, repeats: int) -> dict[str, Any]:
        """The point's protocol with ``repeats`` paired repeats per arm in this engine start. Why fewer than the
        ledger's: once a point's interval is taken over starts, a start's own windows only make its figure a little
        less noisy, while each further start adds a degree of freedom; a GPU visit then covers more of a curve."""
        out = copy.deepcopy(protocol or procedure.protocol_for(ledger))
        out["repeats"] = {**out["repeats"], "min": int(repeats), "max": max(int(repeats), int(out["repeats"]["max"]))}
        return out

    @staticmethod
    def _start_count(point: dict[str, Any]) -> int:
        """How many engine starts a point's windows came from (every arm runs in every start)."""
        return figures.arm_start_count(next(iter(point["arms"].values())))

    @staticmethod
    def _multipliers(point: dict[str, Any]) -> str:
        """`ngram x1.42 (1.33..1.49) L=4.45, ...`: a point's drafters for a progress line."""
        return ", ".join(
            f"{name} x{res['multiplier']:.2f} ({res['multiplier_ci95'][0]:.2f}..{res['multiplier_ci95'][1]:.2f})"
            + (f" L={res['acceptance']['acceptance_length']:.2f}" if res.get("acceptance") else "")
            for name, res in point["arms"].items() if "multiplier" in res)

    def _announce(self, ledger: Ledger, key: tuple[str, float, int], m: procedure.PointMeasurement) -> None:
        starts = self._start_count(m.point)
        over = f", over {starts} engine starts" if starts > 1 else ""
        self.progress(f"{ledger.id} {point_label(key)}: {self._multipliers(m.point)} "
                      f"({m.wall_s:.1f} s, {m.point['repeats_added']} repeats added{over})")

    # -- recording ---------------------------------------------------------------------------------------
    def _point_to_store(self, working: Ledger, measured: procedure.PointMeasurement,
                        committed: Ledger) -> dict[str, Any]:
        """The measured point, or with ``add_start`` the ledger's point with this run's start(s) added (once per
        point: every arm's test stores the same measurement). ``committed``: the ledger as this run found it, the
        reference the added start is judged against (``working`` already pools this run's earlier starts)."""
        existing = working.find_point(*measured.key)
        done = (working.id, measured.key)
        if not self.add_start or existing is None:
            self._first_stored.add(done)
            return measured.point
        if done in self._starts_added or done in self._first_stored:
            # every arm's test stores the same measurement: a point this run recorded first is not joined with
            # itself (that doubled its one start into two alike, a zero between-start spread: 2026-12-04 visit)
            return existing
        why = self.not_comparable(working, measured.key)
        if why is not None:
            raise replication.StartMismatch(f"{working.path}: point {point_label(measured.key)}: not added: {why}")
        as_found = committed.find_point(*measured.key)
        if as_found is not None:  # always, here: a point only this run recorded returned above
            self._judge_added_start(committed, as_found, measured)
        point = replication.add_start(working, existing, measured.point)
        self._starts_added.add(done)
        starts = self._start_count(point)
        self.progress(f"{working.id} {point_label(measured.key)}: this run's start added, {starts} starts in all: "
                      f"{self._multipliers(point)}")
        return point

    def _judge_added_start(self, committed: Ledger, existing: Mapping[str, Any],
                           measured: procedure.PointMeasurement) -> None:
        """Judge this run's start against the point's committed start(s), each arm as `gpu-run verify` would,
        before it joins them. Why: the start comes from a run of its own (new processes, often a new lease), so
        one run both verifies the point and replicates it; on 2026-12-07 a verification of the H100 fp8 ledger's
        copy c=8 and the start added to it were two runs of the same lease, 12 minutes apart."""
        for arm in committed.data["arms"]:
            name = arm["name"]
            if name in existing["arms"] and name in measured.point["arms"]:
                result = verdict.compare_point(committed, name, existing, measured.point)
                self.progress(result.message(f"{point_test_id(committed.id, name, measured.key)}, this run's start "
                                             "against the committed"))

    def store(self, ledger: Ledger, measured: procedure.PointMeasurement) -> Path:
        """Upsert the point into the ledger and write it atomically right away: a crash loses one point. A point
        the ledger's rules refuse stops the recording of that ledger (``StoreRefused``), since the working ledger
        now holds it and would refuse every later point too."""
        try:
            return self._store(ledger, measured)
        except LedgerError as exc:
            self._refused.setdefault(ledger.id, f"storing {point_label(measured.key)} was refused: {exc}")
            raise

    def _store(self, ledger: Ledger, measured: procedure.PointMeasurement) -> Path:
        self._stored.add((ledger.id, measured.key))
        working = self._recorded.get(ledger.id)
        if working is None:
            working = Ledger(ledger.path, copy.deepcopy(ledger.data))
            self._recorded[ledger.id] = working
            for stale in remove_stale_temporaries(self._target_path(ledger)):  # a killed run's leftovers
                self.progress(f"{ledger.id}: removed {stale}, left by an interrupted write")
            # once, at the first store
            for line in recording.kv_cache_drift(ledger.arms, self.pool.infos_by_ledger[ledger.id]):
                self.progress(f"{ledger.id}: {line}; provenance.runs keeps each run's")
        replication.upsert_point(working, measured.key, self._point_to_store(working, measured, ledger))
        data = working.data
        facts = recording.arm_facts(working, self.pool.infos_by_ledger[ledger.id])
        for arm in data["arms"]:
            arm.update(facts.get(arm["name"], {}))
        data["status"] = "measured"
        data["schema_version"] = SCHEMA_VERSION
        data["protocol"] = procedure.protocol_for(working)
        previous = data.get("provenance")
        prov = recording.provenance(self.pool.infos_by_ledger[ledger.id], command=self.command,
                                  wall_s=time.monotonic() - self._started, root=self.root,
                                  machine=self.machine(ledger))
        prov["time_s"] = self.time_breakdown(ledger.id)
        recorded = [point_label(key) for (lid, key) in self._stored if lid == ledger.id]
        kv_tokens = {name: fact["kv_cache"]["tokens"] for name, fact in facts.items() if fact["kv_cache"].get("tokens")}
        shared = [point_label(key) for (lid, key) in self._starts_added if lid == ledger.id]
        prov["runs"] = recording.merge_runs(previous, prov, self._started_at, recorded, kv_tokens, shared)
        data["provenance"] = prov
        target = self._target_path(ledger)
        write_ledger(target, data, overwrite=True)
        return target

    def _target_path(self, ledger: Ledger) -> Path:
        """Where the recorded ledger goes: in place, or `out_dir`/<its file name>; two ledgers of one file
        name from different folders would overwrite each other there, so the second is refused."""
        assert ledger.path is not None
        if self.out_dir is None:
            return ledger.path
        self.out_dir.mkdir(parents=True, exist_ok=True)
        target = self.out_dir / ledger.path.name
        owner = self._targets.setdefault(target, ledger.path.resolve())
        if owner != ledger.path.resolve():
            raise FileExistsError(f"--ledger-out {self.out_dir}: {ledger.path} and {owner} would both be written "
                                  f"to {target}; record them into different folders")
        return target

    # -- reporting ---------------------------------------------------------------------------------------
    def time_breakdown(self, ledger_id: str) -> dict[str, Any]:
        """Where this run's seconds went for one ledger (GPU time is the scarce resource: the split says
        what a faster start would buy): model build, engine starts (each arm's build), the points'
        measurement, and staging before the run when ``SPECLEDGER_STAGING_S`` says (the visit's own
        count, which this process cannot see)."""
        mine = {point_label(key): m.wall_s for (lid, key), m in self._cache.items() if lid == ledger_id}
        walls = list(mine.values())
        builds = {name: round(seconds, 1) for name, info in self.pool.infos(ledger_id).items()
                  if (seconds := engines.build_seconds(info)) is not None}
        shared_with = self.pool.shared_with(ledger_id)
        out: dict[str, Any] = {
            "model_build": round(self.pool.model_build_s(ledger_id), 1),
            "engine_starts": round(self.pool.engine_starts_s(ledger_id), 1),
            "engine_builds": {} if shared_with else builds,  # the owner's provenance counts them
            "measurement": round(sum(walls), 1),
            "points": len(walls),
            "per_point": round(sum(walls) / len(walls), 1) if walls else None,
            "point_wall_s": {label: round(seconds, 1) for label, seconds in sorted(mine.items())},
            "session": round(time.monotonic() - self._started, 1),
        }
        if shared_with:
            out["engines_shared_with"] = shared_with
        staging = os.environ.get("SPECLEDGER_STAGING_S")
        if staging:
            try:
                out["staging"] = round(float(staging), 1)
            except ValueError:
                raise ValueError(f"SPECLEDGER_STAGING_S={staging!r}: expected seconds") from None
        return out

    def timing_records(self) -> list[dict[str, Any]]:
        return [{"ledger": lid, "workload": key[0], "temperature": key[1], "concurrency": key[2],
                 "point_wall_s": m.wall_s, "arms": m.timings} for (lid, key), m in self._cache.items()]

    def summary_lines(self) -> list[str]:
        lines = []
        for lid, infos in self.pool.infos_by_ledger.items():
            diffs = config_differences({n: i["effective_config"] for n, i in infos.items()})
            lines.append(f"specledger {lid}: effective-config differences between arms (beyond the drafter): "
                         + ("none" if not diffs else ""))
            for key, values in diffs.items():
                lines.append(f"  {key}: " + ", ".join(f"{arm}={val}" for arm, val in values.items()))
            for name, info in infos.items():
                kv = info["kv_cache"]
                lines.append(f"  KV cache {name}: {kv['tokens']} tokens "
                             f"({kv['num_blocks']} blocks x {kv['block_size']})")
        for lid in self.pool.infos_by_ledger:
            t = self.time_breakdown(lid)
            lines.append(f"specledger {lid} seconds: "
                         + (f"staging {t['staging']}, " if "staging" in t else "")
                         + f"model build {t['model_build']}, engine starts {t['engine_starts']} ("
                         + ", ".join(f"{a} {s}" for a, s in t["engine_builds"].items())
                         + f"), measurement {t['measurement']} over {t['points']} points"
                         + (f" ({t['per_point']} per point)" if t["per_point"] else "")
                         + f"; session {t['session']}")
        if self._recorded:
            for lid, ledger in self._recorded.items():
                lines.append(f"specledger recorded {lid} -> {self._target_path(ledger)}")
        mode = "over HTTP" if self.http is not None else "in-process"
        for (lid, key), m in sorted(self._cache.items()):
            medians = ", ".join(f"{name} {res['output_tokens_per_s']['median']:.1f}"
                                for name, res in m.point["arms"].items())
            lines.append(f"specledger {lid} {point_label(key)} ({mode}): median tok/s {medians}")
        if self.results:
            counts = Counter(r.outcome for _, r in self.results)
            lines.append(f"specledger verified {len(self.results)} arm-points {mode}: "
                         + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
                         + f"; session wall {time.monotonic() - self._started:.0f} s (engine starts included)")
        return lines

    def close(self) -> None:
        """Close the open engines (between engine starts, and at the session's end)."""
        self.pool.close()
