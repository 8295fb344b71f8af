"""Batch norm (train: batch statistics and torch's running-statistics update incl.
momentum=None; eval: running statistics), layer norm, group norm and instance norm.

Train-mode batch norm is one BatchNormalizationTraining op (torch's native_batch_norm and its
backward kernel), which also updates the running statistics the way torch does, so the
numbers are eager's bit for bit.
"""

from __future__ import annotations

import copy

import numpy as np
import torch.nn as nn
import torch.nn.functional as F

import popxl_core as popxl
from popxl_core import ops

from ..lowering import lowers
from ._common import const
from .aten_kernels import lower_torch_function, torch_call

__all__ = ["batch_norm_train", "group_norm", "layer_norm"]


def _affine(weight, bias, c: int, dtype):
    w = weight if weight is not None else const(np.ones(c), dtype)
    b = bias if bias is not None else const(np.zeros(c), dtype)
    return w, b


def batch_norm_train(
    x: popxl.Tensor,
    weight: popxl.Tensor | None,
    bias: popxl.Tensor | None,
    eps: float,
    running: tuple[popxl.Tensor, popxl.Tensor] | None = None,
    momentum: float | None = 0.1,
    num_batches: popxl.Tensor | None = None,
) -> tuple[popxl.Tensor, popxl.Tensor | None, popxl.Tensor | None]:
    """Normalise with batch statistics (torch's own kernels, forward and backward); returns
    (y, new running mean, new running var), the last two None without ``running``."""
    if x.rank < 2 or x.nelms // x.shape[1] <= 1:
        raise ValueError(
            f"batch norm in training mode needs more than 1 value per channel, "
            f"got input {tuple(x.shape)}"
        )
    if (weight is None) != (bias is None):  # the op takes both or neither
        weight, bias = _affine(weight, bias, x.shape[1], x.dtype)
    mean, var = running if running is not None else (None, None)
    return ops.batch_norm_training(x, weight, bias, mean, var, eps, momentum, num_batches)


def _update_running(ctx, m, mean, var, count: bool = True) -> None:
    """torch's update: exponential average, or the cumulative one when momentum is None.
    Batch norm counts batches in ``num_batches_tracked``; instance norm does not."""
    nbt = None
    if count and getattr(m, "num_batches_tracked", None) is not None:
        nbt = ctx.buffer("num_batches_tracked") + 1
        ctx.update_buffer("num_batches_tracked", nbt)
    if m.momentum is None and nbt is not None:
        factor = ops.div(const(1.0, mean.dtype), ops.cast(nbt, mean.dtype))
    else:
        factor = const(0.1 if m.momentum is None else float(m.momentum), mean.dtype)
    keep = const(1.0, mean.dtype) - factor
    ctx.update_buffer("running_mean", ctx.buffer("running_mean") * keep + mean * factor)
    ctx.update_buffer("running_var", ctx.buffer("running_var") * keep + var * factor)


def _bn_module(ctx, m, x):
    if x.rank < 2 or x.shape[1] != m.num_features:
        raise ValueError(
            f"{ctx.module_path}: {type(m).__name__}({m.num_features}) got input {tuple(x.shape)}"
        )
    weight = ctx.param("weight") if m.affine else None
    bias = ctx.param("bias") if m.affine else None
    if ctx.training and m.track_running_stats:
        return _bn_train_tracked(ctx, m, x, weight, bias)
    if ctx.training or m.running_mean is None:  # torch: batch statistics, none tracked
        return batch_norm_train(x, weight, bias, m.eps)[0]
    w, b = _affine(weight, bias, m.num_features, x.dtype)
    return ops.batch_norm_inference(
        x, w, b, ctx.buffer("running_mean"), ctx.buffer("running_var"), m.eps
    )


lowers(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)(_bn_module)


def _bn_train_tracked(ctx, m, x, weight, bias):
    """torch's BatchNorm in training: count the batch, normalise, update running stats."""
    nbt = None
    if getattr(m, "num_batches_tracked", None) is not None:
        nbt = ctx.buffer("num_batches_tracked") + 1
        ctx.update_buffer("num_batches_tracked", nbt)
    # torch: momentum=None averages cumulatively (factor 1/count), or not at all without a count
    momentum = m.momentum if m.momentum is not None or nbt is not None else 0.0
    running = (ctx.buffer("running_mean"), ctx.buffer("running_var"))
    y, mean, var = batch_norm_train(x, weight, bias, m.eps, running, momentum, nbt)
    ctx.update_buffer("running_mean", mean)
    ctx.update_buffer("running_var", var)
    return y


def _buffer_of(ctx, arg: int):
    """A context that updates the torch buffer passed as argument ``arg`` of the node (a
    get_attr of the model's buffer), or None when it is not one."""
    node = ctx.node.args[arg] if len(ctx.node.args) > arg else None
    if node is None or getattr(node, "op", None) != "get_attr":
        return None
    root = copy.copy(ctx)
    root.module_path = ""
    return root, node.target


