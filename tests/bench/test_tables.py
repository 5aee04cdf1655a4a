"""The benchmark's table: best-against-best ratios and the ceiling's ratio round by round."""

from __future__ import annotations

import json
from pathlib import Path

from bench.tables import (
    AFTER_CLAIM,
    CEILING,
    FAST_ALONE,
    MIXED,
    NAIVE,
    START_UPS,
    mixed_table,
    round_by_round,
    start_up_table,
    table,
    write,
)


def test_round_by_round_pairs_each_run_with_the_ceilings_run_of_the_same_round() -> None:
    # Given a machine that slowed down in round two for both runners
    detq, ceiling = [9.0, 4.5, 8.0], [10.0, 5.0, 10.0]
    # Then each round's ratio compares like with like: 0.9, 0.9 and 0.8
    assert round_by_round(detq, ceiling) == "0.90x (0.80-0.90)"
    assert round_by_round(detq, None) == "-"
    assert round_by_round(detq, [0.0, 0.0, 0.0]) == "-"


def test_table_shows_best_against_best_and_round_by_round() -> None:
    rows = table({"m 1280x960": {NAIVE: [5.0, 4.0], CEILING: [10.0, 5.0], "detq embedded": [9.0, 6.0]}})
    lines = rows.splitlines()
    assert lines[0].endswith("| vs ceiling, round by round |")
    # best 9.0 against the ceiling's best 10.0; round by round 0.9 and 1.2
    expected = "| m 1280x960 | detq embedded | 9.0, 6.0 | 9.0 | 1.80x | 0.90x | - | 1.05x (0.90-1.20) |"
    assert lines[-1] == expected
    assert lines[-2].endswith("| 1.00x (1.00-1.00) |")


def test_a_run_of_extras_alone_writes_its_json_and_table_without_a_chart(tmp_path: Path) -> None:
    # Given a run with no photos (--images 0 --large-images 0): only the extras, such as the overhead
    summary = {"images_per_s": {}, "framework_ms_per_batch": {"embedded": 17.5}}
    write(tmp_path, summary)
    assert json.loads((tmp_path / "bench.json").read_text())["framework_ms_per_batch"] == {"embedded": 17.5}
    assert (tmp_path / "bench.md").exists()
    assert not (tmp_path / "bench.png").exists()  # no workload, no chart (matplotlib refused zero columns)


def test_the_start_up_table_splits_each_detq_run_at_its_first_claim() -> None:
    # Given two rounds in which detq took 0.5 s to its first claim, then ran at 9 and 4 images/s
    summary = {
        "images_per_s": {"m 12MP": {CEILING: [10.0, 5.0], "detq embedded": [8.0, 3.5]}},
        START_UPS: {"m 12MP": {"detq embedded": [0.5, 0.62]}},
        AFTER_CLAIM: {"m 12MP": {"detq embedded": [9.0, 4.0]}},
    }
    lines = start_up_table(summary).splitlines()
    # Then the pace after the claim is set against the ceiling's run of the same round: 0.9 and 0.8
    assert lines[-1] == "| m 12MP | detq embedded | 0.50, 0.62 | 9.0, 4.0 | 0.85x (0.80-0.90) |"
    assert start_up_table({"images_per_s": {}}) == ""  # no detq runner, no table


def test_bench_md_holds_the_start_up_table_after_the_main_one(tmp_path: Path) -> None:
    summary = {
        "images_per_s": {"m 1280x960": {"detq embedded": [8.0]}},
        START_UPS: {"m 1280x960": {"detq embedded": [0.55]}},
        AFTER_CLAIM: {"m 1280x960": {"detq embedded": [8.6]}},
    }
    write(tmp_path, summary)
    text = (tmp_path / "bench.md").read_text()
    assert text.index("| vs ceiling, round by round |") < text.index("| m 1280x960 | detq embedded | 0.55 |")


def test_the_mixed_table_holds_each_configuration_to_the_fast_worker_of_its_round() -> None:
    # Given three rounds in which the machine slowed down in round two for every configuration
    summary = {
        "images_per_s": {},
        MIXED: {FAST_ALONE: [18.0, 12.0, 17.0], "fast + slow, backups": [18.9, 11.4, 17.0]},
    }
    lines = mixed_table(summary).splitlines()
    # Then each run is set against the fast worker's run of the same round: 1.05, 0.95 and 1.00
    assert lines[-2] == "| fast alone | 18.0, 12.0, 17.0 | 1.00x |"
    assert lines[-1] == "| fast + slow, backups | 18.9, 11.4, 17.0 | 1.00x (0.95-1.05) |"
    assert mixed_table({"images_per_s": {}}) == ""  # the extra skipped, no table


def test_bench_md_holds_the_mixed_table_when_the_extra_ran(tmp_path: Path) -> None:
    summary = {"images_per_s": {"m 1280x960": {"detq embedded": [8.0]}}, MIXED: {FAST_ALONE: [14.5]}}
    write(tmp_path, summary)
    text = (tmp_path / "bench.md").read_text()
    assert text.index("| vs ceiling, round by round |") < text.index("| fast alone | 14.5 | 1.00x |")
