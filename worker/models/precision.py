"""Reduced precision, opt-in (DETQ_PRECISION): the model under autocast at fp16 or bf16, float32 out."""

from __future__ import annotations

from typing import Any

import torch

from detq.vocabulary import Precision

DTYPES = {
    Precision.FP32: torch.float32,
    Precision.FP16: torch.float16,
    Precision.BF16: torch.bfloat16,
}


def cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """Every floating tensor in value (a tensor, or lists, tuples and dicts of them) as dtype; the rest
    (labels, indices, strings) as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, dict):
        return {key: cast_floats(item, dtype) for key, item in value.items()}
    if isinstance(value, list):
        return [cast_floats(item, dtype) for item in value]
    if isinstance(value, tuple):
        return tuple(cast_floats(item, dtype) for item in value)
    return value


class ReducedPrecision:
    """A model run under torch.autocast at dtype: called like the model, with float32 in and out.

    Autocast runs each operation that gains from it (convolutions, matrix products) at dtype and keeps
    the rest (reductions, NMS, box arithmetic) in float32, so it takes models that build float32 tensors
    of their own, which casting their weights would break. The outputs come back as float32 before detq
    reads boxes and scores, so thresholds and rows see what they always do. docs/models.md has the
    measured effect on boxes and scores.
    """

    def __init__(self, module: Any, dtype: torch.dtype, device: torch.device) -> None:
        self.module = module
        self.dtype = dtype
        self.device_type = device.type

    def __call__(self, inputs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            output = self.module(inputs)
        return cast_floats(output, torch.float32)


def cpu_runs_it_natively(precision: Precision) -> bool:
    """Whether this CPU has units for precision (AVX512-BF16 or AMX for bf16, AVX512-FP16 or AMX for
    fp16); without them autocast emulates it, far slower than fp32."""
    if precision is Precision.FP32:
        return True
    mkldnn = torch.ops.mkldnn
    supported = (
        mkldnn._is_mkldnn_bf16_supported()
        if precision is Precision.BF16
        else mkldnn._is_mkldnn_fp16_supported()
    )
    return bool(supported)


def with_precision(module: Any, precision: Precision, device: torch.device) -> Any:
    """The module as it is for fp32, else wrapped to run under autocast at fp16 or bf16."""
    if precision is Precision.FP32:
        return module
    return ReducedPrecision(module, DTYPES[precision], device)
