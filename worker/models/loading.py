"""Load a model file once per process onto that process's device, settle its format, and warm it up."""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from detq.modelfile import (
    META_EXTRA_FILE,
    ULTRALYTICS_EXTRA_FILE,
    archive_kind,
    file_sha256,
    identify_model_file,
)
from detq.vocabulary import ModelFormat, Precision
from worker.models.batching import ONE_AT_A_TIME, Grouping, Rule, choose_grouping
from worker.models.devicefix import rewrite_device_constants
from worker.models.formats import FormatAdapter, TorchvisionAdapter, adapter_for
from worker.models.introspect import torchvision_fixed_size, torchvision_input_size
from worker.models.layout import CHANNELS_LAST_KEPT, channels_last_where_exact, probe_forwards
from worker.models.metadata import MetaOverrides, ModelMeta, ModelMetaError, parse_model_meta, read_sidecar
from worker.models.optimize import faster_of, optimized_for_cpu
from worker.models.outputs import ModelOutputError, parse_torchvision_output
from worker.models.precision import cpu_runs_it_natively, with_precision
from worker.models.sampled_resize import take_over
from worker.models.ssd_postprocess import SelectedSsd, select_detections
from worker.models.ultralytics import parse_ultralytics_config
from worker.models.verify import RewriteCheck, declining, exercised_count
from worker.models.warm_up import TORCHVISION_PROBE_SIZE, warm_up, warm_up_and_probe_batch
from worker.models.yolo import guess_layout, yolo_tensor

log = logging.getLogger(__name__)

REEXPORT_HINT = (
    "Re-export it device-agnostic: create tensors with device=x.device instead of a fixed device, trace or "
    "export on the CPU, or use torch.export and let detq move the program with move_to_device_pass."
)


class ModelLoadError(RuntimeError):
    """The model could not be loaded or failed its warm-up on this device."""


def _why(error: Exception) -> str:
    """Why a model file did not load, for a log line and each image's reason: an operator this torch
    lacks in one line with what to do (TorchScript's excerpt of the code stays on the error's __cause__),
    else the error's text."""
    text = str(error).strip() or type(error).__name__
    first = text.splitlines()[0]
    if not first.startswith("Unknown builtin op"):
        return text
    return (
        f"{first} (this worker runs torch {torch.__version__}: a model scripted with a newer torch can call "
        "operators an older one lacks; script it with the oldest torch the workers run, docs/models.md)"
    )


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference on one device, with the adapter of its output format."""

    module: Any
    meta: ModelMeta
    adapter: FormatAdapter
    device: torch.device
    path: Path
    sha256: str
    kind: str
    load_ms: float
    warmup_ms: float
    max_batch: int | None = None
    repaired_devices: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    # Which images may share a forward (worker.models.batching); one at a time unless load chose.
    grouping: Grouping = ONE_AT_A_TIME
    # The rewrites made at load, checked again on this process's first real forwards (None: none made).
    rewrite_check: RewriteCheck | None = None
    # The speed-ups (detq.speedups) this load applied, by name; `detq model inspect` lists them.
    speedups: tuple[str, ...] = ()

    @property
    def decode_target(self) -> tuple[int, int] | None:
        """(height, width) the decoder may reduce JPEGs toward."""
        if self.meta.fixed_input:
            return self.meta.fixed_input_size()
        return self.meta.input_size


def _quiet_jit_load(path: Path, device: torch.device, extra: dict[str, Any]) -> Any:
    with warnings.catch_warnings():
        # torch 2.14 marks TorchScript deprecated; loading users' existing TorchScript files is the job.
        warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
        # map_location: tensors saved on cuda:N are remapped to this process's device. Without it a
        # GPU-saved file fails on a CPU host ("Could not run 'aten::empty_strided' ... 'CUDA' backend").
        return torch.jit.load(str(path), map_location=device, _extra_files=extra)  # type: ignore[no-untyped-call]


def _load_exported(path: Path, device: torch.device, extra: dict[str, Any]) -> Any:
    from torch.export.passes import move_to_device_pass

    program = torch.export.load(str(path), extra_files=extra)
    # An exported program fixes its device at export time and has no map_location; this pass rewrites it.
    return move_to_device_pass(program, device).module()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value or "")


def resolve_meta(path: Path, extra: dict[str, Any], overrides: MetaOverrides) -> ModelMeta:
    """detq.json in the file, else Ultralytics' config.txt, else a sidecar JSON; then overrides."""
    try:
        meta = ModelMeta()
        detq_text = _text(extra.get(META_EXTRA_FILE))
        ultra_text = _text(extra.get(ULTRALYTICS_EXTRA_FILE))
        if detq_text:
            raw = json.loads(detq_text)
            if not isinstance(raw, dict):
                raise ModelMetaError(f"{META_EXTRA_FILE} must hold a JSON object")
            meta = parse_model_meta(raw, source=f"{META_EXTRA_FILE} in the model file")
        elif ultra_text:
            meta = parse_model_meta(parse_ultralytics_config(ultra_text), source="Ultralytics config.txt")
        else:
            sidecar = read_sidecar(path)
            if sidecar is not None:
                meta = parse_model_meta(sidecar[0], source=sidecar[1])
        return overrides.apply(meta)
    except ValueError as exc:  # ModelMetaError, JSON errors, unsupported Ultralytics task
        raise ModelLoadError(f"bad metadata for {path.name}: {exc}") from exc


