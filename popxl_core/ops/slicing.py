"""Slicing ops: slice, subsample and their gradients; dynamic_slice and dynamic_update live in
dynamic_slice.py and are re-exported here.

Static slices follow numpy/ONNX semantics: negative indices count from the end, bounds are
clamped, negative steps walk backwards. A positive-step slice is a torch view (``view=True``);
a negative step needs a flipped copy, so ``SliceInplace`` aliases its input only for
positive steps.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import rand, spec
from .dynamic_slice import dynamic_slice, dynamic_update, dynamic_update_
from .forms import fold_axis
from .registry import OpDef, Sample, copy_cost, create_op, no_cost, register

__all__ = [
    "dynamic_slice",
    "dynamic_update",
    "dynamic_update_",
    "slice",
    "slice_",
    "slice_grad",
    "subsample",
]

IntOrList = None | int | Sequence[int | None]
Axes = None | int | Sequence[int]  # the axes a slice applies to (None: the first ones)


# Static slice ------------------------------------------------------------------------------
def _ranges(shape, axes, starts, stops, steps) -> list[tuple[int, int, int, int]]:
    """Per sliced axis: (axis, first index, step, count), numpy clamping rules."""
    out = []
    for a, s, e, st in zip(axes, starts, stops, steps):
        if st == 0:
            raise ValueError(f"slice step of axis {a} must not be 0")
        first, stop, step = builtins.slice(s, e, st).indices(shape[a])
        out.append((a, first, step, len(range(first, stop, step))))
    return out


def _torch_index(shape, axes, starts, stops, steps):
    """A basic torch index and the axes to flip first (torch slices need positive steps)."""
    idx: list[builtins.slice] = [builtins.slice(None)] * len(shape)
    flips = []
    for a, first, step, count in _ranges(shape, axes, starts, stops, steps):
        if step < 0:
            flips.append(a)
            first, step = shape[a] - 1 - first, -step
        stop = first + (count - 1) * step + 1 if count else first
        idx[a] = builtins.slice(first, stop, step)
    return tuple(idx), flips


def _slice_infer(ins, axes, starts, stops, steps):
    shape = list(ins[0].shape)
    for a in axes:
        if not 0 <= a < len(shape):
            raise ValueError(f"slice axis {a} is out of range for shape {ins[0].shape}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"slice axes {list(axes)} repeat an axis")
    for a, _, _, count in _ranges(shape, axes, starts, stops, steps):
        shape[a] = count
    return [spec(shape, ins[0].dtype)]


def _slice_kernel(x, axes, starts, stops, steps):
    idx, flips = _torch_index(x.shape, axes, starts, stops, steps)
    return (x.flip(flips) if flips else x)[idx]


def _slice_grad(ctx):
    return [slice_grad(ctx.grad_output(0), ctx.op.inputs[0].shape, **ctx.attrs)]


def _slice_samples(fn, with_getitem: bool = False):
    def samples():
        return [
            Sample([rand(5, 4)], lambda x: fn(x, 1, 4), lambda x: x[1:4]),
            Sample(
                [rand(5, 4, seed=1)],
                lambda x: fn(x, [-3, 0], [100, 3], axis=[0, 1]),
                lambda x: x[-3:, :3],
                name="multi_clamp",
            ),
            Sample(
                [rand(5, 6, seed=2)],
                lambda x: fn(x, None, None, 2, axis=1),
                lambda x: x[:, ::2],
                name="step",
            ),
            Sample(
                [rand(5, 6, seed=3)],
                lambda x: fn(x, [4], [0], [-1], axis=[0]),
                lambda x: x[1:5].flip(0),
                name="negative_step",
            ),
        ]

    def getitem_samples():
        # Tensor.__getitem__ builds Slice (+ Subsample, Reshape); checked against torch.
        return samples() + [
            Sample([rand(5, 4, seed=8)], lambda x: x[1:3, 0], lambda x: x[1:3, 0], name="getitem"),
            Sample(
                [rand(2, 3, 4, seed=9)],
                lambda x: x[..., None, -1],
                lambda x: x[..., None, -1],
                name="getitem_ellipsis_none",
            ),
            Sample(
                [rand(5, 4, seed=10)], lambda x: x[-1], lambda x: x[-1], name="getitem_negative_int"
            ),
        ]

    return getitem_samples if with_getitem else samples


SLICE = register(
    OpDef(
        "Slice",
        _slice_infer,
        _slice_kernel,
        grad=_slice_grad,
        cost=copy_cost,
        view=True,
        samples=_slice_samples(lambda *a, **k: slice(*a, **k), True),
        out_name="slice_out",
        fp16_in_fp32=False,
    )
)
declare(SLICE, replica_fold=fold_axis("axes"))
SLICE_INPLACE = register(
    OpDef(
        "SliceInplace",
        _slice_infer,
        _slice_kernel,
        grad=_slice_grad,
        cost=no_cost,
        inplace=(0,),
        samples=_slice_samples(lambda x, *a, **k: slice_(x * 1.0, *a, **k)),
        out_name="slice_out",
        fp16_in_fp32=False,
    )
)


def _slice_attrs(t: Tensor, start: IntOrList, stop: IntOrList, step: IntOrList, axis: Axes) -> dict:
    args = [v if v is None or isinstance(v, (list, tuple)) else [v] for v in (start, stop, step)]
    n = max((len(v) for v in args if v is not None), default=0)
    if axis is None:
        axes = list(range(n))
    else:
        axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
        n = len(axes)
    for name, v in zip(("start", "stop", "step"), args):
        if v is not None and len(v) != n:
            raise ValueError(f"slice: {name}={list(v)} does not have one entry per axis {axes}")
    for a in axes:
        if not -t.rank <= a < t.rank:
            raise ValueError(f"slice: axis {a} is out of range for {t.id!r} {t.shape}")
    starts, stops, steps = ([None] * n if v is None else list(v) for v in args)

    def ints(vs):
        return tuple(None if v is None else int(v) for v in vs)

    return {
        "axes": tuple(int(a) % t.rank for a in axes),
        "starts": ints(starts),
        "stops": ints(stops),
        "steps": tuple(1 if s is None else int(s) for s in steps),
    }


def slice(
    t: Tensor,
    start: IntOrList = None,
    stop: IntOrList = None,
    step: IntOrList = None,
    axis: Axes = None,
) -> Tensor:
    """numpy-style slice of ``t``; lists slice several axes (``axis`` defaults to 0, 1, ...)."""
    return create_op(SLICE, [t], _slice_attrs(t, start, stop, step, axis))[0]


def slice_(
    t: Tensor,
    start: IntOrList = None,
    stop: IntOrList = None,
    step: IntOrList = None,
    axis: Axes = None,
) -> Tensor:
    """Like `slice`, but the output aliases ``t`` (for positive steps)."""
    return create_op(SLICE_INPLACE, [t], _slice_attrs(t, start, stop, step, axis))[0]


# SliceGrad: the slice's adjoint, writes the gradient into zeros of the input shape --------
def _slice_grad_infer(ins, in_shape, axes, starts, stops, steps):
    want = _slice_infer([spec(in_shape, ins[0].dtype)], axes, starts, stops, steps)[0]
    if want.shape != ins[0].shape:
        raise ValueError(
            f"slice gradient of shape {ins[0].shape} does not match the slice "
            f"shape {want.shape} of {tuple(in_shape)}"
        )
    return [spec(in_shape, ins[0].dtype)]


def _slice_grad_kernel(g, in_shape, axes, starts, stops, steps):
    idx, flips = _torch_index(in_shape, axes, starts, stops, steps)
    out = g.new_zeros(in_shape)
    out[idx] = g
    return out.flip(flips) if flips else out


def _slice_grad_grad(ctx):
    a = ctx.attrs
    return [
        create_op(
            SLICE, [ctx.grad_output(0)], {k: a[k] for k in ("axes", "starts", "stops", "steps")}
        )[0]
    ]


def _vjp_reference(in_shape, index_fn):
    """Eager torch adjoint of ``index_fn`` at zeros, differentiable in the cotangent."""

    def ref(g):
        x = torch.zeros(in_shape, requires_grad=True)
        return torch.autograd.grad(index_fn(x), x, g, create_graph=True)[0]

    return ref


def _folded_in_shape(attrs, replicas: int) -> dict:
    """All replicas' rows (sim/fold.py): the input shape with R times the rows."""
    shape = tuple(attrs["in_shape"])
    return {**attrs, "in_shape": (shape[0] * replicas, *shape[1:])}


