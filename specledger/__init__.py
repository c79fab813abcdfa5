"""specledger: speculative-decoding claims as committed, re-checkable ledgers."""

__version__ = "0.1.0"
