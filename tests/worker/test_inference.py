"""Forwards on a CPU: at most DETQ_MICRO_BATCH images and DETQ_CPU_FORWARD_PIXELS of input each."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from tests.support import CountsForwards, save_fixed_box_model
from worker.models.formats import ModelInput
from worker.models.letterbox import IDENTITY
from worker.models.loading import LoadedModel, load_model_for_device
from worker.pipeline import forward_batches, pixel_budget, run_model


def _input(width: int, height: int) -> ModelInput:
    return ModelInput(np.zeros((height, width, 3), dtype=np.uint8), IDENTITY)


def _same(item: ModelInput) -> ModelInput:
    return item


def _recorded(tmp_path: Path) -> tuple[LoadedModel, CountsForwards]:
    loaded = load_model_for_device(save_fixed_box_model(tmp_path / "fixed.pt"), "cpu", micro_batch=8)
    recording = CountsForwards(loaded.module)
    return replace(loaded, module=recording), recording


def test_forwards_hold_at_most_the_micro_batch_and_the_pixel_budget() -> None:
    # Given inputs of 100x100, 100x100, 100x100, 300x300 (alone past the budget), 100x100 x 3
    inputs = [_input(100, 100)] * 3 + [_input(300, 300)] + [_input(100, 100)] * 3
    # When they are gathered with a budget of 25,000 pixels and a micro-batch of 8, or of 1
    by_pixels = [len(b) for b in forward_batches(inputs, _same, 8, 25_000)]
    by_count = [len(b) for b in forward_batches(inputs, _same, 1, float("inf"))]
    unlimited = [len(b) for b in forward_batches(inputs, _same, 8, float("inf"))]
    # Then two small ones share a forward, the large one goes alone, and order is kept
    assert by_pixels == [2, 1, 1, 2, 1]
    assert by_count == [1] * 7
    assert unlimited == [7]
    assert [i for b in forward_batches(inputs, _same, 8, 25_000) for i in b] == inputs


def test_a_full_forward_is_handed_on_before_the_next_input_is_asked_for() -> None:
    # Given a source that counts what it has handed out (in the worker, each is a decode)
    taken: list[int] = []

    def source() -> Iterator[ModelInput]:
        for index in range(5):
            taken.append(index)
            yield _input(100, 100)

    batches = forward_batches(source(), _same, 2, 25_000)
    # When the first forward comes out
    first = next(batches)
    # Then it holds two inputs and the third was not yet decoded: the model does not wait for it
    assert len(first) == 2 and taken == [0, 1]
    # And a budget that one more input of the last one's size would pass also hands the forward on
    taken.clear()
    first = next(forward_batches(source(), _same, 8, 20_000))
    assert len(first) == 2 and taken == [0, 1]


def _size(item: ModelInput) -> tuple[int, int]:
    return int(item.pixels.shape[1]), int(item.pixels.shape[0])


def test_only_inputs_of_one_key_share_a_forward_and_few_wait_for_mates() -> None:
    # Given inputs of two sizes, alternating, grouped by size into forwards of two
    a, b = _input(100, 100), _input(120, 100)
    forwards = list(forward_batches([a, b, a, b, a], _same, 2, float("inf"), _size))
    # Then each forward holds one size, filled as mates come, the last one flushed at the end
    assert forwards == [[a, a], [b, b], [a]]
    # Given a source of five sizes, each new (no input ever finds a mate)
    taken: list[int] = []

    def source() -> Iterator[ModelInput]:
        for index in range(5):
            taken.append(index)
            yield _input(100 + index, 100)

    # When they are grouped into forwards of two
    seen = []
    for forward in forward_batches(source(), _same, 2, float("inf"), _size):
        seen.append((len(taken), [_size(i)[0] for i in forward]))
    # Then at most the micro-batch waits for mates: the oldest goes alone once a third arrives
    assert seen == [(3, [100]), (4, [101]), (5, [102]), (5, [103]), (5, [104])]
    # And the pixel budget bounds what waits as well: three inputs of 40% of it do not wait together,
    # though the micro-batch of eight would let them
    seen.clear()
    taken.clear()
    for forward in forward_batches(source(), _same, 8, 2.5 * 100 * 100, _size):
        seen.append((len(taken), [_size(i)[0] for i in forward]))
    assert seen[0] == (3, [100])


def test_the_pixel_budget_holds_on_a_cpu_only() -> None:
    model = LoadedModel(
        module=None,
        meta=None,  # type: ignore[arg-type]
        adapter=None,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        path=Path("m.pt"),
        sha256="0" * 64,
        kind="torchscript",
        load_ms=0.0,
        warmup_ms=0.0,
    )
    assert pixel_budget(model, 2_500_000) == 2_500_000
    assert pixel_budget(model, None) == float("inf")
    assert pixel_budget(replace(model, device=torch.device("cuda", 0)), 2_500_000) == float("inf")


def test_run_model_splits_a_micro_batch_by_pixels_and_keeps_each_images_detections(tmp_path: Path) -> None:
    # Given a torchvision-format model (it takes full-size images) and five 200x100 images
    model, recording = _recorded(tmp_path)
    inputs = [_input(200, 100) for _ in range(5)]
    # When they run as one micro-batch of 8 with a budget of two images' pixels
    outcomes = run_model(model, inputs, 8, cpu_pixels=40_000)
    # Then the model saw forwards of 2, 2 and 1, and every image has its own box in its own pixels
    assert recording.sizes == [2, 2, 1]
    assert [o.error for o in outcomes] == [None] * 5
    for outcome in outcomes:
        assert outcome.detections is not None
        assert outcome.detections.boxes.tolist() == [[50.0, 25.0, 150.0, 75.0]]
    # And without a budget (as on a GPU) they run in one forward
    recording.sizes.clear()
    run_model(model, inputs, 8)
    assert recording.sizes == [5]