SLICE_GRAD = register(
    OpDef(
        "SliceGrad",
        _slice_grad_infer,
        _slice_grad_kernel,
        grad=_slice_grad_grad,
        cost=copy_cost,
        out_name="slice_grad_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(2, 4, seed=4)],
                lambda g: slice_grad(g, (5, 4), (0,), (1,), (None,), (2,)),
                _vjp_reference((5, 4), lambda x: x[1::2]),
            ),
            Sample(
                [rand(3, 2, seed=5)],
                lambda g: slice_grad(g, (5, 4), (0, 1), (-1, 3), (-4, 0), (-1, -2)),
                _vjp_reference((5, 4), lambda x: x[2:5].flip(0)[:, [3, 1]]),
                name="negative",
            ),
        ],
    )
)
declare(SLICE_GRAD, replica_fold=fold_axis("axes", attrs=_folded_in_shape))


def slice_grad(
    g: Tensor,
    in_shape: Sequence[int],
    axes: Sequence[int],
    starts: Sequence[int | None],
    stops: Sequence[int | None],
    steps: Sequence[int],
) -> Tensor:
    """Zeros of ``in_shape`` with ``g`` written at the slice's positions (its adjoint)."""
    attrs = {
        "in_shape": tuple(int(s) for s in in_shape),
        "axes": tuple(axes),
        "starts": tuple(starts),
        "stops": tuple(stops),
        "steps": tuple(steps),
    }
    return create_op(SLICE_GRAD, [g], attrs)[0]


