"""Producer side of detq: scanning folders, creating jobs, enqueueing, exporting; never imports torch."""
