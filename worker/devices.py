"""Choose each pool process's device and thread count; count GPUs without touching CUDA in this process."""

from __future__ import annotations

import subprocess

from detq.host import python_command
from detq.vocabulary import WorkerPool

_PROBE = "import torch\nprint(torch.cuda.device_count() if torch.cuda.is_available() else 0)\n"


class NoGpuError(RuntimeError):
    """A GPU pool was asked for on a host where torch sees no CUDA device."""


def probe_cuda_device_count(timeout_s: float = 120.0) -> int:
    """Count visible CUDA devices in a throwaway subprocess.

    The worker's parent process forks the pool; a CUDA context created before fork() cannot be used in
    the children ("Cannot re-initialize CUDA in forked subprocess"), so the parent never asks torch itself.
    """
    try:
        done = subprocess.run(
            python_command("-c", _PROBE), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if done.returncode != 0:
        return 0
    try:
        return int(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def default_concurrency(pool: WorkerPool, *, cores: int, gpu_count: int) -> int:
    """One process per GPU for the GPU pool; one per core for the CPU pool."""
    if pool == WorkerPool.GPU:
        if gpu_count < 1:
            raise NoGpuError(
                "detq worker --pool gpu: torch sees no CUDA device on this host "
                "(torch.cuda.is_available() is False). Run --pool cpu here, or check the driver and "
                "CUDA_VISIBLE_DEVICES."
            )
        return gpu_count
    return cores


def device_for_process(pool: WorkerPool, process_index: int, gpu_count: int) -> str:
    """cuda:<index mod GPUs> for GPU pool processes, cpu otherwise."""
    if pool == WorkerPool.GPU and gpu_count > 0:
        return f"cuda:{process_index % gpu_count}"
    return "cpu"


def threads_per_process(pool: WorkerPool, *, cores: int, concurrency: int) -> int:
    """Intra-op threads so that processes x threads = cores on the CPU pool; GPU processes need few."""
    if pool == WorkerPool.GPU:
        return max(1, min(4, cores // max(concurrency, 1)))
    return max(1, cores // max(concurrency, 1))


def decode_threads_per_process(pool: WorkerPool, *, cores: int, concurrency: int) -> int:
    """GPU processes decode on several threads to keep the GPU fed; CPU processes already fill every core."""
    if pool == WorkerPool.GPU:
        return max(1, min(8, cores // max(concurrency, 1)))
    return 1
