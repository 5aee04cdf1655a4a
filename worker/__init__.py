"""Worker side of detq: the pool, the per-process runtime, the batch task and decoding; imports torch."""
