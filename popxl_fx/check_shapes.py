"""Whether a captured graph's shapes provably do not depend on the input data.

`check` runs the traced graph once more on other data of the example's shapes and reports the
first node whose shape changes (`check._rerun_with_other_data`). A node's shape can change so
only through an op that computes its output size from tensor values (``nonzero``,
``masked_select``, ``unique``, ``repeat_interleave`` with a tensor, a tensor used as an index,
``bincount``, a size read from a tensor): the graph's Python values (sizes, dims, slices) are
constants, since shapes fold while tracing (`capture`).

When every call in the graph is one of the ops below, whose output shapes are a function of
their inputs' shapes and their constant arguments, every node has the example's shape on any
data of the example's shapes: the rerun could only find no change (or fail, which is no
verdict either), so `check` skips it. Anything else (an op not listed, a Python value the graph
computes fed to a call, a tensor as an index or a size) runs it as before. The tables are
allow-lists: an op missing from them costs the rerun's time, never a finding.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

__all__ = ["shapes_static"]

# Functions whose output shape follows from their tensor arguments' shapes (elementwise with
# broadcasting, matmul, losses, attention, normalisation): tensor arguments may be any data.
_OF_TENSOR_SHAPES = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.neg,
        operator.matmul,
        torch.add,
        torch.mul,
        torch.matmul,
        torch.relu,
        torch.tanh,
        torch.sigmoid,
        torch.ones_like,
        torch.zeros_like,
        F.relu,
        F.gelu,
        F.linear,
        F.layer_norm,
        F.softmax,
        F.dropout,
        F.cross_entropy,
        F.nll_loss,
        F.mse_loss,
        F.l1_loss,
        F.smooth_l1_loss,
        F.huber_loss,
        F.kl_div,
        F.binary_cross_entropy,
        F.binary_cross_entropy_with_logits,
        F.scaled_dot_product_attention,
    }
)
_METHODS_OF_TENSOR_SHAPES = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "gt",
        "relu",
        "tanh",
        "sigmoid",
        "softmax",
        "log_softmax",
        "float",
        "to",
    }
)
# Ops whose output shape follows from their first argument's shape and constant arguments:
# any other tensor argument (an index, a size) may carry data into the shape, so none may come.
_OF_FIRST_SHAPE = frozenset({operator.getitem, torch.flatten})
_METHODS_OF_FIRST_SHAPE = frozenset(
    {
        "view",
        "reshape",
        "transpose",
        "permute",
        "expand",
        "split",
        "chunk",
        "flatten",
        "unsqueeze",
        "squeeze",
        "contiguous",
        "mean",
        "sum",
    }
)
# Standard layers (exact classes: a leaf is a torch.nn class, `capture.is_leaf`) whose output
# shape follows from their input shapes and configuration.
_LAYERS = frozenset(
    {
        nn.Linear,
        nn.Conv1d,
        nn.Conv2d,
        nn.LayerNorm,
        nn.BatchNorm1d,
        nn.BatchNorm2d,
        nn.Embedding,
        nn.Dropout,
        nn.ReLU,
        nn.GELU,
        nn.Tanh,
        nn.Sigmoid,
        nn.Softmax,
        nn.LogSoftmax,
        nn.Identity,
        nn.Flatten,
        nn.MaxPool2d,
        nn.AvgPool2d,
        nn.AdaptiveAvgPool2d,
        nn.MSELoss,
        nn.L1Loss,
        nn.SmoothL1Loss,
        nn.HuberLoss,
        nn.KLDivLoss,
        nn.NLLLoss,
        nn.BCELoss,
        nn.BCEWithLogitsLoss,
        nn.CrossEntropyLoss,
    }
)


def _holds_tensors(node: fx.Node) -> bool:
    """A node whose value is a tensor or a tuple/list of them (not a Python number the graph
    computed, which could be read from the data)."""
    value = node.meta.get("example_value")
    if isinstance(value, (tuple, list)):
        return bool(value) and all(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


def _of_tensor_shapes(node: fx.Node) -> bool:
    return all(_holds_tensors(n) for n in node.all_input_nodes)


def _of_first_shape(node: fx.Node) -> bool:
    first = node.args[0] if node.args else None
    others = [n for n in node.all_input_nodes if n is not first]
    return isinstance(first, fx.Node) and _holds_tensors(first) and not others


def _listed(target: Any, table: frozenset) -> bool:
    try:
        return target in table
    except TypeError:  # an unhashable callable: in no table
        return False


def _static(node: fx.Node, model: nn.Module) -> bool:
    if node.op in ("placeholder", "get_attr", "output"):
        return True
    if node.op == "call_module":
        return type(model.get_submodule(node.target)) in _LAYERS and _of_tensor_shapes(node)
    functions = node.op == "call_function"
    if _listed(node.target, _OF_TENSOR_SHAPES if functions else _METHODS_OF_TENSOR_SHAPES):
        return _of_tensor_shapes(node)
    if node.target is torch.rand:  # sizes only, all constants
        return not node.all_input_nodes
    if _listed(node.target, _OF_FIRST_SHAPE if functions else _METHODS_OF_FIRST_SHAPE):
        return _of_first_shape(node)
    return False


def shapes_static(gm: fx.GraphModule, model: nn.Module) -> bool:
    """Whether every node of ``gm`` (captured from ``model``) has a shape independent of the
    input data (the module docstring): then running it on other data finds nothing."""
    return all(_static(node, model) for node in gm.graph.nodes)