def _guess_format(module: Any, meta: ModelMeta, device: torch.device) -> tuple[ModelMeta, str]:
    """No format in the metadata: try the torchvision contract, then a fixed-size batch; read the output."""
    height, width = meta.input_size or TORCHVISION_PROBE_SIZE
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # A warning is no verdict on the contract (scripted SSD warns on every call), even where
            # warnings are errors.
            warnings.simplefilter("ignore")
            parse_torchvision_output(module([torch.zeros(3, height, width, device=device)]), expected=1)
        return meta.with_format(ModelFormat.TORCHVISION), "guessed torchvision from its list-of-dicts output"
    except Exception:  # noqa: BLE001 - not a torchvision-style model; try a fixed-size batch next
        pass
    fixed_h, fixed_w = meta.fixed_input_size()
    with torch.inference_mode():
        output = module(torch.zeros(1, 3, fixed_h, fixed_w, device=device))
    pred = yolo_tensor(output)
    fmt, warning = guess_layout(tuple(pred.shape), len(meta.classes) or None)
    note = f"guessed {fmt} from its output shape {tuple(pred.shape)}"
    if warning:
        note += f" ({warning})"
    return meta.with_format(fmt), note


def load_model_for_device(
    path: Path,
    device: str,
    *,
    sha256: str | None = None,
    overrides: MetaOverrides | None = None,
    cpu_optimize: bool = False,
    precision: Precision = Precision.FP32,
    micro_batch: int = 1,
    channels_last: bool = True,
    sampled_resize: bool = True,
    selected_detections: bool = True,
) -> LoadedModel:
    """Load with the device remapped, repair baked device constants, settle the format, warm up once at
    micro_batch images;
    with cpu_optimize on a CPU, freeze and optimise the graph after its format is settled; at a reduced
    precision, wrap it to run under autocast, taking and giving float32; on a CPU at fp32, with
    sampled_resize, a fixed-size torchvision detector's input made ahead as its transform would
    (worker.models.sampled_resize), with selected_detections, an SSD's detections chosen from only the
    candidates that can reach them (worker.models.ssd_postprocess), and with channels_last, convolution
    weights in channels_last, each where the outputs stay the same (worker.models.layout); whichever of
    those it makes are checked again on real forwards (rewrite_check, worker.models.verify)."""
    import torchvision  # noqa: F401 - registers torchvision::nms and friends used by scripted detectors

    target = torch.device(device)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}")
    digest = sha256 or file_sha256(path)
    kind = archive_kind(path)
    if kind == "unknown":  # a state_dict, a pickled module, an Ultralytics checkpoint...: say which, and how
        raise ModelLoadError(identify_model_file(path).refusal(str(path)))
    started = time.perf_counter()
    extra: dict[str, Any] = {META_EXTRA_FILE: "", ULTRALYTICS_EXTRA_FILE: ""}
    repaired: list[str] = []
    try:
        if kind == "export":
            module = _load_exported(path, target, extra)
        else:
            module = _quiet_jit_load(path, target, extra)
            module.eval()
            repaired = rewrite_device_constants(module, target)
    except Exception as exc:
        what = "torch.export program" if kind == "export" else "TorchScript"
        raise ModelLoadError(f"cannot load {path} as {what} on {target}: {_why(exc)}") from exc
    if repaired:
        log.warning("detq: %s had device constants baked into its graph; rewrote %s", path.name, repaired)
    meta = resolve_meta(path, extra, overrides or MetaOverrides())
    load_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    notes: list[str] = []
    rewrites: list[str] = []  # the exact rewrites, checked again on real forwards
    applied: list[str] = []  # and the other speed-ups
    needs_exercise = False
    try:
        if meta.format is None:
            meta, note = _guess_format(module, meta, target)
            notes.append(note)
            log.warning("detq: %s has no format in its metadata: %s", path.name, note)
        if meta.fixed_input:
            meta = meta.with_yolo_defaults()
        elif meta.input_size is None and (size := torchvision_input_size(module)) is not None:
            # Read from the model's own transform: the target of DETQ_FAST_DECODE's reduced decode.
            meta = meta.model_copy(update={"input_size": size})
            notes.append(f"input size {size[0]}x{size[1]} read from the model's transform")
        adapter = adapter_for(meta)
        exact_cpu = target.type == "cpu" and precision is Precision.FP32
        if sampled_resize and exact_cpu and kind != "export" and isinstance(adapter, TorchvisionAdapter):
            resize, note = take_over(module, path.name)  # before a freeze makes its mean and std constants
            adapter = TorchvisionAdapter(resize=resize)
            notes.extend([note] if note else [])
            rewrites.extend(["sampled resize"] if resize is not None else [])
        if selected_detections and exact_cpu and kind != "export" and isinstance(adapter, TorchvisionAdapter):
            module, note = select_detections(module, path.name)  # before a freeze drops its postprocess
            notes.extend([note] if note else [])
            if isinstance(module, SelectedSsd):
                rewrites.append("selected detections")
                needs_exercise = module.chosen_here == 0
        if precision is not Precision.FP32:  # the format is settled at fp32; the warm-up runs at precision
            module = with_precision(module, precision, target)
            if cpu_optimize and target.type == "cpu":
                notes.append(f"DETQ_CPU_OPTIMIZE: not with DETQ_PRECISION={precision}, left as it is")
        elif cpu_optimize and target.type == "cpu":
            optimized, note = optimized_for_cpu(module, path.name)
            notes.append(note)
            kept, verdict = faster_of(
                module, optimized, lambda m: warm_up(m, adapter, meta, target, count=1), path.name
            )
            notes.extend([verdict] if verdict else [])
            applied.extend(["frozen graph"] if kept is not module else [])
            module = kept
        max_batch = warm_up_and_probe_batch(module, adapter, meta, target, micro_batch)
        # Only where every forward has the probes' shapes (a fixed input): a layout exact at one shape
        # is not known to be at another, as the convolutions oneDNN picks depend on the shapes.
        fixed_shape = meta.fixed_input or torchvision_fixed_size(module) is not None
        if channels_last and fixed_shape and exact_cpu:
            size = meta.fixed_input_size() if meta.fixed_input else TORCHVISION_PROBE_SIZE
            counts = sorted({1, max(1, min(micro_batch, max_batch or micro_batch))})
            note = channels_last_where_exact(module, probe_forwards(adapter, size, target, counts), path.name)
            notes.extend([note] if note else [])
            rewrites.extend(["channels_last"] if note.startswith(CHANNELS_LAST_KEPT) else [])
        # Last, on the model as it will run: which images may share a forward.
        grouping = choose_grouping(module, adapter, target, micro_batch, max_batch)
        notes.append(grouping.note)
        shared = micro_batch > 1 and grouping.rule is not Rule.ONE
        applied.extend([f"micro-batches ({grouping.rule})"] if shared else [])
        if target.type == "cuda":
            torch.cuda.synchronize(target)
    except ModelOutputError as exc:
        raise ModelLoadError(
            f"{path} loaded but its output breaks the {meta.format} contract: {exc}"
        ) from exc
    except Exception as exc:
        raise ModelLoadError(
            f"{path} loaded but its warm-up forward on {target} failed: {exc}. "
            + (f"Rewrote device constants {repaired}. " if repaired else "")
            + (
                f"It may not run at DETQ_PRECISION={precision}: try DETQ_PRECISION=fp32. "
                if precision is not Precision.FP32
                else ""
            )
            + REEXPORT_HINT
        ) from exc
    warmup_ms = (time.perf_counter() - started) * 1000
    speedups = (*rewrites, *applied)
    if target.type == "cpu" and not cpu_runs_it_natively(precision):
        notes.append(f"DETQ_PRECISION={precision}: this CPU has no {precision} units, so it runs emulated")
        log.warning("detq: %s, much slower than fp32", notes[-1])
    log.info(
        "detq: loaded model %s (%s, %s, format %s from %s) on %s at %s in %.0f ms, warm-up %.0f ms; %s;"
        " speed-ups: %s",
        path.name,
        digest[:12],
        kind,
        meta.format,
        meta.source,
        target,
        precision,
        load_ms,
        warmup_ms,
        grouping.note,
        ", ".join(speedups) or "none",
    )
    return LoadedModel(
        module=module,
        meta=meta,
        adapter=adapter,
        device=target,
        path=path,
        sha256=digest,
        kind=kind,
        load_ms=load_ms,
        warmup_ms=warmup_ms,
        max_batch=max_batch,
        repaired_devices=tuple(repaired),
        notes=tuple(notes),
        grouping=grouping,
        speedups=speedups,
        rewrite_check=None
        if not rewrites
        else RewriteCheck(
            name=path.name,
            rewrites=tuple(rewrites),
            load_as_saved=partial(
                load_as_saved,
                path,
                device,
                sha256=digest,
                overrides=overrides,
                cpu_optimize=cpu_optimize,
                precision=precision,
                micro_batch=micro_batch,
            ),
            needs_exercise=needs_exercise,
            exercised_by=exercised_count(module),
            decline=declining(module),
        ),
    )


def load_as_saved(path: Path, device: str, **options: Any) -> LoadedModel:
    """The model as its file has it: none of detq's rewrites (channels_last, the sampled resize, the
    selected detections); options as load_model_for_device takes them (cpu_optimize, precision...)."""
    return load_model_for_device(
        path, device, channels_last=False, sampled_resize=False, selected_detections=False, **options
    )
