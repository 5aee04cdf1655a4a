"""A real worker runtime for unit tests: an SQLite ledger in a temporary folder, tiny TorchScript models."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from db.images_repo import NewImage, insert_images
from db.jobs_repo import create_job, finish_enqueue, get_or_create_model
from db.ledger import open_ledger
from db.models import Image
from detq.inference_settings import DEFAULTS, InferenceSettings
from detq.modelfile import file_sha256
from detq.settings import Settings
from detq.vocabulary import JobPool
from tests.support import save_fixed_box_model
from worker.models.loading import LoadedModel, load_model_for_device
from worker.runtime import WorkerRuntime


@dataclass
class Staged:
    """A job in the ledger over some files, ready for its batch."""

    job_id: int
    image_ids: list[int]
    names: dict[int, str]  # image id -> file name


def ledger_rows(runtime: WorkerRuntime, job_id: int) -> dict[int, Image]:
    """The job's image rows as the ledger has them now, by id."""
    with runtime.ledger.sessions() as session:
        return {i.id: i for i in session.scalars(select(Image).where(Image.job_id == job_id))}


def swap_default_model(runtime: WorkerRuntime, model: LoadedModel) -> None:
    """Run the default model's jobs with `model` instead (a wrapped or scripted stand-in)."""
    (key,) = [k for k, v in runtime.models.items() if v is runtime.default_model]
    runtime.models[key] = model


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    """Settings of an embedded deployment in tmp_path, using the fixed-box test model."""
    model = save_fixed_box_model(tmp_path / "fixed_box.pt")
    return Settings(_env_file=None, data_dir=tmp_path / "data", model=model, micro_batch=4)


@pytest.fixture()
def runtime(settings: Settings) -> Iterator[WorkerRuntime]:
    """A pool process's runtime, built as worker.bootstrap builds it, on the CPU."""
    ledger = open_ledger(settings)
    made = WorkerRuntime(
        settings=settings,
        ledger=ledger,
        device="cpu",
        default_model=load_model_for_device(settings.model, "cpu"),
    )
    yield made
    made.close()


@pytest.fixture()
def stage(runtime: WorkerRuntime) -> Callable[..., Staged]:
    """Record a job over files of a root (enqueue's rows, without a broker)."""

    def make(
        root: Path, names: list[str], model: Path | None = None, settings: InferenceSettings = DEFAULTS
    ) -> Staged:
        model_path = model or runtime.settings.model
        with runtime.ledger.sessions() as session, session.begin():
            record = get_or_create_model(
                session,
                sha256=file_sha256(model_path),
                path=str(model_path),
                size_bytes=model_path.stat().st_size,
                meta={},
            )
            job = create_job(
                session,
                model_id=record.id,
                roots=[str(root)],
                pool=JobPool.CPU,
                batch_size=16,
                settings=settings,
            )
            rows = [NewImage(str(root / name), 0, 0.0, 0) for name in names]
            ids = insert_images(session, job.id, rows)
            finish_enqueue(session, job.id, len(ids))
            return Staged(job_id=job.id, image_ids=ids, names=dict(zip(ids, names, strict=True)))

    return make
