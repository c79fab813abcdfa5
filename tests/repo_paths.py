"""Where the repository's files are, for every test module: one home instead of a copy per module.

A module of its own rather than `tests/conftest.py`: the repository root has a conftest.py too (it loads the plugin
when specledger is not installed), and `from conftest import ...` would pick whichever of the two comes first on
sys.path. pytest puts `tests/` on sys.path when it imports `tests/conftest.py` ("prepend" import mode, no
`__init__.py` beside it), before it collects any test module, so `from repo_paths import ROOT` works in every test
module, also in the sub-folders (tests/ledger/, tests/engine/, ...)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SMALL = DATA / "measured-small.json"
"""The small measured ledger that the unit tests read (not a ledger of record)."""
CPU_LEDGER = ROOT / "ledgers" / "cpu-smollm2.json"
"""The committed CPU ledger, which the CPU-engine tests measure against."""
