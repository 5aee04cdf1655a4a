"""`detq model inspect` and `detq model pack`: what a model file is, whether it runs here; embed metadata."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from detq.modelfile import (
    META_EXTRA_FILE,
    ULTRALYTICS_EXTRA_FILE,
    archive_kind,
    code_device_constants,
    file_sha256,
    identify_model_file,
    saved_tensor_devices,
)
from detq.vocabulary import Precision
from worker.models.loading import ModelLoadError, load_model_for_device
from worker.models.metadata import MetaOverrides, ModelMetaError, load_json_object, parse_model_meta


def inspect_model(
    path: Path,
    device: str = "cpu",
    overrides: MetaOverrides | None = None,
    precision: Precision = Precision.FP32,
    cpu_optimize: bool = False,
    micro_batch: int = 1,
    channels_last: bool = True,
    sampled_resize: bool = True,
    selected_detections: bool = True,
) -> dict[str, Any]:
    """Report on a model file: archive facts read without running it, then a real load and warm-up here."""
    report: dict[str, Any] = {
        "path": str(path),
        "sha256": file_sha256(path),
        "size_bytes": path.stat().st_size,
        "kind": identify_model_file(path).kind,
        "saved_tensor_devices": saved_tensor_devices(path),
        "baked_device_constants": code_device_constants(path),
        "device": device,
        "precision": precision.value,
        "micro_batch": micro_batch,
    }
    try:
        loaded = load_model_for_device(
            path,
            device,
            sha256=report["sha256"],
            overrides=overrides,
            precision=precision,
            cpu_optimize=cpu_optimize,
            micro_batch=micro_batch,
            channels_last=channels_last,
            sampled_resize=sampled_resize,
            selected_detections=selected_detections,
        )
    except ModelLoadError as exc:
        report.update(loads_here=False, error=str(exc))
        return report
    meta = loaded.meta
    report.update(
        loads_here=True,
        format=meta.format,
        format_source=next((n for n in loaded.notes if n.startswith("guessed")), meta.source),
        metadata_source=meta.source,
        classes=list(meta.classes),
        input_size=list(meta.input_size) if meta.input_size else None,
        letterbox=meta.letterbox,
        score_threshold=meta.score_threshold,
        iou_threshold=meta.iou_threshold,
        max_detections=meta.max_detections,
        max_batch=loaded.max_batch,
        forwards=loaded.grouping.rule.value,
        repaired_device_constants=list(loaded.repaired_devices),
        speedups=list(loaded.speedups),
        load_ms=round(loaded.load_ms, 1),
        warmup_ms=round(loaded.warmup_ms, 1),
        notes=list(loaded.notes),
    )
    return report


def format_report(report: dict[str, Any]) -> str:
    """Human-readable lines of an inspect report."""
    lines = []
    for key, value in report.items():
        shown = json.dumps(value) if isinstance(value, list | dict) else value
        lines.append(f"{key:<26} {shown}")
    return "\n".join(lines)


def pack_model(path: Path, meta_path: Path, out: Path) -> dict[str, Any]:
    """Write a TorchScript copy of `path` with `meta.json` embedded as detq.json (validated first)."""
    raw = load_json_object(meta_path, str(meta_path))
    parse_model_meta(raw)
    if archive_kind(path) != "torchscript":
        raise ModelMetaError(f"{path} is not a TorchScript archive; only TorchScript files can be packed")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
        extra: dict[str, Any] = {ULTRALYTICS_EXTRA_FILE: ""}
        module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)  # type: ignore[no-untyped-call]
        keep = {
            name: value for name, value in extra.items() if value
        }  # an exporter's config.txt travels along
        keep[META_EXTRA_FILE] = json.dumps(raw)
        torch.jit.save(module, str(out), _extra_files=keep)
    return {"path": str(out), "sha256": file_sha256(out), "meta": raw}
