"""The claim-mark grammar: what a claim says (its metrics, subjects, stated values) and the parser.

No ledger is read here; `check` resolves a parsed claim against the ledgers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from specledger.ledger.figures import POOLED_FIGURES

#: Figures of one arm at one point (workload, temperature, concurrency).
POINT_METRICS = (
    "multiplier",
    "multiplier.low",
    "multiplier.high",
    "multiplier_vs_matched",
    "multiplier_vs_matched.low",
    "multiplier_vs_matched.high",
    "acceptance_length",
    "acceptance_rate",
    "output_tokens_per_s",
    "output_tokens_per_s.mean",
    "output_tokens_per_s.min",
    "output_tokens_per_s.max",
    "spread",
)
#: `.low`/`.high` of a multiplier: the bounds of its stored 95% CI (protocol v3 points).
CI_BOUNDS = {"low": 0, "high": 1}
#: Figures of one arm as a whole (its KV cache); `sessions` also needs ctx=.
ARM_METRICS = ("kv_cache_tokens", "kv_cache_change", "sessions")
CRITICAL = "critical_concurrency"
#: Figures of one arm over its replicated points: how a pooled figure moves per doubled host slice between engine
#: starts (`specledger audit`'s host-sensitivity, ``figures.host_elasticities``), with the bounds of its 95% interval.
HOST_METRICS = tuple(f"{figure}.per_host_doubling{bound}"
                     for figure in POOLED_FIGURES for bound in ("", ".low", ".high"))
#: Point figures that each engine start of a point has on its own (`start=N`, the start as `specledger show` numbers
#: it): what a report quotes when it says how far a point's starts disagree.
START_METRICS = ("multiplier", "multiplier_vs_matched", "output_tokens_per_s")
METRICS = (*POINT_METRICS, *ARM_METRICS, *HOST_METRICS, CRITICAL)
#: Which claims can vouch for a visible number with this unit.
UNIT_METRICS: dict[str, tuple[str, ...]] = {
    "x": ("multiplier", "multiplier.low", "multiplier.high", "multiplier_vs_matched", "multiplier_vs_matched.low",
          "multiplier_vs_matched.high"),
    "tok/s": ("output_tokens_per_s", "output_tokens_per_s.mean", "output_tokens_per_s.min", "output_tokens_per_s.max"),
}
CROSSING_WORDS = ("no-crossing", "stays-above", "starts-below")

Status = Literal["holds", "fails", "unresolved"]
CrossingKind = Literal["crosses", "no-crossing", "stays-above", "starts-below"]


# --------------------------------------------------------------------------------------------
# what a claim says
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stated:
    """A number as the report writes it; its decimals are the rounding it claims."""

    text: str
    value: float
    decimals: int

    @property
    def plain(self) -> str:
        """The digits without thousands separators: how a visible number is matched to its claim."""
        return self.text.replace(",", "").lstrip("+")


@dataclass(frozen=True)
class Subject:
    """What one stated value is about: an arm, and the point or context it is taken at."""

    arm: str
    workload: str | None = None
    temperature: float | None = None
    concurrency: int | None = None
    context: int | None = None
    start: int | None = None


@dataclass(frozen=True)
class CrossingStatement:
    """A claim about where the multiplier curve first falls below 1.0 (or that it does not)."""

    kind: CrossingKind
    value: Stated | None = None
    between: tuple[int, int] | None = None


@dataclass(frozen=True)
class Claim:
    """One parsed claim mark: `subjects` and `values` pair up (several only with an arrow)."""

    file: str
    line: int
    text: str
    ledger: str
    metric: str
    subjects: tuple[Subject, ...]
    values: tuple[Stated, ...] = ()
    crossing: CrossingStatement | None = None


@dataclass(frozen=True)
class Malformed:
    """A claim mark that does not parse; it fails the audit like an unresolved reference."""

    file: str
    line: int
    text: str
    reason: str


@dataclass(frozen=True)
class UnitNumber:
    """A visible number with a multiplier or tokens/s unit, and whether a claim vouches for it."""

    file: str
    line: int
    text: str
    number: str
    unit: str
    audited: bool
    #: The values the line's claims state instead, when they are as many as the line shows numbers of
    #: this unit: then this number is not merely unclaimed but contradicts its claim (an error).
    claimed: tuple[str, ...] = ()

    @property
    def mismatch(self) -> bool:
        return not self.audited and bool(self.claimed)

    def __str__(self) -> str:
        if self.mismatch:
            where = f"{self.file}:{self.line}: error: shown number '{self.text}' differs from its claim"
            return f"{where} (the claim on its line states {', '.join(self.claimed)})"
        where = f"{self.file}:{self.line}: warning: unaudited number"
        return f"{where} '{self.text}' (no claim on its line states {self.number})"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one claim; `reason` starts with the status word."""

    file: str
    line: int
    text: str
    status: Status
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: claim '{self.text}': {self.reason}"