# Subsample -----------------------------------------------------------------------------------
def _subsample_infer(ins, strides):
    shape = ins[0].shape
    if len(strides) != len(shape) or any(s < 1 for s in strides):
        raise ValueError(
            f"subsample strides {list(strides)} must be >= 1, one per axis of shape {shape}"
        )
    return [spec([-(-d // s) for d, s in zip(shape, strides)], ins[0].dtype)]


def _subsample_kernel(x, strides):
    return x[tuple(builtins.slice(None, None, s) for s in strides)]


def _subsample_grad(ctx):
    strides = ctx.attrs["strides"]
    n = len(strides)
    return [
        slice_grad(
            ctx.grad_output(0),
            ctx.op.inputs[0].shape,
            tuple(range(n)),
            (None,) * n,
            (None,) * n,
            strides,
        )
    ]


SUBSAMPLE = register(
    OpDef(
        "Subsample",
        _subsample_infer,
        _subsample_kernel,
        grad=_subsample_grad,
        cost=copy_cost,
        view=True,
        out_name="subsample_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample([rand(5, 6, 2)], lambda x: subsample(x, [2, 3, 1]), lambda x: x[::2, ::3]),
            Sample(
                [rand(5, 6, seed=3)], lambda x: subsample(x, 2), lambda x: x[::2], name="int_stride"
            ),
            Sample(
                [rand(5, 6, 3, seed=4)],
                lambda x: subsample(x, [3, 4]),
                lambda x: x[::3, ::4],
                name="short_strides",
            ),
            Sample(
                [rand(7, 6, seed=1)],
                lambda x: x[::-2, 1::3],
                lambda x: x.flip(0)[::2, 1::3],
                name="getitem",
            ),
            Sample(
                [rand(7, 6, seed=2)],
                lambda x: x[5:0:-3, -2],
                lambda x: x[[5, 2], -2],
                name="getitem_negative_step",
            ),
        ],
    )
)


def subsample(t: Tensor, strides: int | Sequence[int]) -> Tensor:
    """Every ``strides[i]``-th element along each axis ``i``, starting at 0.

    As in popxl, an int is one stride for axis 0, and missing trailing strides are 1
    (``subsample(t, [2])`` is ``t[::2]``).
    """
    given = (int(strides),) if isinstance(strides, (int, np.integer)) else tuple(strides)
    if len(given) > t.rank:
        raise ValueError(
            f"subsample: {len(given)} strides {list(given)} for the "
            f"{t.rank}-d tensor {t.id!r} of shape {t.shape}"
        )
    full = tuple(int(s) for s in given) + (1,) * (t.rank - len(given))
    return create_op(SUBSAMPLE, [t], {"strides": full})[0]
