"""Workers apply a job's inference settings, whatever their own say: thresholds and classes without a load,
another input size or format by a load of its own; a job of before jobs had settings runs as the worker
says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sqlalchemy import update

from db.models import Job
from detq.inference_settings import InferenceSettings
from detq.vocabulary import ImageStatus
from tests.support import save_yolov8_like, write_jpeg
from tests.worker.conftest import Staged
from worker.batch import process_batch
from worker.runtime import WorkerRuntime

Stage = Callable[..., Staged]


def _boxes(runtime: WorkerRuntime, job: Staged) -> list[list[tuple[str, float]]]:
    """Each image's detections as (label, score), in image order."""
    from sqlalchemy import select

    from db.models import Detection, Image

    with runtime.ledger.sessions() as session:
        found: list[list[tuple[str, float]]] = []
        for image_id in job.image_ids:
            image = session.get_one(Image, image_id)
            assert image.status == ImageStatus.DONE, image.reason
            rows = session.execute(
                select(Detection.label, Detection.score).where(Detection.image_id == image_id)
            ).tuples()
            found.append([(label, round(score, 3)) for label, score in rows])
        return found


def test_a_jobs_threshold_and_classes_are_applied_without_loading_the_model_again(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given the fixed-box model (one "thing" at 0.9 an image) loaded by the worker, and one image
    write_jpeg(tmp_path / "a.jpg", (64, 48))
    asked = {
        "defaults": InferenceSettings(),
        "conf 0.95": InferenceSettings(score_threshold=0.95),
        "conf 0.5": InferenceSettings(score_threshold=0.5),
        "other class": InferenceSettings(classes=("background",)),
        "its class": InferenceSettings(classes=("thing",)),
        "its label id": InferenceSettings(classes=("1",)),
    }
    # When a job of each settings runs over it in this process
    found = {}
    for name, settings in asked.items():
        job = stage(tmp_path, ["a.jpg"], settings=settings)
        process_batch(runtime, job.job_id, job.image_ids)
        found[name] = _boxes(runtime, job)[0]
    # Then each job's results are those of its settings
    thing = [("thing", 0.9)]
    assert found == {
        "defaults": thing,
        "conf 0.95": [],
        "conf 0.5": thing,
        "other class": [],
        "its class": thing,
        "its label id": thing,
    }
    # And none of them loaded the model again
    assert runtime.model_loads == 1


def test_a_job_of_another_input_size_runs_on_a_load_of_its_own(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a YOLO export (its box fixed in 640x640 input pixels) and an image
    model = save_yolov8_like(tmp_path / "v8.torchscript")
    write_jpeg(tmp_path / "a.jpg", (640, 480))
    # When a job runs it at its own 640, one keeps only cats, and another runs at --imgsz 320
    at_640 = stage(tmp_path, ["a.jpg"], model=model)
    at_320 = stage(tmp_path, ["a.jpg"], model=model, settings=InferenceSettings(input_size=(320, 320)))
    cats = stage(tmp_path, ["a.jpg"], model=model, settings=InferenceSettings(classes=("cat",)))
    boxes = {}
    for name, job in (("640", at_640), ("cats", cats), ("320", at_320)):
        process_batch(runtime, job.job_id, job.image_ids)
        with runtime.ledger.sessions() as session:
            from sqlalchemy import select

            from db.models import Detection

            boxes[name] = session.execute(
                select(Detection.label, Detection.x1, Detection.x2).where(
                    Detection.image_id == job.image_ids[0]
                )
            ).all()
    # Then the 320 job's box is the same output mapped back through a letterbox half the size: its left
    # edge twice as far (its right one clamped to the image); each size was loaded once (the worker's own
    # model, the export at 640, at 320)
    ((label, x1, x2),) = boxes["640"]
    ((label_320, x1_320, x2_320),) = boxes["320"]
    assert label == label_320 == "dog"
    assert (x1, x2) == (270.0, 370.0) and (x1_320, x2_320) == (540.0, 640.0)
    assert runtime.model_loads == 3
    # And keeping cats, only the best class of each box counts (as Ultralytics' classes=): none is a cat
    assert boxes["cats"] == []


def test_a_job_made_before_jobs_had_settings_runs_as_the_workers_settings_say(
    runtime: WorkerRuntime, stage: Stage, tmp_path: Path
) -> None:
    # Given a worker whose own DETQ_SCORE_THRESHOLD is 0.95
    strict = replace(runtime, settings=runtime.settings.replace(score_threshold=0.95))
    strict.own_settings = InferenceSettings.from_settings(strict.settings)
    write_jpeg(tmp_path / "a.jpg", (64, 48))
    # And a job with no recorded settings (made before migration 0008), and one made now at the defaults
    old = stage(tmp_path, ["a.jpg"])
    new = stage(tmp_path, ["a.jpg"])
    with runtime.ledger.sessions() as session, session.begin():
        session.execute(update(Job).where(Job.id == old.job_id).values(settings=None))
    # When both run in that worker
    for job in (old, new):
        process_batch(strict, job.job_id, job.image_ids)
    # Then the old one's results are as the worker's threshold says, the new one's as its own settings say
    assert _boxes(strict, old) == [[]]
    assert _boxes(strict, new) == [[("thing", 0.9)]]
