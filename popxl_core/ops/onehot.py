"""OneHot: integer indices to ``values[1]`` at the index and ``values[0]`` elsewhere (ONNX)."""

from __future__ import annotations

import numpy as np
import torch

from ..tensor import Constant, Tensor, constant
from ._utils import rand, randint, spec
from .registry import OpDef, Sample, create_op, register

__all__ = ["onehot"]


def _infer(ins, axis, depth):
    t, num_classes, values = ins
    if not t.dtype.is_int:
        raise TypeError(f"onehot indices must be an integer tensor, got {t.dtype.name}")
    if num_classes.shape not in ((), (1,)):
        raise ValueError(f"onehot num_classes must be a scalar, got shape {num_classes.shape}")
    if values.shape != (2,):
        raise ValueError(
            f"onehot values must be [off_value, on_value] of shape (2,), got {values.shape}"
        )
    rank = len(t.shape) + 1
    if not -rank <= axis < rank:
        raise ValueError(f"onehot axis {axis} is out of range for an output of rank {rank}")
    a = axis % rank
    return [spec(t.shape[:a] + (depth,) + t.shape[a:], values.dtype)]


def _kernel(t, num_classes, values, axis, depth):
    # ONNX: indices in [-depth, depth) (negatives wrap); others give an all-off row.
    idx = t.long()
    idx = torch.where(idx < 0, idx + depth, idx)
    valid = (idx >= 0) & (idx < depth)
    hot = torch.nn.functional.one_hot(torch.where(valid, idx, 0), depth).bool()
    hot = (hot & valid.unsqueeze(-1)).movedim(-1, axis % (t.dim() + 1))
    return torch.where(hot, values[1], values[0])


def _grad(ctx):
    from . import concat, mul, reduce_sum, reshape, sub

    values = ctx.op.inputs[2]
    g = ctx.grad_output(0)
    mask = onehot(
        ctx.input(0), ctx.input(1), constant(np.array([0, 1]), values.dtype), ctx.attrs["axis"]
    )
    on = reduce_sum(mul(g, mask))
    off = sub(reduce_sum(g), on)
    return [None, None, concat([reshape(off, (1,)), reshape(on, (1,))])]


def _reference(depth, axis):
    def ref(t, v):
        idx = torch.where(t < 0, t + depth, t).long()
        hot = torch.nn.functional.one_hot(idx, depth).bool().movedim(-1, axis)
        return torch.where(hot, v[1], v[0])

    return ref


def _samples():
    vals = rand(2, seed=7)
    return [
        Sample(
            [randint(2, 3, high=5, seed=1), vals],
            lambda t, v: onehot(t, constant(5), v, -1),
            _reference(5, -1),
        ),
        Sample(
            [np.array([3, -1, 0, 2], np.int32), vals],
            lambda t, v: onehot(t, constant(4), v, 0),
            _reference(4, 0),
            name="axis0",
        ),
    ]


ONEHOT = register(
    OpDef("OneHot", _infer, _kernel, grad=_grad, samples=_samples, out_name="onehot_out")
)


def onehot(t: Tensor, num_classes: Tensor, values: Tensor, axis: int) -> Tensor:
    """One-hot encode ``t`` along ``axis`` with ``num_classes`` classes; ``values=[off, on]``.

    ``num_classes`` must be a constant tensor (its value fixes the output shape).
    """
    if not isinstance(num_classes, Tensor):
        num_classes = constant(int(num_classes))
    if not isinstance(num_classes, Constant):
        raise TypeError(
            f"onehot num_classes must be a popxl.constant (it fixes the output "
            f"shape), got {num_classes!r}"
        )
    depth = int(np.asarray(num_classes._data).reshape(-1)[0])
    return create_op(ONEHOT, [t, num_classes, values], {"axis": int(axis), "depth": depth})[0]
