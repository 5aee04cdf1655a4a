"""Load a model file once per process onto that process's device, with map_location, and warm it up."""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from detq.modelfile import META_EXTRA_FILE, file_sha256
from worker.adapters import ModelOutputError, parse_torchvision_output
from worker.metadata import ModelMeta, ModelMetaError, parse_model_meta

log = logging.getLogger(__name__)

WARMUP_SIZE = (320, 320)


class ModelLoadError(RuntimeError):
    """The model could not be loaded or failed its warm-up on this device."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference on one device."""

    module: Any
    meta: ModelMeta
    device: torch.device
    path: Path
    sha256: str
    load_ms: float
    warmup_ms: float


def _read_meta(extra: dict[str, Any]) -> ModelMeta:
    import json

    text = extra.get(META_EXTRA_FILE) or ""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if not text:
        return ModelMeta()
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ModelMetaError(f"{META_EXTRA_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelMetaError(f"{META_EXTRA_FILE} must hold a JSON object")
    return parse_model_meta(raw)


def load_model_for_device(path: Path, device: str, *, sha256: str | None = None) -> LoadedModel:
    """torch.jit.load with map_location=device, then one warm-up forward on a dummy image."""
    import torchvision  # noqa: F401 - registers torchvision::nms and friends used by scripted detectors

    target = torch.device(device)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    digest = sha256 or file_sha256(path)
    started = time.perf_counter()
    extra: dict[str, Any] = {META_EXTRA_FILE: ""}
    try:
        # map_location: tensors saved on cuda:N are remapped to this process's device. Without it a
        # GPU-saved file fails on a CPU host ("Could not run 'aten::empty_strided' ... 'CUDA' backend").
        with warnings.catch_warnings():
            # torch 2.14 marks TorchScript deprecated; loading users' existing TorchScript files is the job.
            warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
            module = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location=target, _extra_files=extra
            )
    except Exception as exc:
        raise ModelLoadError(f"cannot load {path} as TorchScript on {target}: {exc}") from exc
    module.eval()
    try:
        meta = _read_meta(extra)
    except ModelMetaError as exc:
        raise ModelLoadError(f"bad metadata in {path}: {exc}") from exc
    load_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    height, width = meta.input_size or WARMUP_SIZE
    try:
        with torch.inference_mode():
            dummy = [torch.zeros(3, height, width, device=target)]
            parse_torchvision_output(module(dummy), expected=1)
        if target.type == "cuda":
            torch.cuda.synchronize(target)
    except ModelOutputError as exc:
        raise ModelLoadError(f"{path} loaded but its output breaks the model contract: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(
            f"{path} loaded but its warm-up forward on {target} failed: {exc}. If the model was traced on a "
            "GPU it may carry a device constant in its graph; re-export it with device-agnostic code."
        ) from exc
    warmup_ms = (time.perf_counter() - started) * 1000
    log.info(
        "detq: loaded model %s (%s) on %s in %.0f ms, warm-up %.0f ms",
        path.name,
        digest[:12],
        target,
        load_ms,
        warmup_ms,
    )
    return LoadedModel(
        module=module,
        meta=meta,
        device=target,
        path=path,
        sha256=digest,
        load_ms=load_ms,
        warmup_ms=warmup_ms,
    )
