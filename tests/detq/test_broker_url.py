"""A rediss:// broker URL checks the server's certificate unless it says otherwise."""

from __future__ import annotations

import ssl

import pytest

from detq.broker_url import tls_options, verified_tls
from detq.settings import Settings


@pytest.mark.parametrize(
    ("given", "resolved"),
    [
        ("rediss://cache:6380/0", "rediss://cache:6380/0?ssl_cert_reqs=required"),
        (
            "rediss://:pw@cache/0?ssl_ca_certs=/ca.pem",
            "rediss://:pw@cache/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required",
        ),
        ("rediss://cache/0?ssl_cert_reqs=none", "rediss://cache/0?ssl_cert_reqs=none"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
    ],
)
def test_a_rediss_broker_url_verifies_the_server_certificate_unless_it_says_otherwise(
    given: str, resolved: str
) -> None:
    # kombu, given a bare rediss:// URL, would connect without checking the certificate
    assert verified_tls(given) == resolved
    assert Settings(_env_file=None, broker_url=given).resolved_broker_url == resolved


@pytest.mark.parametrize(
    ("given", "options"),
    [
        ("rediss://cache:6380/0", {"ssl_cert_reqs": ssl.CERT_REQUIRED}),
        (
            "rediss://:pw@cache/0?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
            {
                "ssl_ca_certs": "/ca.pem",
                "ssl_certfile": "/c.pem",
                "ssl_keyfile": "/k.pem",
                "ssl_cert_reqs": ssl.CERT_REQUIRED,
            },
        ),
        ("rediss://cache/0?ssl_cert_reqs=none", {"ssl_cert_reqs": ssl.CERT_NONE}),
        ("redis://cache:6379/0", None),
    ],
)
def test_tls_options_are_a_rediss_urls_ssl_parameters_as_kombu_reads_them(
    given: str, options: dict[str, object] | None
) -> None:
    assert tls_options(given) == options
