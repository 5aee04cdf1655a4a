"""Rewrite device constants baked into TorchScript graphs (a model traced on cuda:0) to this device."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


def _device_constant_node(device: torch.device) -> Any:
    """A prim::Constant node holding `device`, from a tiny traced graph (as OpenAI's CLIP loader does)."""
    holder = torch.jit.trace(lambda: torch.ones([]).to(device), example_inputs=[])  # type: ignore[no-untyped-call]
    nodes = [n for n in holder.graph.findAllNodes("prim::Constant") if "Device" in repr(n.output().type())]
    if not nodes:  # pragma: no cover - depends on torch's tracer output
        raise RuntimeError(f"could not build a device constant for {device}")
    return nodes[-1]


def _graphs(module: Any) -> list[Any]:
    graphs = []
    for name in module._c._method_names():
        try:
            graphs.append(module._c._get_method(name).graph)
        except RuntimeError:  # pragma: no cover - methods without a graph
            continue
    return graphs


def rewrite_device_constants(module: Any, device: torch.device) -> list[str]:
    """Point every device constant in every method graph of every submodule at `device`, before a forward.

    Returns what was rewritten, e.g. ["forward: cuda:0 -> cpu"]; nothing for models that create tensors with
    `device=x.device` (the device-agnostic way), or when the constants already name `device`.
    """
    if not hasattr(module, "_c"):
        return []
    target = str(device)
    replacement = None
    changed: list[str] = []
    for name, sub in module.named_modules():
        if not hasattr(sub, "_c"):
            continue
        for graph in _graphs(sub):
            for node in graph.findAllNodes("prim::Constant"):
                if "Device" not in repr(node.output().type()) or "value" not in node.attributeNames():
                    continue
                value = str(node.s("value")) if node.kindOf("value") == "s" else str(node["value"])
                if value == target:
                    continue
                if replacement is None:
                    replacement = _device_constant_node(device)
                node.copyAttributes(replacement)
                changed.append(f"{name or 'model'}: {value} -> {target}")
    return changed
