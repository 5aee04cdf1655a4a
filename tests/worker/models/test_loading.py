"""map_location: a GPU-saved TorchScript file loads on this CPU host; broken models fail early."""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from tests.support import retag_archive_device, save_fixed_box_model, save_scripted
from worker.models.loading import ModelLoadError, load_model_for_device

CUDA_LOAD_ERROR = re.compile(r"CUDA|NVIDIA|cuda", re.IGNORECASE)


def test_cuda_tagged_archive_fails_plain_load_and_loads_with_map_location(tmp_path: Path) -> None:
    # Given a model file whose tensors are tagged cuda:0, as torch.jit.save writes them on a GPU host
    cpu_file = save_fixed_box_model(tmp_path / "cpu.pt", classes=("bg", "thing"))
    cuda_file = tmp_path / "cuda.pt"
    assert retag_archive_device(cpu_file, cuda_file) >= 1
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU: the seed failure only happens on CPU-only hosts")
    # When it is loaded the naive way on this CPU-only host, it fails as reported
    with pytest.raises(Exception, match=CUDA_LOAD_ERROR), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.load(str(cuda_file))
    # Then the worker's loader remaps it to the CPU and it answers like the CPU-saved file
    from_cuda = load_model_for_device(cuda_file, "cpu")
    from_cpu = load_model_for_device(cpu_file, "cpu")
    image = [torch.rand(3, 60, 80)]
    with torch.inference_mode():
        a, b = from_cuda.module(image)[0], from_cpu.module(image)[0]
    assert torch.equal(a["boxes"], b["boxes"])
    assert a["boxes"].tolist() == [[20.0, 15.0, 60.0, 45.0]]
    assert from_cuda.meta.classes == ("bg", "thing")
    assert from_cuda.device == torch.device("cpu")
    assert from_cuda.sha256 != from_cpu.sha256


def test_not_a_model_fails_with_a_clear_message(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip")
    with pytest.raises(
        ModelLoadError, match="junk.pt is a file of no kind detq knows, not a model file detq runs"
    ):
        load_model_for_device(junk, "cpu")


def test_an_operator_this_torch_lacks_is_named_in_one_line_with_what_to_do(tmp_path: Path) -> None:
    # Given a scripted model whose saved code calls an operator this torch does not have, as a model
    # scripted with a newer torch does on an older worker
    saved = save_fixed_box_model(tmp_path / "fixed.pt")
    newer = tmp_path / "newer.pt"
    with zipfile.ZipFile(saved) as zin, zipfile.ZipFile(newer, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".py"):
                data = data.replace(b"torch.unsqueeze(", b"torch._detq_operator_of_a_later_torch(")
            zout.writestr(info, data)
    # When it is loaded
    with pytest.raises(ModelLoadError) as raised:
        load_model_for_device(newer, "cpu")
    # Then the reason is one line: the operator, this torch's version and the way out
    reason = str(raised.value)
    assert "\n" not in reason
    assert "Unknown builtin op: aten::_detq_operator_of_a_later_torch" in reason
    assert f"this worker runs torch {torch.__version__}" in reason and "docs/models.md" in reason
    # And TorchScript's own text, with its excerpt of the saved code, stays on the error's cause
    assert "_detq_operator_of_a_later_torch" in str(raised.value.__cause__).split("\n", 1)[1]


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_model_for_device(tmp_path / "nope.pt", "cpu")


def test_model_breaking_the_output_contract_fails_warm_up(tmp_path: Path) -> None:
    class Wrong(torch.nn.Module):
        def forward(self, images: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack([i.mean() for i in images])

    path = save_scripted(Wrong(), tmp_path / "wrong.pt", {"detq.json": '{"format": "torchvision"}'})
    with pytest.raises(ModelLoadError, match="breaks the torchvision contract"):
        load_model_for_device(path, "cpu")


class _AtMostFour(torch.nn.Module):
    """The torchvision contract, one empty result per image, for batches of at most four images."""

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        if len(images) > 4:
            raise RuntimeError(f"a batch of {len(images)} images; this model takes at most 4")
        return [
            {
                "boxes": torch.zeros(0, 4),
                "labels": torch.zeros(0, dtype=torch.int64),
                "scores": torch.zeros(0),
            }
            for _ in images
        ]


def test_warm_up_runs_at_the_micro_batch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given a model that fails on batches of more than four images
    path = save_scripted(_AtMostFour(), tmp_path / "four.pt", {"detq.json": '{"format": "torchvision"}'})
    # When it is loaded for micro-batches of four, then of eight
    fits = load_model_for_device(path, "cpu", micro_batch=4)
    too_many = load_model_for_device(path, "cpu", micro_batch=8)
    # Then the warm-up ran at the micro-batch: four pass untouched, eight are found out at load (not on every
    # batch later) and its forwards run one image at a time, with a warning saying why
    assert fits.max_batch is None
    assert too_many.max_batch == 1
    assert "a warm-up batch of 8 failed" in caplog.text
    assert "at most 4" in caplog.text
