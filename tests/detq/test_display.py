"""Control characters in names and reasons are shown as escapes, never sent to the terminal."""

from __future__ import annotations

from detq.display import visible


def test_control_characters_are_written_as_their_escapes() -> None:
    assert visible("\x1b]0;pwned\x07\x1b[2Jfifo.jpg") == "\\x1b]0;pwned\\x07\\x1b[2Jfifo.jpg"
    assert visible("a\nb\tc\rd\x7f\x9b") == "a\\nb\\tc\\rd\\x7f\\x9b"
    assert visible("café/日本語 ok.jpg") == "café/日本語 ok.jpg"  # printable text is left alone


def test_a_log_handler_given_the_filter_writes_names_escaped() -> None:
    import io
    import logging

    from detq.display import escape_handlers

    stream = io.StringIO()
    logger = logging.getLogger("detq-test-display")
    logger.addHandler(logging.StreamHandler(stream))
    logger.propagate = False
    escape_handlers(logger)
    escape_handlers(logger)  # once only
    logger.warning("cannot read %s", "/in/\x1b[2Jx.jpg")
    logger.warning("plain %s", "/in/x.jpg")
    assert stream.getvalue() == "cannot read /in/\\x1b[2Jx.jpg\nplain /in/x.jpg\n"
    assert len(logger.handlers[0].filters) == 1
