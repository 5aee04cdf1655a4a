"""The bundled demo detector follows the model contract the worker relies on (list in, list of dicts out)."""

from __future__ import annotations

import json
import random
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from demo.scoring import PredictedBox, precision_recall
from demo.shapes import CLASSES, render_scene
from tests.support import load_script

MODEL = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"


@pytest.fixture(scope="module")
def loaded() -> tuple[Any, dict[str, Any]]:
    assert MODEL.is_file(), f"missing bundled model {MODEL}; run scripts/train_demo_model.py"
    extra: dict[str, Any] = {"detq.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.* deprecation notices
        module = torch.jit.load(str(MODEL), map_location="cpu", _extra_files=extra)
    module.eval()
    return module, json.loads(extra["detq.json"])


def scene(seed: int, width: int, height: int) -> tuple[torch.Tensor, list[Any]]:
    image, boxes = render_scene(random.Random(seed), width, height)
    tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).to(torch.float32) / 255.0
    return tensor, boxes


def test_metadata(loaded: tuple[Any, dict[str, Any]]) -> None:
    _, meta = loaded
    assert meta["name"] == "detq-demo-shapes"
    assert meta["format"] == "torchvision"
    assert meta["classes"] == list(CLASSES)
    assert len(meta["input_size"]) == 2 and all(isinstance(v, int) and v > 0 for v in meta["input_size"])
    assert 0.0 < meta["score_threshold"] < 1.0
    assert meta["trained_with"] == "scripts/train_demo_model.py"
    assert isinstance(meta["seed"], int)
    assert MODEL.stat().st_size <= 5 * 1024 * 1024


def test_contract_on_two_differently_sized_images(loaded: tuple[Any, dict[str, Any]]) -> None:
    module, meta = loaded
    first, first_gt = scene(1, 320, 240)
    second, second_gt = scene(2, 450, 800)
    with torch.inference_mode():
        outputs = module([first, second])
    assert isinstance(outputs, list) and len(outputs) == 2
    gt: dict[str, list[Any]] = {"first": first_gt, "second": second_gt}
    pred: dict[str, list[PredictedBox]] = {}
    for name, image, output in zip(("first", "second"), (first, second), outputs, strict=True):
        assert set(output) == {"boxes", "labels", "scores"}
        boxes, labels, scores = output["boxes"], output["labels"], output["scores"]
        n = boxes.shape[0]
        assert boxes.dtype == torch.float32 and boxes.shape == (n, 4)
        assert labels.dtype == torch.int64 and labels.shape == (n,)
        assert scores.dtype == torch.float32 and scores.shape == (n,)
        height, width = image.shape[-2:]
        assert bool((boxes[:, 0] >= 0).all() and (boxes[:, 2] <= width).all())
        assert bool((boxes[:, 1] >= 0).all() and (boxes[:, 3] <= height).all())
        assert bool((boxes[:, 2] >= boxes[:, 0]).all() and (boxes[:, 3] >= boxes[:, 1]).all())
        assert bool(((labels >= 0) & (labels < len(CLASSES))).all())
        assert bool(((scores >= 0) & (scores <= 1)).all())
        assert torch.equal(scores, scores.sort(descending=True).values)
        pred[name] = [
            PredictedBox(int(label), float(score), *box)
            for box, label, score in zip(boxes.tolist(), labels.tolist(), scores.tolist(), strict=True)
        ]
    # Boxes come back in each input's own pixels: the easy scenes are mostly found at the model threshold.
    _, recall, *_ = precision_recall(gt, pred, score_threshold=meta["score_threshold"])
    assert recall >= 0.5


def test_empty_list_and_grayscale_input(loaded: tuple[Any, dict[str, Any]]) -> None:
    module, _ = loaded
    with torch.inference_mode():
        assert module([]) == []
        gray, _ = scene(3, 200, 150)
        (output,) = module([gray.mean(dim=0, keepdim=True)])
    assert output["boxes"].shape[1] == 4


def test_the_saved_code_carries_no_resize_function_body_of_the_torch_that_saved_it() -> None:
    # TorchScript saves the body of each Python function a module calls: F.interpolate's names every
    # resize mode of its release (torch 2.14's a lanczos operator), and torch 2.11 refused the file
    # saved with it ("Unknown builtin op: aten::_upsample_lanczos2d_aa").
    with zipfile.ZipFile(MODEL) as archive:
        code = {name: archive.read(name) for name in archive.namelist() if name.endswith(".py")}
    assert code, "a TorchScript archive holds its code as .py files"
    assert not [name for name, text in code.items() if b"interpolate" in text or b"lanczos" in text]


def test_rescripting_the_trained_weights_keeps_every_output(
    loaded: tuple[Any, dict[str, Any]], tmp_path: Path
) -> None:
    module, meta = loaded
    # Given the bundled file saved again by the training script's --rescript (its weights, this code)
    training = load_script("train_demo_model")
    out = tmp_path / "again.pt"
    training.rescript(MODEL, out)
    extra: dict[str, Any] = {"detq.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        again = torch.jit.load(str(out), map_location="cpu", _extra_files=extra)
    # Then it has the same metadata and gives the same boxes, labels and scores, bit for bit
    assert json.loads(extra["detq.json"]) == meta
    images = [
        scene(seed, width, height)[0] for seed, width, height in ((4, 320, 240), (5, 97, 131), (6, 800, 450))
    ]
    with torch.inference_mode():
        for ours, theirs in zip(module(images), again(images), strict=True):
            assert ours["boxes"].shape[0] > 0
            assert all(torch.equal(ours[key], theirs[key]) for key in ("boxes", "labels", "scores"))
