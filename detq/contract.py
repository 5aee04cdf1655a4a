"""The message contract producers and workers meet in: queue and task names, and what a task may carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detq.vocabulary import JobPool, WorkerPool

QUEUE_GPU = "gpu"
QUEUE_CPU = "cpu"
QUEUE_ANY = "any"
INFERENCE_QUEUES = (QUEUE_GPU, QUEUE_CPU, QUEUE_ANY)
QUEUES_BY_POOL: dict[WorkerPool, tuple[str, ...]] = {
    WorkerPool.GPU: (QUEUE_GPU, QUEUE_ANY),
    WorkerPool.CPU: (QUEUE_CPU, QUEUE_ANY),
}
TASK_PROCESS_BATCH = "detq.process_batch"
# A batch message header: sent again by the reconciler, to be handed out before the queue's backlog.
SENT_AGAIN_HEADER = "detq_sent_again"
# `detq scheduler` alone consumes the control queue: beat sends it one scheduled run at a time, and the
# task (producer/scheduler/control.py) scans and enqueues without torch. Inference workers never listen.
QUEUE_CONTROL = "control"
TASK_SCHEDULED_RUN = "detq.scheduled_run"

# Images per batch message, for every path that makes one (enqueue, requeue, schedules, settings):
# a worker refuses a message with more ids, so nothing may be queued that it would refuse.
MIN_BATCH_SIZE = 1
MAX_BATCH_SIZE = 1024


def queues_of_worker_pool(pool: str) -> tuple[str, ...]:
    """The queues a worker of this pool (as its worker row names it) consumes; none for an unknown one."""
    try:
        return QUEUES_BY_POOL[WorkerPool(pool)]
    except ValueError:
        return ()


def queue_for_pool(pool: JobPool | str) -> str:
    """The queue a job's tasks go to."""
    try:
        return JobPool(pool).value
    except ValueError:
        raise ValueError(f"unknown pool {pool!r}: expected any, gpu or cpu") from None


def check_batch_size(batch_size: int) -> int:
    """The batch size if it is one a worker accepts; ValueError with the allowed range otherwise."""
    if isinstance(batch_size, bool) or not MIN_BATCH_SIZE <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch size must be from {MIN_BATCH_SIZE} to {MAX_BATCH_SIZE}, not {batch_size}")
    return batch_size


def batches_of(ids: list[int], batch_size: int) -> list[list[int]]:
    """ids cut into messages of at most batch_size (clamped to what a worker accepts)."""
    size = max(MIN_BATCH_SIZE, min(batch_size, MAX_BATCH_SIZE))
    return [ids[start : start + size] for start in range(0, len(ids), size)]


# A batch message's Celery task id names its ledger batch, so a copy in the broker can be told from a
# lost one; a batch sent again keeps its task id. A backup (a second copy sent at a queue's tail, for an
# idle worker to race a slow one) has its own id, so both can be told apart.
TASK_ID_PREFIX = "detq-batch-"
BACKUP_SUFFIX = "-backup"


def task_id_for(batch_id: int) -> str:
    """The task id of a batch's messages."""
    return f"{TASK_ID_PREFIX}{batch_id}"


def backup_task_id_for(batch_id: int) -> str:
    """The task id of a batch's backup copy."""
    return f"{TASK_ID_PREFIX}{batch_id}{BACKUP_SUFFIX}"


def is_backup(task_id: str | None) -> bool:
    """True for the task id of a backup copy."""
    return batch_id_of(task_id) is not None and str(task_id).endswith(BACKUP_SUFFIX)


def batch_id_of(task_id: str | None) -> int | None:
    """The batch a task id names (a backup's too), or None for a task id detq did not make."""
    if not task_id or not task_id.startswith(TASK_ID_PREFIX):
        return None
    tail = task_id[len(TASK_ID_PREFIX) :].removesuffix(BACKUP_SUFFIX)
    return int(tail) if tail.isdigit() else None


@dataclass(frozen=True)
class BatchMessage:
    """The arguments of detq.process_batch: a job id and its image ids, plain positive integers."""

    job_id: int
    image_ids: list[int]

    def args(self) -> list[Any]:
        """The task's positional arguments, as sent."""
        return [self.job_id, list(self.image_ids)]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def parse_batch_args(job_id: Any, image_ids: Any) -> BatchMessage:
    """Validate a received message: ids only, 1..MAX_BATCH_SIZE of them; ValueError otherwise."""
    if not _positive_int(job_id):
        raise ValueError(f"job_id must be a positive integer, got {job_id!r}")
    if not isinstance(image_ids, list) or not image_ids or len(image_ids) > MAX_BATCH_SIZE:
        raise ValueError(f"image_ids must be a list of 1..{MAX_BATCH_SIZE} integers")
    if not all(_positive_int(i) for i in image_ids):
        raise ValueError("image_ids must all be positive integers")
    return BatchMessage(job_id=job_id, image_ids=list(image_ids))
