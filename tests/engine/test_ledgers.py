"""One test per ledger point: verify against the committed figures, or record with --ledger-record.

Parametrized by the specledger plugin from ledgers/ (see specledger.plugin).
"""


def test_point(ledger_point, ledger_check):
    ledger_check(ledger_point)
