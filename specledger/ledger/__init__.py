"""The ledger format: what a ledger holds (`model`), how an input file is read without hanging or crashing
(`safe_read`), the JSON Schema and the checks a ledger must pass (`validate`, and its `schemas/`; whether its arms fit
the GPU: `gpu_memory`), loading and atomic writing (`io`), and what is read out of a valid ledger: the points a run
selects (`selection`), the figures a point yields (`figures`), the engine settings it may carry (`trust`), and the
rewrite of version 1 ledgers (`migrate`).

Every other layer reads or writes ledgers through this one. It imports only the standard library at import time
(jsonschema when a ledger is first validated), so the names nearly every caller uses are re-exported here:
``from specledger.ledger import Ledger, load_ledger``. Their one home is the module named in `__all__`'s comment.
"""

from specledger.ledger.io import dump_ledger, iter_ledger_paths, load_ledger, write_ledger
from specledger.ledger.model import Ledger, LedgerError
from specledger.ledger.validate import parse_ledger

# model: Ledger, LedgerError; validate: parse_ledger; io: load_ledger, write_ledger, dump_ledger, iter_ledger_paths
__all__ = ["Ledger", "LedgerError", "dump_ledger", "iter_ledger_paths", "load_ledger", "parse_ledger", "write_ledger"]
