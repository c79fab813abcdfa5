"""What people look at: tables (`show`), PNG plots (`plot`) and the Markdown report (`report`), all drawn from ledgers.

The layer reads ledgers and the figures computed in `specledger.ledger.figures` and `specledger.analysis.theory`; it
measures nothing and writes no ledger. `tables` is the one place the points and crossings become rows, so `plots` and
`markdown` show the same numbers as `show`.
"""
