"""The Celery batch task: a thin shell over worker.batch, its process's runtime on its base class."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery import Celery, Task

from detq.contract import TASK_PROCESS_BATCH, batch_id_of, is_backup, parse_batch_args
from dispatch.send import send_batch
from worker.batch import run_batch
from worker.runtime import WorkerRuntime


class BatchTask(Task):  # type: ignore[type-arg]
    """Base of the batch task: each pool process installs its runtime here once, after fork.

    Celery makes one task instance per process, so the runtime lives on that instance, as arq hands
    `ctx` to every job, rather than in a module global.
    """

    runtime: WorkerRuntime | None = None

    def require_runtime(self) -> WorkerRuntime:
        """This process's runtime; fails loudly if the process never initialised."""
        if self.runtime is None:
            raise RuntimeError("worker process was not initialised (worker_process_init did not run)")
        return self.runtime


def register_tasks(app: Celery) -> BatchTask:
    """Register the batch task on this app (the worker side only); returns the task instance."""

    @app.task(name=TASK_PROCESS_BATCH, base=BatchTask, bind=True, ignore_result=True)
    def process_batch_task(self: BatchTask, job_id: Any, image_ids: Any) -> dict[str, int]:
        message = parse_batch_args(job_id, image_ids)
        task_id = self.request.id

        def send(job: int, batch: int, ids: Sequence[int], pool: str) -> None:
            send_batch(self.app, job_id=job, batch_id=batch, image_ids=ids, pool=pool)

        runtime = self.require_runtime()
        report = run_batch(runtime, message, batch_id_of(task_id), backup=is_backup(task_id), send=send)
        return {"written": report.written, "skipped": report.skipped}

    task: Any = app.tasks[TASK_PROCESS_BATCH]
    assert isinstance(task, BatchTask)
    return task
