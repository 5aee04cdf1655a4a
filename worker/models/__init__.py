"""A model file on the worker: loading per device, metadata, formats, YOLO, letterbox, device repair."""
