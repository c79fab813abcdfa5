"""Reading a Markdown report: claim marks outside fenced and inline code, and the numbers with a multiplier
or tokens/s unit that a claim on their line must vouch for."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from specledger.analysis.claims.grammar import NUMBER_PATTERN, UNIT_METRICS, Claim, Malformed, UnitNumber, parse_claim

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)")
_CLAIM = re.compile(r"^\s*claim:(.*)$", re.S)
_UNITS = (
    ("x", re.compile(rf"(?<![\w.,])({NUMBER_PATTERN})(?:x| ?×)(?![\w])")),
    ("tok/s", re.compile(rf"(?<![\w.,])({NUMBER_PATTERN}) ?(?:tok/s|tokens/s|tok/sec|tokens/sec|tokens per second)\b")),
)


@dataclass
class Scan:
    """What a Markdown file says: its claim marks (parsed or not) and its unit numbers."""

    claims: list[Claim | Malformed] = field(default_factory=list)
    numbers: list[UnitNumber] = field(default_factory=list)


def _outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) for lines outside fenced code blocks, inline code blanked out."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, _INLINE_CODE.sub(lambda s: " " * len(s.group(0)), line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            fence = None


def scan_markdown(text: str, file: str) -> Scan:
    """Claims and unit numbers of a Markdown text; code and non-claim comments are skipped."""
    scan = Scan()
    in_comment = False
    for number, line in _outside_fences(text):
        visible, claims = [], []
        rest = line
        while rest:
            if in_comment:
                end = rest.find("-->")
                if end < 0:
                    break
                rest, in_comment = rest[end + 3 :], False
                continue
            start = rest.find("<!--")
            if start < 0:
                visible.append(rest)
                break
            visible.append(rest[:start])
            rest = rest[start + 4 :]
            end = rest.find("-->")
            body = rest if end < 0 else rest[:end]
            claim = _CLAIM.match(body)
            if claim and end < 0:
                text = " ".join(claim.group(1).split())
                claims.append(Malformed(file, number, text, "claim comment must close on its line"))
            elif claim:
                claims.append(parse_claim(claim.group(1), file, number))
            if end < 0:
                in_comment = True
                break
            rest = rest[end + 3 :]
        scan.claims.extend(claims)
        shown = " ".join(visible)
        found = sorted(
            ((m.start(), unit, m) for unit, pattern in _UNITS for m in pattern.finditer(shown)), key=lambda f: f[0]
        )
        for _, unit, m in found:
            digits = m.group(1).replace(",", "")
            stated = [v for c in claims if isinstance(c, Claim) and c.metric in UNIT_METRICS[unit] for v in c.values]
            audited = any(v.plain == digits for v in stated)
            # as many claimed values as shown numbers of the unit: each shown one should be among them
            shown = sum(u == unit for _, u, _ in found)
            claimed = tuple(v.text for v in stated) if len(stated) >= shown else ()
            scan.numbers.append(UnitNumber(file, number, m.group(0).strip(), m.group(1), unit, audited, claimed))
    return scan


