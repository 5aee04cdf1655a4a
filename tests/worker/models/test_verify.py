"""The rewrites made at load, checked again on a process's first real forwards against the model as saved:
verified and used where the detections are the same, the model as saved answering wherever they are not."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import torch

from bench.photos import write_photo
from db.images_repo import PendingImage
from db.ledger import open_ledger
from detq.settings import Settings
from detq.vocabulary import ImageStatus
from tests.support import save_torchvision_detector
from worker.models.loading import LoadedModel, load_model_for_device
from worker.models.outputs import RawDetections
from worker.models.ssd_postprocess import SelectedSsd
from worker.models.verify import MAX_CHECKED_FORWARDS, RewriteCheck
from worker.pipeline import detect_images
from worker.runtime import WorkerRuntime, load_configured


def _raw(*corners: float) -> RawDetections:
    return RawDetections(
        boxes=torch.tensor([list(corners)], dtype=torch.float32),
        labels=torch.tensor([1]),
        scores=torch.tensor([0.9]),
    )


def _check(needs_exercise: bool = False) -> tuple[RewriteCheck, list[int]]:
    loads: list[int] = []

    def load() -> LoadedModel:
        loads.append(1)
        return cast(LoadedModel, "the model as saved")

    return RewriteCheck("m.pt", ("sampled resize",), load, needs_exercise=needs_exercise), loads


def test_the_same_detections_verify_the_rewrites_and_let_the_second_copy_go() -> None:
    check, loads = _check()
    check.reference()
    assert check.judge([_raw(1, 2, 3, 4)], [_raw(1, 2, 3, 4)], ["a.jpg"], exercised=False)
    assert not check.pending and not check.fell_back and check.as_saved is None
    assert check.verdict == "sampled resize: the same detections on 1 real forwards" and loads == [1]


def test_any_difference_hands_the_process_to_the_model_as_saved() -> None:
    check, _ = _check()
    check.reference()
    same = check.judge(
        [_raw(1, 2, 3, 4), _raw(1, 2, 3, 4)], [_raw(1, 2, 3, 4), _raw(1, 2, 3, 5)], ["a", "b"], True
    )
    assert not same and check.fell_back and check.reference() == "the model as saved"
    assert check.verdict is not None and "on a real image (b)" in check.verdict
    # A forward of the model as saved that failed where the rewritten one answered is a difference too
    failed, _ = _check()
    failed.reference()
    assert not failed.judge([_raw(1, 2, 3, 4)], [None], ["a"], False) and failed.fell_back


def test_a_rewrite_the_probes_never_exercised_is_verified_once_a_real_forward_does() -> None:
    check, _ = _check(needs_exercise=True)
    check.reference()
    for _ in range(3):
        assert check.judge([_raw(1, 2, 3, 4)], [_raw(1, 2, 3, 4)], ["a"], exercised=False)
        assert check.pending
    assert check.judge([_raw(1, 2, 3, 4)], [_raw(1, 2, 3, 4)], ["a"], exercised=True)
    assert not check.pending and not check.fell_back and check.checked_forwards == 4


def test_a_selection_real_forwards_never_use_is_declined_and_the_other_rewrites_kept() -> None:
    check, _ = _check(needs_exercise=True)
    declined: list[bool] = []
    check.decline = lambda: declined.append(True)
    check.reference()
    for _ in range(MAX_CHECKED_FORWARDS):
        check.judge([_raw(1, 2, 3, 4)], [_raw(1, 2, 3, 4)], ["a"], exercised=False)
    assert declined == [True] and not check.pending and not check.fell_back and check.as_saved is None
    assert check.verdict is not None and "none of which used the selection" in check.verdict


@pytest.fixture(scope="module")
def ssdlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_torchvision_detector(
        tmp_path_factory.mktemp("ssd") / "ssdlite.pt", "ssdlite", calibrated=True
    )


def test_a_load_names_the_speedups_it_applied_and_as_saved_applies_none(
    ssdlite: Path, tmp_path: Path
) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path, micro_batch=4)
    tuned = load_configured(settings, ssdlite, "cpu")
    assert tuned.speedups == ("sampled resize", "selected detections", "micro-batches (any)")
    plain = load_configured(settings.replace(as_saved=True), ssdlite, "cpu")
    assert plain.speedups == () and plain.rewrite_check is None and not isinstance(plain.module, SelectedSsd)


def _runtime(model: Path, tmp_path: Path, micro_batch: int = 4) -> WorkerRuntime:
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", model=model, micro_batch=micro_batch)
    return WorkerRuntime(
        settings=settings,
        ledger=open_ledger(settings),
        device="cpu",
        default_model=load_configured(settings, model, "cpu"),
    )


def _photos(folder: Path, count: int) -> list[PendingImage]:
    sizes = [(640, 480), (1280, 960), (480, 640), (500, 333)]
    return [
        PendingImage(
            id=i,
            job_id=1,
            path=str(write_photo(folder / f"p{i}.jpg", *sizes[i % 4], seed=i)),
            root_index=0,
            status=ImageStatus.PENDING,
        )
        for i in range(count)
    ]


def _as_saved_boxes(runtime: WorkerRuntime, model: Path, images: list[PendingImage]) -> list[object]:
    """Each image's rows from the model as saved (none of the rewrites), through the same pipeline."""
    plain = load_model_for_device(
        model, "cpu", channels_last=False, sampled_resize=False, selected_detections=False
    )
    assert plain.rewrite_check is None
    root = str(Path(images[0].path).parent)
    return [r.detections for r in detect_images(runtime, plain, images, [root])]


