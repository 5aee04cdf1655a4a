"""`python -m bench --only`: which runners a list of name parts picks."""

from __future__ import annotations

from bench.__main__ import selected

NAMES = [
    "naive loop",
    "in-process ceiling",
    "detq embedded",
    "detq Redis + PostgreSQL",
    "detq Redis + PostgreSQL, fast decode",
    "detq Redis + PostgreSQL, opt-ins",
]


def picked(*parts: str) -> list[str]:
    return [name for name in NAMES if selected(name, list(parts), NAMES)]


def test_a_whole_name_picks_that_runner_alone_and_a_part_every_runner_it_is_in() -> None:
    assert picked("detq Redis + PostgreSQL") == ["detq Redis + PostgreSQL"]
    assert picked("opt") == ["detq Redis + PostgreSQL, opt-ins"]
    assert picked("ceiling", "detq embedded") == ["in-process ceiling", "detq embedded"]
    assert picked("detq") == NAMES[2:]
    assert picked() == NAMES
