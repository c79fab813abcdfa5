"""Arms over HTTP: a vLLM OpenAI-compatible server subprocess (`servers`), ledger arms that stream completions from
such servers (`endpoints`), and a server's spec counters read from its Prometheus `/metrics` text (`server_metrics`).

No vLLM import here: the servers are subprocesses, so `specledger watch` and `--ledger-endpoints` run on any machine
that reaches them.
"""
