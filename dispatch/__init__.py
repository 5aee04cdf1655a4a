"""The queue side of the ledger: sending batches, seeing what the broker holds, reconciling the two."""
