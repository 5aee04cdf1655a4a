"""DETQ_CPU_OPTIMIZE freezes a TorchScript model for CPU inference, with outputs equal to the model's own."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from tests.support import save_exported_boxes, ultralytics_config
from worker.models.loading import load_model_for_device


class _TinyYolo(torch.nn.Module):
    """Conv, batch norm and SiLU to a [B, 4 + 2, N] YOLOv8 layout: what freezing folds and fuses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=4, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Conv2d(8, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(torch.nn.functional.silu(self.bn(self.conv(x))))
        boxes = y[:, :4].flatten(2).sigmoid() * 64
        scores = y[:, 4:].flatten(2).sigmoid()
        return torch.cat((boxes, scores), dim=1)


def _save_tiny_yolo(path: Path) -> Path:
    torch.manual_seed(0)
    model = _TinyYolo().eval()
    torch.nn.init.normal_(model.bn.running_mean)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
        torch.jit.save(scripted, str(path), _extra_files={"config.txt": ultralytics_config([64, 64])})
    return path


def test_a_frozen_model_gives_the_same_outputs(tmp_path: Path) -> None:
    # Given a TorchScript model with a convolution and batch norm to fold
    path = _save_tiny_yolo(tmp_path / "tiny.torchscript")
    plain = load_model_for_device(path, "cpu")
    # When it is loaded with DETQ_CPU_OPTIMIZE
    frozen = load_model_for_device(path, "cpu", cpu_optimize=True)
    # Then it is frozen, and its output equals the model's own to float rounding
    assert "DETQ_CPU_OPTIMIZE: frozen and optimised" in frozen.notes
    assert list(plain.module.parameters()) and not list(frozen.module.parameters()), "weights folded in"
    x = torch.rand(2, 3, 64, 64)
    with torch.inference_mode():
        assert torch.allclose(frozen.module(x), plain.module(x), atol=1e-5)
    assert (frozen.meta.format, frozen.max_batch) == (plain.meta.format, plain.max_batch)


def test_a_torch_export_program_is_left_as_it_is(tmp_path: Path) -> None:
    path = save_exported_boxes(tmp_path / "boxes.pt2")
    loaded = load_model_for_device(path, "cpu", cpu_optimize=True)
    assert "DETQ_CPU_OPTIMIZE: not TorchScript, left as it is" in loaded.notes


def test_models_are_not_frozen_unless_asked(tmp_path: Path) -> None:
    loaded = load_model_for_device(_save_tiny_yolo(tmp_path / "tiny.torchscript"), "cpu")
    assert not any("DETQ_CPU_OPTIMIZE" in note for note in loaded.notes)
    assert list(loaded.module.parameters()), "its weights are still parameters, not folded into the graph"
