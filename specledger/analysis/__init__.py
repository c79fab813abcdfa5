"""What the measured figures mean: models of them (`theory`), verdicts on a fresh measurement (`verdict`), checks
of a ledger (`audit`) and of the reports that quote it (`claims`), and what to deploy (`policy`, `mix`).

The layer reads ledgers and `specledger.ledger.figures`; it starts no engine, so it runs anywhere the ledgers are.
"""
