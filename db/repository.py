"""The ledger's repository API in one import; functions take the caller's Session and never commit."""

from __future__ import annotations

from db.images_repo import (
    DetectionRow,
    ImageResult,
    NewImage,
    PendingImage,
    insert_images,
    iter_ledger,
    label_names,
    load_images,
    pending_image_ids,
    record_results,
)
from db.jobs_repo import (
    JobCounts,
    create_job,
    finish_enqueue,
    get_job,
    get_or_create_model,
    job_counts,
    latest_job_id,
    list_jobs,
)

__all__ = [
    "DetectionRow",
    "ImageResult",
    "JobCounts",
    "NewImage",
    "PendingImage",
    "create_job",
    "finish_enqueue",
    "get_job",
    "get_or_create_model",
    "insert_images",
    "iter_ledger",
    "job_counts",
    "label_names",
    "latest_job_id",
    "list_jobs",
    "load_images",
    "pending_image_ids",
    "record_results",
]
