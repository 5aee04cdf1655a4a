"""`detq demo`: the end-to-end demo behind `make demo`."""

from __future__ import annotations

from pathlib import Path

import click

from cli.base import DetqCommand, examples, load_settings


@click.command(
    cls=DetqCommand, epilog=examples("detq demo", "detq demo --images 40 --workers 1", "detq demo --json")
)
@click.option(
    "--images", type=click.IntRange(1, 100_000), default=120, show_default=True, help="Images to generate."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("demo-output"),
    show_default=True,
    help="Folder for the images, the annotated copies, the COCO JSON and summary.json.",
)
@click.option("--workers", type=click.IntRange(min=1), help="CPU worker processes (default: cores).")
@click.option("--seed", type=int, default=2026, show_default=True, help="Seed of the generated images.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the summary as one JSON object (the rest on stderr)."
)
def demo(images: int, out: Path, workers: int | None, seed: int, as_json: bool) -> None:
    """Run the demo end to end on CPU workers.

    Generates shape images with ground truth, runs workers over them, and prints a summary with
    precision and recall.
    """
    from demo.run import run_demo

    raise SystemExit(
        run_demo(load_settings(), images=images, out_dir=out, workers=workers, seed=seed, as_json=as_json)
    )