# --------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------

#: A number as a report writes it (thousands separators allowed); `scan` finds visible numbers with it too.
NUMBER_PATTERN = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_STATED = re.compile(rf"^[+-]?(?:{NUMBER_PATTERN})%?$")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
_KEYS = ("T", "c", "ctx", "start")


class _Syntax(ValueError):
    """A claim mark that does not follow the grammar."""


def _stated(text: str) -> Stated:
    """A stated number; a percentage is a fraction with two more decimals ("-36%" is -0.36 at 2)."""
    if not _STATED.match(text):
        raise _Syntax(f"value {text!r} is not a number (write e.g. 1.16, 0.3, 2,306 or -36%)")
    plain = text.replace(",", "")
    if plain.endswith("%"):
        digits = plain[:-1]
        return Stated(text, float(digits) / 100, len(digits.partition(".")[2]) + 2)
    return Stated(text, float(plain), len(plain.partition(".")[2]))


def _temperature(text: str) -> float | None:
    if text == "-":
        return None
    try:
        return float(text)
    except ValueError:
        raise _Syntax(f"T={text}: a temperature is a number or '-'") from None


def _whole(key: str, text: str, allow_null: bool) -> int | None:
    if allow_null and text == "-":
        return None
    if not text.isdigit() or int(text) < 1:
        raise _Syntax(f"{key}={text}: expected a positive whole number" + (" or '-'" if allow_null else ""))
    return int(text)


def _start(text: str) -> int:
    """An engine start as `specledger show` and the ledger's ``window.start`` number it: 0 is the recording's."""
    if not text.isdigit():
        raise _Syntax(f"start={text}: expected an engine start's number (0, 1, ...)")
    return int(text)


def _crossing(rhs: str) -> CrossingStatement:
    if rhs in CROSSING_WORDS:
        return CrossingStatement(rhs)  # type: ignore[arg-type]
    value_text, _, range_text = rhs.partition(" in ") if " in " in rhs else ("", "", rhs)
    if not value_text and not _RANGE.match(range_text):
        value_text, range_text = rhs, ""
    between = None
    if range_text:
        m = _RANGE.match(range_text.strip())
        if not m:
            raise _Syntax(f"{range_text.strip()!r} is not a concurrency range like 4..8")
        between = (int(m.group(1)), int(m.group(2)))
    try:
        value = _stated(value_text.strip()) if value_text else None
    except _Syntax:
        raise _Syntax(
            f"{rhs!r}: expected 4..8, 4.76, 4.76 in 4..8, {', '.join(CROSSING_WORDS[:-1])} or {CROSSING_WORDS[-1]}"
        ) from None
    return CrossingStatement("crosses", value, between)


def _slots(selectors: Sequence[str]) -> tuple[list[list[str]], dict[str, list[str]]]:
    """Positional selectors (arm, workload) and keyed ones (T=, c=, ctx=), each split on '->'.

    The workload is written as a point, ``copy:0:16`` (the grammar of `--ledger-points` and of test ids), whose
    T and C land in the keyed slots; the keyed ``T=0 c=16`` of earlier reports still parses."""
    positional: list[list[str]] = []
    keyed: dict[str, list[str]] = {}
    in_point: set[str] = set()
    for token in selectors:
        key, sep, value = token.partition("=")
        if sep:
            if key not in _KEYS:
                raise _Syntax(f"unknown selector {token!r} (known: T=, c=, ctx=, start=)")
            if key in keyed:
                raise _Syntax(f"{key}= given twice" + (" (once in the WORKLOAD:T:C point)" if key in in_point else ""))
            keyed[key] = value.split("->")
        else:
            if len(positional) == 2:
                raise _Syntax(f"unexpected {token!r}: after the ledger come ARM, WORKLOAD:T:C, then ctx=")
            workload, *point = token.split(":") if positional else [token]
            if len(point) > 2:
                raise _Syntax(f"{token!r}: a point is WORKLOAD:T:C (e.g. copy:0:16), with '-' for a null T or C")
            for key, value in zip(("T", "c")[: len(point)], point, strict=True):
                if key in keyed:
                    raise _Syntax(f"{key}= given twice: in {token!r} and as {key}=")
                keyed[key] = value.split("->")
                in_point.add(key)
            positional.append(workload.split("->"))
    if any("" in values for values in [*positional, *keyed.values()]):
        raise _Syntax("an empty name or value around '->'")
    return positional, keyed


