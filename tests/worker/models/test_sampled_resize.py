"""A fixed-size torchvision detector's input made ahead from the pixels its resize reads: the same floats
as its own transform, the same detections, and a model whose transform does otherwise is left as it was."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

from tests.support import save_torchvision_detector
from tests.worker.models.photo_support import unprobed_photos
from worker.models.loading import load_model_for_device
from worker.models.sampled_resize import (
    NEUTRAL_MEAN,
    SCRATCH,
    SampledResize,
    plan_for,
    read_indices,
    take_over,
)
from worker.models.tensors import to_tensor
from worker.pipeline import input_pixels, run_model

IMAGENET = SampledResize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), height=320, width=320)


@pytest.fixture(params=[1, 2], ids=["one thread", "two threads"])
def torch_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """torch's intra-op threads: with one, torch resizes three channels with its channels_last kernel; with
    more, with its generic one (the two differ in the last bit)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _own_transform(plan: SampledResize, pixels: np.ndarray) -> torch.Tensor:
    """What the model's GeneralizedRCNNTransform makes of the whole image: float copy, normalise, resize."""
    whole = to_tensor(pixels)
    mean = torch.tensor(plan.mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(plan.std, dtype=torch.float32)[:, None, None]
    resized = F.interpolate(
        ((whole - mean) / std)[None], size=[plan.height, plan.width], mode="bilinear", align_corners=False
    )
    return resized[0]


@pytest.mark.parametrize(
    ("height", "width", "out_h", "out_w"),
    [
        (3000, 4000, 320, 320),  # a 12 MP photo
        (960, 1280, 320, 320),  # ratios 3 and 4: every source point on a pixel centre
        (1001, 777, 320, 320),
        (4032, 3024, 300, 300),
        (17, 2000, 320, 320),  # one side upscaled, the other far down
        (199, 251, 320, 320),  # upscaled: every pixel read
        (641, 639, 512, 384),
    ],
)
def test_the_input_made_ahead_is_the_models_own_bit_for_bit(
    torch_threads: int, height: int, width: int, out_h: int, out_w: int
) -> None:
    # Given random pixels, and the unread pixels of the buffer NaN (a read of one would show in the output)
    plan = SampledResize(mean=IMAGENET.mean, std=IMAGENET.std, height=out_h, width=out_w)
    pixels = np.random.default_rng(height * width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    # When the input is made ahead
    made, back = plan.input_of(pixels, fill=float("nan"))
    # Then it is what the model's own transform makes of the whole image, every float the same
    assert made.shape == (3, out_h, out_w) and made.is_contiguous()
    assert torch.equal(made, _own_transform(plan, pixels))
    # And boxes go back by the float32 ratios of the sizes, as torchvision's resize_boxes scales them
    boxes = torch.tensor([[10.0, 20.0, 30.5, 40.25]])
    ratio_x = torch.tensor(width, dtype=torch.float32) / torch.tensor(out_w, dtype=torch.float32)
    ratio_y = torch.tensor(height, dtype=torch.float32) / torch.tensor(out_h, dtype=torch.float32)
    expected = torch.stack(
        (boxes[:, 0] * ratio_x, boxes[:, 1] * ratio_y, boxes[:, 2] * ratio_x, boxes[:, 3] * ratio_y), 1
    )
    assert torch.equal(back.to_source(boxes), expected)


def test_a_kept_buffer_gives_each_photo_its_own_input() -> None:
    # Given two photos of one size, each made twice: on this thread, then on another (each thread keeps
    # its buffer of the last size, the rows of the photo before still in it)
    rng = np.random.default_rng(9)
    photos = [rng.integers(0, 256, (900, 1300, 3), dtype=np.uint8) for _ in range(2)]
    made = [IMAGENET.input_of(photo)[0] for photo in photos]
    with ThreadPoolExecutor(1) as pool:
        made += [made_input for made_input, _ in pool.map(IMAGENET.input_of, photos)]
    # Then each is its own photo's input, as the model's transform makes it
    for got, photo in zip(made, photos * 2, strict=True):
        assert torch.equal(got, _own_transform(IMAGENET, photo))
    SCRATCH.release()


def test_only_the_rows_a_downscale_reads_are_gathered() -> None:
    # A third of 960 rows to 320, a pair on each side of every source point (3d + 1 exactly): 640 of 960
    assert read_indices(960, 320).tolist() == sorted({3 * d + k for d in range(320) for k in (1, 2)})
    # A 12 MP side: at most two a output (a third where float32 rounding could go either way)
    assert len(read_indices(4000, 320)) <= 3 * 320
    # Upscaled: every row, none outside the image
    assert read_indices(200, 320).tolist() == list(range(200))


@pytest.mark.slow
def test_ssdlite_finds_the_same_boxes_with_its_input_made_ahead(tmp_path: Path) -> None:
    # Given a scripted SSDlite whose detections follow its input (calibrated: as built, every score is
    # 1/91), loaded as saved and by default (channels_last off in both: this alone)
    path = save_torchvision_detector(tmp_path / "ssdlite.pt", "ssdlite", calibrated=True)
    as_saved = load_model_for_device(path, "cpu", micro_batch=3, channels_last=False, sampled_resize=False)
    ahead = load_model_for_device(path, "cpu", micro_batch=3, channels_last=False)
    # Then the default took the resize over, checked on its probes, and the model normalises no more
    assert any(n.startswith("sampled resize: ssdlite.pt's input") for n in ahead.notes), ahead.notes
    assert as_saved.adapter.resize is None and ahead.adapter.resize is not None  # type: ignore[attr-defined]
    assert ahead.module.transform.image_mean == NEUTRAL_MEAN
    # And on photos that are not the probes, its detections are the same
    photos = unprobed_photos(tmp_path)
    inputs = [ahead.adapter.shrink(p) for p in photos]
    assert [input_pixels(i) for i in inputs] == [320 * 320] * len(photos)
    expected = [o.detections for o in run_model(as_saved, [as_saved.adapter.shrink(p) for p in photos], 3)]
    got = [o.detections for o in run_model(ahead, inputs, 3)]
    assert all(d is not None and len(d.boxes) for d in expected)
    for want, have in zip(expected, got, strict=True):
        assert want is not None and have is not None
        assert torch.equal(want.boxes, have.boxes)
        assert torch.equal(want.labels, have.labels) and torch.equal(want.scores, have.scores)


class GeneralizedRCNNTransform(torch.nn.Module):
    """Named as torchvision's, with its attributes, but resizing with antialiasing (or, `broken`, unable
    to resize at all)."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.fixed_size = (32, 24)
        self.image_mean = [0.5, 0.5, 0.5]
        self.image_std = [0.25, 0.25, 0.25]
        self.broken = broken

    def normalize(self, image: torch.Tensor) -> torch.Tensor:
        mean = torch.as_tensor(self.image_mean, dtype=image.dtype)
        std = torch.as_tensor(self.image_std, dtype=image.dtype)
        return (image - mean[:, None, None]) / std[:, None, None]

    def resize(
        self, image: torch.Tensor, target: dict[str, torch.Tensor] | None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        if self.broken:
            raise RuntimeError("cannot resize")
        size = [self.fixed_size[1], self.fixed_size[0]]
        out = F.interpolate(image[None], size=size, mode="bilinear", align_corners=False, antialias=True)
        return out[0], target

    def forward(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        return [self.resize(self.normalize(image), None)[0] for image in images]


class _Detector(torch.nn.Module):
    """One box an image, placed by the mean of its input: any change of the input moves it."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.transform = GeneralizedRCNNTransform(broken)

    def forward(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        found: list[dict[str, torch.Tensor]] = []
        for image in self.transform(images):
            corner = image.mean() * 10
            box = torch.stack([corner, corner, corner + 5, corner + 5])[None]
            found.append(
                {"boxes": box, "labels": torch.ones(1, dtype=torch.int64), "scores": image.std()[None]}
            )
        return found


@pytest.mark.parametrize(
    ("broken", "note"),
    [
        (False, "sampled resize: would change the model's input, left to the model"),
        (True, "sampled resize: fails here (Error), left to the model"),
    ],
)
def test_a_transform_that_resizes_otherwise_is_left_to_the_model(broken: bool, note: str) -> None:
    # Given a scripted model whose transform looks like torchvision's but does not resize as it does
    module = torch.jit.script(_Detector(broken)).eval()
    assert plan_for(module) is not None
    # When the resize is offered to be taken over
    plan, said = take_over(module, "fake.pt")
    # Then it is not, the note says why, and the model normalises as it did
    assert plan is None and said == note
    assert module.transform.image_mean == [0.5, 0.5, 0.5] and module.transform.image_std == [0.25] * 3


@pytest.mark.parametrize(
    ("fixed_size", "name", "planned"),
    [
        ((320, 240), "GeneralizedRCNNTransform", (240, 320)),  # fixed_size is (width, height)
        (None, "GeneralizedRCNNTransform", None),  # Faster R-CNN's: it keeps the aspect ratio
        ((320, 240), "MyTransform", None),
    ],
)
def test_only_a_fixed_size_torchvision_transform_is_taken_over(
    fixed_size: tuple[int, int] | None, name: str, planned: tuple[int, int] | None
) -> None:
    transform = SimpleNamespace(
        original_name=name, fixed_size=fixed_size, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]
    )
    plan = plan_for(SimpleNamespace(transform=transform))
    assert (None if plan is None else (plan.height, plan.width)) == planned
    if planned is None:
        assert take_over(SimpleNamespace(transform=transform), "other.pt") == (None, "")
