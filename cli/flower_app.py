"""The process `detq flower` runs: Flower on detq's own Celery app, with the broker's TLS settings."""

from __future__ import annotations

import sys

from celery import Celery

from cli.base import load_settings
from detq.broker_url import tls_options
from detq.celery_app import make_celery_app
from detq.settings import Settings


def flower_app(settings: Settings) -> Celery:
    """detq's Celery app, with a rediss:// broker's TLS settings also as broker_use_ssl.

    Flower's broker view (its queue lengths) opens a Redis connection of its own, built from
    broker_use_ssl alone: it ignores the URL's ssl_* parameters (flower.utils.broker.RedisSsl), so a
    server signed by a private CA failed its certificate check there, where workers and producers pass.
    """
    app = make_celery_app(settings)
    options = tls_options(settings.resolved_broker_url)
    if options is not None:
        app.conf.broker_use_ssl = options
    return app


def main(argv: list[str]) -> int:
    """Run `celery flower` with these arguments on the app of the settings in the environment."""
    code: int | None = flower_app(load_settings()).start(["flower", *argv])
    return code or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
