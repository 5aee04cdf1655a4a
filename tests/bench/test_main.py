"""`python -m bench`: which runners `--only` picks, and the order a round runs them in."""

from __future__ import annotations

from bench.__main__ import in_round_order, selected

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


def test_odd_rounds_run_a_workloads_runners_in_reverse_order() -> None:
    def run() -> float:
        return 1.0

    named = {name: run for name in NAMES[:3]}
    assert [n for n, _ in in_round_order(named, 0)] == NAMES[:3]
    assert [n for n, _ in in_round_order(named, 1)] == NAMES[2::-1]
    assert [n for n, _ in in_round_order(named, 2)] == NAMES[:3]
