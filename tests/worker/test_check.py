"""`detq model check`'s comparison in-process: the plain way against a worker's, image by image."""

from __future__ import annotations

from pathlib import Path

from detq.settings import Settings
from tests.support import save_fixed_box_model
from worker.check import check_model, made_up_photos, sample_of


def test_a_model_detq_runs_exactly_agrees_on_every_image(tmp_path: Path) -> None:
    model = save_fixed_box_model(tmp_path / "box.pt")
    with made_up_photos(4) as photos:
        report = check_model(model, photos, Settings(_env_file=None, data_dir=tmp_path / "data"))
    assert report.agrees and [i.agreement.matched for i in report.images if i.agreement] == [1, 1, 1, 1]
    assert report.trades == [] and report.forwards.startswith("forwards: ")
    assert report.as_dict()["recall"] == 1.0


def test_an_image_detq_cannot_read_is_said_and_fails_the_check(tmp_path: Path) -> None:
    model = save_fixed_box_model(tmp_path / "box.pt")
    broken = tmp_path / "broken.jpg"
    broken.write_text("not an image")
    report = check_model(model, [broken], Settings(_env_file=None, data_dir=tmp_path / "data"))
    assert not report.agrees and report.images[0].error is not None


def test_a_sample_spreads_over_the_folder() -> None:
    paths = [Path(f"{i}.jpg") for i in range(10)]
    assert sample_of(paths, 4) == [Path("0.jpg"), Path("2.jpg"), Path("5.jpg"), Path("7.jpg")]
    assert sample_of(paths[:3], 4) == paths[:3]
