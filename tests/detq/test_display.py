"""Control characters in names and reasons are shown as escapes, never sent to the terminal."""

from __future__ import annotations

from detq.display import visible


def test_control_characters_are_written_as_their_escapes() -> None:
    assert visible("\x1b]0;pwned\x07\x1b[2Jfifo.jpg") == "\\x1b]0;pwned\\x07\\x1b[2Jfifo.jpg"
    assert visible("a\nb\tc\rd\x7f\x9b") == "a\\nb\\tc\\rd\\x7f\\x9b"
    assert visible("café/日本語 ok.jpg") == "café/日本語 ok.jpg"  # printable text is left alone
