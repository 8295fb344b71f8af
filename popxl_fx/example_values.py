"""The capture's example values, made weightless once a program is built.

Capturing runs the example inputs through the model and records each node's value in
``node.meta["example_value"]`` (`popxl_fx.capture`): one forward's activations, 0.1 GiB for a
12 x 768 GPT at batch 2 x 64. Lowering reads the values; after it, what is still read of
them (the in-place checks of PopTorch's executor, a ``getitem`` on a tensor or not) is only
"is it a tensor" and its shape, strides, dtype and ``requires_grad``. So `forget_examples`
replaces every example tensor by a meta tensor with those fields (`meta_twin`): a built
trainer or inference model keeps no activations of its first call alive.

A program is built once per signature, each from a capture of its own (`Module.capture`
caches per `Module`, and every build makes its `Module`), so no later build reads the
values forgotten here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from .capture import Captured
from .outline import OutlinePlan

__all__ = ["forget_examples", "meta_twin"]


def _forgettable(t: torch.Tensor) -> bool:
    # tensor subclasses (fake tensors hold no data anyway) and quantized or sparse layouts
    # are kept: a meta twin could not say what they are
    plain = type(t) in (torch.Tensor, nn.Parameter) and t.device.type != "meta"
    return plain and t.layout == torch.strided and not t.is_quantized


def meta_twin(t: torch.Tensor) -> torch.Tensor:
    """A data-less tensor with ``t``'s shape, strides, storage offset, dtype and
    ``requires_grad`` (an `nn.Parameter` stays one); ``t`` itself where it cannot be one.

    Example: ``meta_twin(torch.ones(2, 3)).device.type == "meta"``."""
    if not _forgettable(t):
        return t
    elements = t.untyped_storage().nbytes() // t.element_size()
    storage = torch.empty(elements, dtype=t.dtype, device="meta")
    twin = storage.as_strided(t.shape, t.stride(), t.storage_offset())
    if isinstance(t, nn.Parameter):
        return nn.Parameter(twin, requires_grad=t.requires_grad)
    return twin.requires_grad_(t.requires_grad)


def _forget_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return meta_twin(value)
    return pytree.tree_map_only(torch.Tensor, meta_twin, value)


# meta entries that hold no tensor: names, source lines, fx's module stack, the module state a
# replay compares (ids, shapes, dtypes). Walking them took 80 % of the time forgetting took.
_NO_TENSORS = frozenset(
    {"module_path", "source", "stack_trace", "nn_module_stack", "module_state", "data_dependent"}
)


def _forget_graph(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        for key, value in node.meta.items():
            if key not in _NO_TENSORS:
                node.meta[key] = _forget_value(value)


def _forget_plan(plan: OutlinePlan) -> None:
    _forget_graph(plan.gm)
    for group in plan.groups:
        # the block's `Module` (made by the lowering) has its own captures and plans
        forget_examples(group.captured, *([group.builder] if group.builder else []))


def forget_examples(*held: Any) -> None:
    """Make the example tensors ``held`` keeps meta tensors (`meta_twin`): a `Captured`'s
    graph and example inputs, an `OutlinePlan`'s graph and groups, a graph module's nodes,
    a `popxl_fx.Module`'s captures and plans (its ``forget_examples``). The graph modules
    are the builds' own: a user's model is never changed."""
    for item in held:
        if isinstance(item, Captured):
            _forget_graph(item.gm)
            item.example_inputs = _forget_value(item.example_inputs)
        elif isinstance(item, OutlinePlan):
            _forget_plan(item)
        elif isinstance(item, fx.GraphModule):
            _forget_graph(item)
        elif hasattr(item, "forget_examples"):
            item.forget_examples()
        else:
            raise TypeError(f"forget_examples: {type(item).__name__} holds no capture")
