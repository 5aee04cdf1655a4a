"""DETQ_CPU_OPTIMIZE freezes a TorchScript model for CPU inference, with outputs equal to the model's own, and
keeps the frozen graph only where it runs faster."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from detq.settings import BUNDLED_MODEL
from tests.support import save_exported_boxes, ultralytics_config
from worker.models.inspect import inspect_model
from worker.models.loading import load_model_for_device
from worker.models.optimize import TIMED_CALLS, WARM_CALLS, faster_of, optimized_for_cpu


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
    # When it is frozen and optimised
    frozen, note = optimized_for_cpu(plain.module, path.name)
    # Then its weights are folded in, and its output equals the model's own to float rounding
    assert note == "DETQ_CPU_OPTIMIZE: frozen and optimised"
    assert list(plain.module.parameters()) and not list(frozen.parameters()), "weights folded in"
    x = torch.rand(2, 3, 64, 64)
    with torch.inference_mode():
        assert torch.allclose(frozen(x), plain.module(x), atol=1e-5)


def test_a_model_loaded_with_cpu_optimize_runs_whichever_graph_was_faster(tmp_path: Path) -> None:
    # Given the same model loaded plainly and with DETQ_CPU_OPTIMIZE
    path = _save_tiny_yolo(tmp_path / "tiny.torchscript")
    plain = load_model_for_device(path, "cpu")
    loaded = load_model_for_device(path, "cpu", cpu_optimize=True)
    # Then the notes say which graph it kept and why, and its outputs and contract are the model's own
    (verdict,) = [n for n in loaded.notes if "a forward as it was" in n]
    kept = "kept the optimised graph" in verdict
    assert kept or "no faster here, left as it was" in verdict
    assert bool(list(loaded.module.parameters())) is not kept, "the frozen graph has no parameters left"
    x = torch.rand(2, 3, 64, 64)
    with torch.inference_mode():
        assert torch.allclose(loaded.module(x), plain.module(x), atol=1e-5)
    assert (loaded.meta.format, loaded.max_batch) == (plain.meta.format, plain.max_batch)


class _Clock:
    """A clock that each stand-in forward advances by its module's cost."""

    def __init__(self, costs: dict[str, float]) -> None:
        self.now = 0.0
        self.costs = costs
        self.calls: list[str] = []

    def run(self, module: str) -> None:
        self.calls.append(module)
        self.now += self.costs[module]

    def __call__(self) -> float:
        return self.now


def test_the_optimised_graph_is_kept_only_when_it_is_faster() -> None:
    # Given an optimised graph at half the cost, and one at 98% of it
    fast = _Clock({"original": 0.2, "optimized": 0.1})
    slow = _Clock({"original": 0.2, "optimized": 0.196})
    # When each is timed against the original
    kept, note = faster_of("original", "optimized", fast.run, "m.pt", clock=fast)
    left, why = faster_of("original", "optimized", slow.run, "m.pt", clock=slow)
    # Then only the clearly faster one is kept, each note with both times
    assert (kept, note) == (
        "optimized",
        "DETQ_CPU_OPTIMIZE: kept the optimised graph (200 ms a forward as it was, 100 ms optimised)",
    )
    assert left == "original" and why.startswith("DETQ_CPU_OPTIMIZE: no faster here, left as it was (200 ms")
    # And both were warmed up before timing, in alternation
    assert fast.calls == ["original", "optimized"] * (WARM_CALLS + TIMED_CALLS)


def test_a_module_that_could_not_be_optimised_is_not_timed() -> None:
    clock = _Clock({"original": 0.2})
    assert faster_of("original", "original", clock.run, "m.pt", clock=clock) == ("original", "")
    assert clock.calls == []


def test_a_torch_export_program_is_left_as_it_is(tmp_path: Path) -> None:
    path = save_exported_boxes(tmp_path / "boxes.pt2")
    loaded = load_model_for_device(path, "cpu", cpu_optimize=True)
    assert "DETQ_CPU_OPTIMIZE: not TorchScript, left as it is" in loaded.notes


def test_models_are_not_frozen_unless_asked(tmp_path: Path) -> None:
    loaded = load_model_for_device(_save_tiny_yolo(tmp_path / "tiny.torchscript"), "cpu")
    assert not any("DETQ_CPU_OPTIMIZE" in note for note in loaded.notes)
    assert list(loaded.module.parameters()), "its weights are still parameters, not folded into the graph"


def test_inspect_with_cpu_optimize_reports_which_graph_it_kept_and_why() -> None:
    report = inspect_model(BUNDLED_MODEL, cpu_optimize=True)
    assert report["loads_here"] is True
    assert any(note.startswith("DETQ_CPU_OPTIMIZE: ") for note in report["notes"]), report["notes"]
    assert not any("DETQ_CPU_OPTIMIZE" in note for note in inspect_model(BUNDLED_MODEL)["notes"])