@pytest.mark.slow
def test_an_ssdlites_rewrites_are_verified_on_its_first_real_forward(ssdlite: Path, tmp_path: Path) -> None:
    # Given a worker with a calibrated SSDlite, rewritten at load (sampled resize, selected detections)
    runtime = _runtime(ssdlite, tmp_path)
    try:
        model = runtime.default_model
        check = model.rewrite_check
        assert check is not None and {"sampled resize", "selected detections"} <= set(check.rewrites)
        assert check.pending
        images = _photos(tmp_path, 6)
        # When it detects on its first batch of photos
        results = detect_images(runtime, model, images, [str(tmp_path)])
        # Then the first forward verified the rewrites, the model as saved was let go, and the results are
        # those of the model as saved
        assert not check.pending and not check.fell_back and check.as_saved is None
        assert check.verdict is not None and "the same detections on 1 real forwards" in check.verdict
        assert [r.detections for r in results] == _as_saved_boxes(runtime, ssdlite, images)
        assert runtime.model_for(model.sha256, str(ssdlite)).module is model.module
    finally:
        runtime.close()


@pytest.mark.slow
def test_a_rewrite_that_differs_on_a_real_forward_is_dropped_and_none_of_its_answers_stored(
    ssdlite: Path, tmp_path: Path
) -> None:
    # Given a worker whose rewritten SSDlite answers otherwise than its file (its weights nudged after load,
    # as a rewrite gone wrong on real images would)
    runtime = _runtime(ssdlite, tmp_path)
    try:
        model = runtime.default_model
        assert isinstance(model.module, SelectedSsd)
        with torch.no_grad():
            for parameter in model.module.parameters():
                parameter.mul_(1.01)
        images = _photos(tmp_path, 6)
        expected = _as_saved_boxes(runtime, ssdlite, images)
        # When it detects on a batch (two forwards: the first checked, the second after the verdict)
        results = detect_images(runtime, model, images, [str(tmp_path)])
        # Then every result is the model as saved's, the log's verdict says why, and the process's next
        # batches get the model as saved
        check = model.rewrite_check
        assert check is not None and check.fell_back and "other detections" in str(check.verdict)
        assert all(r.status == ImageStatus.DONE for r in results)
        assert [r.detections for r in results] == expected
        again = runtime.model_for(model.sha256, str(ssdlite))
        assert again.rewrite_check is None and not isinstance(again.module, SelectedSsd)
        assert runtime.default_model.module is again.module  # the rewritten copy let go
        assert [r.detections for r in detect_images(runtime, again, images, [str(tmp_path)])] == expected
    finally:
        runtime.close()


@pytest.mark.slow
def test_an_ssdlite_whose_selection_noise_never_reaches_is_checked_on_real_forwards(tmp_path: Path) -> None:
    # Given an SSDlite as built with weights=None: every score 1/91, so its probes never reach a selection
    path = save_torchvision_detector(tmp_path / "flat.pt", "ssdlite")
    runtime = _runtime(path, tmp_path, micro_batch=1)
    try:
        model = runtime.default_model
        # Then it is taken over all the same, left to real forwards to verify
        assert isinstance(model.module, SelectedSsd)
        check = model.rewrite_check
        assert check is not None and check.needs_exercise and check.pending
        assert any(
            n.startswith("selected detections: not exercised by the probes, checked") for n in model.notes
        )
        # When ten photos go through it one a forward (its ties decline the selection on photos too)
        images = _photos(tmp_path, 10)
        results = detect_images(runtime, model, images, [str(tmp_path)])
        # Then after eight forwards that never used it, every image goes through the model's own
        # postprocess, the other rewrites kept, and every result is the model as saved's
        assert not check.pending and not check.fell_back and model.module.force_reference
        assert "none of which used the selection" in str(check.verdict)
        assert [r.detections for r in results] == _as_saved_boxes(runtime, path, images)
    finally:
        runtime.close()
