"""Device and thread choices for GPU and CPU pool processes."""

from __future__ import annotations

import pytest

from detq.vocabulary import WorkerPool
from worker.devices import NoGpuError, default_concurrency, device_for_process, threads_per_process


def test_gpu_pool_refuses_without_cuda() -> None:
    with pytest.raises(NoGpuError, match="no CUDA device"):
        default_concurrency(WorkerPool.GPU, cores=8, gpu_count=0)


def test_gpu_pool_defaults_to_one_process_per_gpu() -> None:
    assert default_concurrency(WorkerPool.GPU, cores=16, gpu_count=4) == 4
    assert [device_for_process(WorkerPool.GPU, i, 2) for i in range(4)] == [
        "cuda:0",
        "cuda:1",
        "cuda:0",
        "cuda:1",
    ]


def test_cpu_pool_uses_every_core_with_one_thread_each() -> None:
    assert default_concurrency(WorkerPool.CPU, cores=6, gpu_count=2) == 6
    assert device_for_process(WorkerPool.CPU, 3, 2) == "cpu"
    assert threads_per_process(WorkerPool.CPU, cores=8, concurrency=8) == 1
    assert threads_per_process(WorkerPool.CPU, cores=8, concurrency=2) == 4
    assert threads_per_process(WorkerPool.CPU, cores=2, concurrency=4) == 1
