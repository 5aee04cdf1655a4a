"""Worker side of detq: the Celery app, per-process model loading, decoding, inference and the batch task."""
