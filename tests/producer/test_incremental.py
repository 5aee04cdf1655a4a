"""Incremental scans: the per-file decision, and the chunk selection against real ledgers."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.history_repo import PastOutcome
from db.images_repo import ImageResult, NewImage, finalise_results, insert_images
from db.jobs_repo import create_job, get_or_create_model
from detq.inference_settings import DEFAULT_KEY, InferenceSettings
from detq.vocabulary import ImageStatus, JobPool
from producer.incremental import Decision, Tally, decide, select_files
from producer.scan import ScannedFile

FILE = ScannedFile(path="/d/a.png", size_bytes=100, mtime=5.0, root_index=0)


def outcome(status: ImageStatus, size: int = 100, mtime: float = 5.0) -> PastOutcome:
    return PastOutcome(size_bytes=size, mtime=mtime, status=status.value)


@pytest.mark.parametrize(
    ("history", "decision"),
    [
        ([], Decision.NEW),
        ([outcome(ImageStatus.DONE, size=99)], Decision.CHANGED),
        ([outcome(ImageStatus.DONE, mtime=4.0)], Decision.CHANGED),
        ([outcome(ImageStatus.DONE)], Decision.SKIP),
        ([outcome(ImageStatus.REJECTED)], Decision.SKIP),
        ([outcome(ImageStatus.PENDING)], Decision.SKIP),  # in flight in another job
        ([outcome(ImageStatus.FAILED)], Decision.RETRY),
        ([outcome(ImageStatus.FAILED)] * 2, Decision.RETRY),
        ([outcome(ImageStatus.FAILED)] * 3, Decision.SKIP),  # 1 try + 2 retries: left with its reason
        ([outcome(ImageStatus.FAILED)] * 2 + [outcome(ImageStatus.DONE)], Decision.SKIP),
        ([outcome(ImageStatus.FAILED, mtime=1.0)] * 3, Decision.CHANGED),  # changed since: a fresh budget
    ],
)
def test_decide(history: list[PastOutcome], decision: Decision) -> None:
    assert decide(FILE, history, max_retries=2) is decision


def _model(session: Session, sha: str) -> int:
    return get_or_create_model(session, sha256=sha * 64, path="/m.pt", size_bytes=1, meta={}).id


def test_select_files_uses_the_same_models_history(factory: sessionmaker[Session]) -> None:
    # Given a job of model A where a.png is done, b.png failed and c.png is still pending
    with factory() as session, session.begin():
        model_a, model_b = _model(session, "a"), _model(session, "b")
        job = create_job(session, model_id=model_a, roots=["/d"], pool="any", batch_size=4).id
        ids = insert_images(session, job, [NewImage(f"/d/{n}.png", 100, 5.0) for n in "abc"])
        finalise_results(
            session,
            job,
            model_a,
            [
                ImageResult(ids[0], ImageStatus.DONE),
                ImageResult(ids[1], ImageStatus.FAILED, reason="truncated"),
            ],
            worker="w",
            device="cpu",
        )
    scanned = [ScannedFile(f"/d/{n}.png", 100, 5.0, 0) for n in "abcd"] + [
        ScannedFile("/d/a.png", 100, 6.0, 0)
    ]
    tally = Tally()
    with factory() as session:
        # When model A scans a, b, c, the new d and a touched a
        selected = select_files(session, (model_a, DEFAULT_KEY), scanned, 2, tally)
        # Then b is retried, d is new, the touched a changed; a and c are skipped
        assert [(f.path, f.mtime) for f in selected] == [
            ("/d/b.png", 5.0),
            ("/d/d.png", 5.0),
            ("/d/a.png", 6.0),
        ]
        assert (tally.new, tally.changed, tally.retried, tally.skipped) == (1, 1, 1, 2)
        # And a new model processes everything again
        fresh = Tally()
        assert len(select_files(session, (model_b, DEFAULT_KEY), scanned, 2, fresh)) == len(scanned)
        assert fresh.new == len(scanned)
        # And so does the same model at another score threshold: its results would differ
        other = Tally()
        stricter = InferenceSettings(score_threshold=0.7).key
        assert len(select_files(session, (model_a, stricter), scanned, 2, other)) == len(scanned)
        assert other.new == len(scanned)


def test_only_new_enqueue_records_counts(factory: sessionmaker[Session], tmp_path: Path) -> None:
    from demo.shapes import write_dataset
    from detq.celery_app import make_celery_app
    from detq.settings import Settings
    from dispatch.broker import read_broker
    from producer.enqueue import EnqueueResult, enqueue_folders

    # Given three images and the embedded broker in a folder of this test
    write_dataset(tmp_path / "imgs", 3, seed=1)
    settings = Settings(_env_file=None, data_dir=tmp_path / "data")
    app = make_celery_app(settings)
    model = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"

    # When they are enqueued with --only-new twice, then without it
    def enqueue(only_new: bool) -> EnqueueResult:
        roots = [tmp_path / "imgs"]
        return enqueue_folders(
            factory, app, roots=roots, model_path=model, pool=JobPool.ANY, batch_size=2, only_new=only_new
        )

    first, again, plain = enqueue(True), enqueue(True), enqueue(False)
    # Then the first takes all three, the second none (they are pending elsewhere), the plain one all
    assert first.counts is not None and (first.total, first.counts.new) == (3, 3)
    assert again.counts is not None and (again.total, again.counts.skipped) == (0, 3)
    assert again.notes.images == 3 and again.notes.warnings(again.job_id) == []  # nothing new: no warning
    assert (plain.total, plain.counts) == (3, None)
    # And four batch messages wait in the broker, each under its batch's task id
    assert len(read_broker(app, settings).queued) == first.batches + plain.batches == 4


def test_only_new_at_other_settings_is_new_work_and_the_job_records_them(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    from demo.shapes import write_dataset
    from detq.celery_app import make_celery_app
    from detq.settings import Settings
    from producer.enqueue import EnqueueError, enqueue_folders
    from producer.status import job_status

    write_dataset(tmp_path / "imgs", 3, seed=1)
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    model = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"

    def enqueue(settings: InferenceSettings) -> int:
        result = enqueue_folders(
            factory,
            app,
            roots=[tmp_path / "imgs"],
            model_path=model,
            pool=JobPool.ANY,
            batch_size=2,
            only_new=True,
            settings=settings,
        )
        return result.total

    loose, strict = InferenceSettings(score_threshold=0.3), InferenceSettings(score_threshold=0.7)
    # Given a folder queued --only-new at a score threshold of 0.3
    assert enqueue(loose) == 3
    # When it is queued again at 0.7, then at 0.3 once more
    # Then 0.7 is new work for every file, and 0.3 is nothing new
    assert enqueue(strict) == 3
    assert enqueue(loose) == 0
    # And the jobs record their settings, as detq status shows them
    with factory() as session:
        shown = [job_status(session, job_id) for job_id in (1, 2)]
    assert [s.settings_line for s in shown] == ["conf 0.3", "conf 0.7"]
    assert shown[0].settings == loose.to_json()
    # And a class the model does not have is refused before any job is made (the demo model names its)
    with pytest.raises(EnqueueError, match="has no class 'circel'; its classes are: circle, square"):
        enqueue(InferenceSettings(classes=("circel",)))


def test_an_incremental_run_cuts_whole_batches_across_scan_chunks(
    factory: sessionmaker[Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy import func, select

    import producer.enqueue as enqueue
    from db.models import Image
    from detq.celery_app import make_celery_app
    from detq.settings import Settings

    # Given scan chunks of ten files, and a folder of thirty files already queued
    monkeypatch.setattr(enqueue, "INSERT_CHUNK", 10)
    folder = tmp_path / "imgs"
    folder.mkdir()
    for n in range(30):
        (folder / f"{n:03d}0.jpg").write_bytes(b"\xff\xd8 not decoded by enqueue")
    app = make_celery_app(Settings(_env_file=None, data_dir=tmp_path / "data"))
    model = Path(__file__).resolve().parents[2] / "worker" / "assets" / "demo_detector.pt"

    def only_new() -> enqueue.EnqueueResult:
        return enqueue.enqueue_folders(
            factory, app, roots=[folder], model_path=model, pool=JobPool.CPU, batch_size=4, only_new=True
        )

    first = only_new()
    # When ten new files land between the old ones, two or three in each chunk the scan reads
    for n in range(0, 30, 3):
        (folder / f"{n:03d}5.jpg").write_bytes(b"\xff\xd8 not decoded by enqueue")
    second = only_new()
    app.close()
    # Then the run queues them in whole batches across the chunks (the rest in its last), not a short
    # batch a chunk
    with factory() as session:
        sizes = session.scalars(
            select(func.count()).where(Image.job_id == second.job_id).group_by(Image.batch_id)
        ).all()
    assert (first.total, first.batches) == (30, 8)
    assert second.total == 10 and sorted(sizes) == [2, 4, 4] and second.batches == 3
