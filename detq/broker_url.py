"""Broker URL policy: which URLs are Redis; a rediss:// broker's certificate is checked unless the URL says
otherwise."""

from __future__ import annotations

from typing import Any

REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://")


def is_redis_url(url: str) -> bool:
    """Whether this broker URL names Redis (over TCP, TLS or a Unix socket)."""
    return url.startswith(REDIS_SCHEMES)


def verified_tls(url: str) -> str:
    """A rediss:// URL with ssl_cert_reqs=required added where it names no ssl_cert_reqs; others as given.

    Given a bare rediss:// URL, kombu connects without checking the server's certificate (it warns,
    "defaulting to insecure SSL behaviour"), so anyone on the path could pose as the broker. detq checks it
    against the system's CAs, or the one named by ssl_ca_certs in the URL; ssl_cert_reqs=none in the URL
    turns the check off.
    """
    if not url.startswith("rediss://"):
        return url
    base, _, query = url.partition("?")
    if any(part.split("=", 1)[0] == "ssl_cert_reqs" for part in query.split("&")):
        return url
    return f"{base}?{query}&ssl_cert_reqs=required" if query else f"{base}?ssl_cert_reqs=required"


def tls_options(url: str) -> dict[str, Any] | None:
    """The TLS settings of a rediss:// URL as kombu reads them from its query (ssl_cert_reqs as an ssl
    constant, ssl_ca_certs, ssl_certfile, ssl_keyfile), after verified_tls; None for any other URL."""
    if not url.startswith("rediss://"):
        return None
    from kombu.utils.url import parse_url  # here: most commands never need kombu's URL parser

    options: dict[str, Any] = parse_url(verified_tls(url)).get("ssl", {})
    return options