def _check_selectors(metric: str, positional: list[list[str]], keyed: dict[str, list[str]]) -> None:
    """Each metric kind names exactly what it needs: a point, an arm, or a curve."""
    if not positional:
        raise _Syntax("names no arm")
    if metric in ARM_METRICS or metric in HOST_METRICS:
        if "start" in keyed:
            raise _Syntax(f"{metric} is a figure of the arm: it takes no start=")
        if len(positional) > 1 or "T" in keyed or "c" in keyed:
            raise _Syntax(f"{metric} is a figure of the arm: name no workload or point")
        if metric == "sessions" and "ctx" not in keyed:
            raise _Syntax("sessions needs ctx=CONTEXT_TOKENS")
        if metric != "sessions" and "ctx" in keyed:
            raise _Syntax(f"{metric} takes no ctx=")
        return
    if len(positional) < 2:
        raise _Syntax(f"{metric} needs a workload after the arm")
    if "ctx" in keyed:
        raise _Syntax(f"{metric} takes no ctx=")
    if metric == CRITICAL and "c" in keyed:
        raise _Syntax("critical_concurrency is over the concurrency curve: name no concurrency (write copy:0)")
    if "start" in keyed and metric not in START_METRICS:
        raise _Syntax(f"start= takes one of {', '.join(START_METRICS)} (an engine start's own figure), not {metric}")


def parse_claim(body: str, file: str, line: int) -> Claim | Malformed:
    """Parse the text after `claim:`; a Malformed says what is wrong instead of raising."""
    text = " ".join(body.split())
    try:
        return _parse(text, file, line)
    except _Syntax as e:
        return Malformed(file, line, text, str(e))


def _parse(text: str, file: str, line: int) -> Claim:
    tokens = text.split()
    if "=" not in tokens:
        raise _Syntax("missing ' = VALUE' after the metric (with spaces around '=')")
    split = tokens.index("=")
    lhs, rhs = tokens[:split], " ".join(tokens[split + 1 :])
    if len(lhs) < 2:
        raise _Syntax("expected LEDGER ARM [WORKLOAD[:T[:C]]] [ctx=] METRIC before '='")
    ledger, *selectors, metric = lhs
    if metric not in METRICS:
        raise _Syntax(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    if not rhs:
        raise _Syntax("no value after '='")
    positional, keyed = _slots(selectors)
    _check_selectors(metric, positional, keyed)
    slots = {"arm": positional[0], "workload": positional[1] if len(positional) > 1 else [None]}
    slots["T"] = [_temperature(v) for v in keyed.get("T", ["-"])]
    slots["c"] = [_whole("c", v, True) for v in keyed.get("c", ["-"])]
    slots["ctx"] = [_whole("ctx", v, False) for v in keyed["ctx"]] if "ctx" in keyed else [None]
    slots["start"] = [_start(v) for v in keyed["start"]] if "start" in keyed else [None]
    varying = [name for name, values in slots.items() if len(values) > 1]
    if len(varying) > 1:
        raise _Syntax(f"'->' in more than one slot ({', '.join(varying)}); one claim varies one thing")
    n = len(slots[varying[0]]) if varying else 1
    subjects = tuple(
        Subject(*(values[i if len(values) > 1 else 0] for values in slots.values()))  # type: ignore[arg-type]
        for i in range(n)
    )
    if metric == CRITICAL:
        if n > 1 or "->" in rhs:
            raise _Syntax("a critical_concurrency claim names one curve and one statement")
        return Claim(file, line, text, ledger, metric, subjects, crossing=_crossing(rhs))
    values = tuple(_stated(v.strip()) for v in rhs.split("->"))
    if len(values) != n:
        raise _Syntax(f"{len(values)} value(s) for {n} subject(s): '->' on both sides must pair up")
    return Claim(file, line, text, ledger, metric, subjects, values)


