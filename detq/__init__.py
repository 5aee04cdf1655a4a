"""detq: run a trained object detector over folders of images with Celery pools."""

__version__ = "0.1.0"
