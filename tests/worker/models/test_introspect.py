"""A torchvision detector's input size is read from its own transform when its metadata has none."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import save_torchvision_detector
from worker.models.introspect import torchvision_input_size
from worker.models.loading import load_model_for_device


@pytest.mark.parametrize(
    ("transform", "size"),
    [
        (
            SimpleNamespace(fixed_size=(320, 240), min_size=(800,)),
            (240, 320),
        ),  # fixed_size is (width, height)
        (SimpleNamespace(fixed_size=None, min_size=(640, 800)), (640, 640)),
        (SimpleNamespace(fixed_size=None, min_size=512), (512, 512)),
        (SimpleNamespace(fixed_size=None, min_size=()), None),
    ],
)
def test_the_size_the_transform_resizes_toward(
    transform: SimpleNamespace, size: tuple[int, int] | None
) -> None:
    assert torchvision_input_size(SimpleNamespace(transform=transform)) == size


def test_a_model_without_a_transform_has_no_size() -> None:
    assert torchvision_input_size(object()) is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:SSD always returns")
def test_a_scripted_ssdlite_reports_320(tmp_path: Path) -> None:
    loaded = load_model_for_device(save_torchvision_detector(tmp_path / "ssdlite.pt", "ssdlite"), "cpu")
    assert loaded.meta.input_size == (320, 320)
    assert loaded.decode_target == (320, 320)
    assert "input size 320x320 read from the model's transform" in loaded.notes
