"""Producer side of detq: scanning, jobs, enqueue, requeue, status, export, scheduled runs; no torch."""
