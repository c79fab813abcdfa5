"""Measuring on engines: the engine workers (`engines`), the closed-loop load that drives them (`driver`), protocol v3
for one point (`procedure`), the spec-decode counters (`counters`), engines per ledger and recording (`session`), the
machine's fingerprint (`fingerprint`), a live server watched against its ledger (`watch`), the suite against
`vllm bench serve` (`crosscheck`), and arms over HTTP (`http`).

The layer records measured points in ledgers; `analysis` and `render` only read them. Importing this package imports
nothing: each module is loaded where it is used, and vLLM only inside functions (the engine workers, `crosscheck`'s
bench).
"""
