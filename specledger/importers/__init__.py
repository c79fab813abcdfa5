"""Importers: figures measured by other tools, filed as specledger ledgers so that `show`, `audit`, `plot` and
`policy` work on them. `vllm_bench` reads `vllm bench serve --save-result` files.

The layer writes ledgers through `specledger.ledger` and starts no engine; importing this package imports nothing.
"""