@lowers(F.batch_norm)
def _batch_norm(
    ctx,
    x,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
):
    if not training:
        w, b = _affine(weight, bias, x.shape[1], x.dtype)
        return ops.batch_norm_inference(x, w, b, running_mean, running_var, eps)
    if running_mean is None:
        return batch_norm_train(x, weight, bias, eps)[0]
    targets = [_buffer_of(ctx, 1), _buffer_of(ctx, 2)]
    if None in targets:
        raise NotImplementedError(
            "F.batch_norm(training=True) updates running_mean/running_var in place; they must "
            "be buffers of the model (or use an nn.BatchNorm module)"
        )
    running = (running_mean, running_var)
    y, mean, var = batch_norm_train(x, weight, bias, eps, running, float(momentum))
    for (root, name), new in zip(targets, (mean, var)):
        root.update_buffer(name, new)
    return y


# layer / group / instance norm --------------------------------------------------------------
def layer_norm(
    x: popxl.Tensor,
    normalized_shape,
    weight: popxl.Tensor | None = None,
    bias: popxl.Tensor | None = None,
    eps: float = 1e-5,
) -> popxl.Tensor:
    """torch's layer norm over the trailing ``normalized_shape`` dims, with eager's kernels
    forward and backward (ops.native_layer_norm)."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.rank - len(shape) :]) != shape:
        raise ValueError(
            f"layer_norm: normalized_shape {shape} does not match the trailing dims "
            f"of the input {tuple(x.shape)}"
        )
    return ops.native_layer_norm(x, shape, weight, bias, eps)


@lowers(F.layer_norm)
def _layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    return layer_norm(x, normalized_shape, weight, bias, eps)


@lowers(nn.LayerNorm)
def _layer_norm_module(ctx, m, x):
    weight = ctx.param("weight") if m.elementwise_affine else None
    bias = ctx.param("bias") if m.elementwise_affine and m.bias is not None else None
    return layer_norm(x, m.normalized_shape, weight, bias, m.eps)


def group_norm(
    x: popxl.Tensor,
    num_groups: int,
    weight: popxl.Tensor | None = None,
    bias: popxl.Tensor | None = None,
    eps: float = 1e-5,
) -> popxl.Tensor:
    c = x.shape[1]
    w, b = _affine(weight, bias, c, x.dtype)
    return ops.group_norm(x, w, b, int(num_groups), eps)


# torch's native_group_norm kernel (forward and backward), bit for bit
lowers(F.group_norm)(lower_torch_function)


@lowers(nn.GroupNorm)
def _group_norm_module(ctx, m, x):
    weight = ctx.param("weight") if m.affine else None
    bias = ctx.param("bias") if m.affine else None
    return torch_call(F.group_norm, x, m.num_groups, weight, bias, m.eps)


def _instance_stats(x):
    """Per-channel batch average of the per-instance mean and unbiased variance."""
    axes = tuple(range(2, x.rank))
    n = int(np.prod(x.shape[2:]))
    xd = ops.detach(x)
    mean = ops.mean(xd, axes, keepdims=True)
    var = ops.sum((xd - mean) * (xd - mean), axes) * (1.0 / max(n - 1, 1))
    return ops.mean(ops.reshape(mean, x.shape[:2]), 0), ops.mean(var, 0)


@lowers(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def _instance_norm_module(ctx, m, x):
    r = int(type(m).__name__[-2])
    if x.rank == r + 1:  # unbatched
        return ops.squeeze(_instance_norm_module(ctx, m, ops.unsqueeze(x, 0)), 0)
    weight = ctx.param("weight") if m.affine else None
    bias = ctx.param("bias") if m.affine else None
    if m.track_running_stats and not ctx.training:
        w, b = _affine(weight, bias, x.shape[1], x.dtype)
        return _instance_with_stats(ctx, x, w, b, m.eps)
    if m.track_running_stats:
        mean, var = _instance_stats(x)
        _update_running(ctx, m, mean, var, count=False)
    return group_norm(x, x.shape[1], weight, bias, m.eps)


def _instance_with_stats(ctx, x, w, b, eps):
    return ops.batch_norm_inference(
        x, w, b, ctx.buffer("running_mean"), ctx.buffer("running_var"), eps
    )


@lowers(F.instance_norm)
def _instance_norm(
    ctx,
    x,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    use_input_stats=True,
    momentum=0.1,
    eps=1e-5,
):
    if not use_input_stats:
        w, b = _affine(weight, bias, x.shape[1], x.dtype)
        return ops.batch_norm_inference(x, w, b, running_mean, running_var, eps)
    if running_mean is not None:
        raise NotImplementedError(
            "F.instance_norm with running statistics updates tensors in "
            "place; use an nn.InstanceNorm module"
        )
    return group_norm(x, x.shape[1], weight, bias, eps)
