"""Why a broker cannot be reached, in one line; a refused TLS certificate told from a broker that is down."""

from __future__ import annotations

import ssl

from kombu.exceptions import OperationalError

from dispatch.send import broker_error_reason, is_certificate_refusal


def _wrapped(cause: BaseException, text: str) -> OperationalError:
    """As kombu raises it: its OperationalError from redis-py's ConnectionError from the cause."""
    try:
        try:
            raise cause
        except BaseException as inner:
            raise ConnectionError(text) from inner
    except ConnectionError as middle:
        try:
            raise OperationalError(text) from middle
        except OperationalError as outer:
            return outer


def test_a_refused_certificate_is_found_under_the_wrappers_and_named_with_its_fix() -> None:
    error = _wrapped(ssl.SSLCertVerificationError("certificate verify failed"), "Error 1 connecting.\nmore")
    assert is_certificate_refusal(error)
    assert broker_error_reason(error) == (
        "Error 1 connecting (a server certificate from a private CA: name the CA with"
        " ssl_ca_certs=/path/ca.pem in DETQ_BROKER_URL)"
    )


def test_a_broker_that_is_down_is_not_a_certificate_refusal() -> None:
    error = _wrapped(
        ConnectionRefusedError(111, "Connection refused"), "Error 111 connecting to 127.0.0.1:1."
    )
    assert not is_certificate_refusal(error)
    assert broker_error_reason(error) == "Error 111 connecting to 127.0.0.1:1"
