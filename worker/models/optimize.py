"""Freeze a TorchScript model and optimise it for CPU inference: opt-in, as its scores move by about 1e-6."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

log = logging.getLogger(__name__)


def optimized_for_cpu(module: Any, name: str) -> tuple[Any, str]:
    """(module, note): torch.jit.freeze then optimize_for_inference (weights folded into the graph,
    convolutions fused with their batch norms and activations, MKL-DNN layouts), or the module as it was
    and why not. Only TorchScript can be frozen; a torch.export program is left as it is."""
    if not isinstance(module, torch.jit.ScriptModule):
        return module, "DETQ_CPU_OPTIMIZE: not TorchScript, left as it is"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`torch.jit", category=FutureWarning)
            frozen = torch.jit.freeze(module.eval())
            return torch.jit.optimize_for_inference(frozen), "DETQ_CPU_OPTIMIZE: frozen and optimised"
    except Exception as exc:  # noqa: BLE001 - an unusual graph the passes cannot handle still runs as it was
        log.warning("detq: %s cannot be frozen for CPU inference, running it as it is: %s", name, exc)
        return module, f"DETQ_CPU_OPTIMIZE: cannot be frozen ({type(exc).__name__}), left as it is"
