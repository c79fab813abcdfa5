"""Per arm: KV tokens against blocks x block size, sessions against tokens, and the stated change
against the baseline arm's capacity (from tokens, else from sessions at a shared context)."""

from __future__ import annotations

from typing import Any

from specledger.analysis import theory
from specledger.analysis.audit.base import Auditor, num
from specledger.ledger.figures import decimals_of, decimals_word, ratio_interval, rounds_to


def check_kv_cache(a: Auditor) -> None:
    """Every arm's KV tokens against its blocks, its sessions against its tokens, its stated change."""
    d_sessions = a.ledger.rounding["sessions"]
    for i, arm in enumerate(a.ledger.arms):
        kv = arm.get("kv_cache") or {}
        tokens = kv.get("tokens")
        blocks, block_size = kv.get("num_blocks"), kv.get("block_size")
        if (
            tokens is not None
            and blocks is not None
            and block_size is not None
            and tokens != blocks * block_size
        ):
            a.add(
                ["arms", i, "kv_cache", "tokens"],
                "kv-tokens",
                f"{tokens} tokens, but {blocks} blocks x {block_size} = {blocks * block_size}",
            )
        if tokens is not None:
            for j, entry in enumerate(arm.get("sessions") or []):
                exact = theory.sessions(tokens, entry["context_tokens"])
                a.verdict(
                    ["arms", i, "sessions", j, "sessions"],
                    "sessions",
                    rounds_to(entry["sessions"], exact, exact, d_sessions),
                    f"{tokens}/{entry['context_tokens']} = {exact:.4f} sessions, stated as "
                    f"{num(entry['sessions'])} (rounding: {decimals_word(d_sessions)})",
                    info=False,
                )
        if "change_vs_baseline" in kv:
            kv_change(a, i, arm, kv["change_vs_baseline"], d_sessions)


def kv_change_interval(a: Auditor, arm: dict[str, Any], context: int | None = None) -> tuple[float, float, str] | None:
    """Exact-ish relative KV change against the baseline arm: from tokens, else from sessions.

    Returns (lo, hi, how) or None when neither the tokens nor sessions at a shared context exist.
    """
    base_name = a.ledger.baseline_arm_for(arm["name"])
    if base_name is None:
        return None
    base = a.ledger.arm(base_name)
    tokens, base_tokens = (
        (arm.get("kv_cache") or {}).get("tokens"),
        (base.get("kv_cache") or {}).get("tokens"),
    )
    if tokens is not None and base_tokens:
        exact = tokens / base_tokens - 1
        return exact, exact, f"{tokens}/{base_tokens} - 1 = {exact:.4f}"
    mine = {s["context_tokens"]: s["sessions"] for s in arm.get("sessions") or []}
    theirs = {s["context_tokens"]: s["sessions"] for s in base.get("sessions") or []}
    shared = [c for c in mine if c in theirs and (context is None or c == context)]
    if not shared or not theirs[shared[0]]:
        return None
    ctx, d = shared[0], a.ledger.rounding["sessions"]
    lo, hi = ratio_interval(mine[ctx], d, theirs[ctx], d)
    ratio = mine[ctx] / theirs[ctx]
    how = (
        f"sessions at {ctx} tokens {num(mine[ctx])}/{num(theirs[ctx])} = {ratio:.3f} "
        f"(change {ratio - 1:+.3f}; rounding allows {lo - 1:+.4f}..{hi - 1:+.4f})"
    )
    return lo - 1, hi - 1, how


def kv_change(a: Auditor, i: int, arm: dict[str, Any], stated: float, d_sessions: int) -> None:
    """The stated `change_vs_baseline` must be a rounding of the change the capacities give."""
    found = kv_change_interval(a, arm)
    if found is None:
        return
    lo, hi, how = found
    decimals = decimals_of(stated)
    holds = rounds_to(stated, lo, hi, decimals)
    verb = "holds" if holds else "does not hold"
    a.verdict(
        ["arms", i, "kv_cache", "change_vs_baseline"],
        "kv-change",
        holds,
        f"{how}, stated as {num(stated)}: {verb} at {decimals_word(decimals)}",
        info=a.reference,
    )
