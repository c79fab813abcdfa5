"""One root for the errors specledger raises on purpose.

A caller such as a CI wrapper, a notebook or the CLI can then tell specledger's refusals from bugs:
`except SpecledgerError`. The refusals are a ledger that does not load, an untrusted engine setting, a busy
machine, and an engine that would not start. Each class also keeps its builtin base, ValueError for bad input
and RuntimeError for a machine or engine that failed, so code that catches those still works.
"""

from __future__ import annotations

__all__ = ["SpecledgerError"]


class SpecledgerError(Exception):
    """Something specledger refused or could not do. The message names the file and JSON path, or the engine."""
