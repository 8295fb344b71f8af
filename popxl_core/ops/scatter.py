"""GatherElements and Scatter (ONNX ScatterElements), each the other's adjoint: the index
conventions are `gather`'s module docstring's.
"""

from __future__ import annotations

import numpy as np
import torch

from ..tensor import Tensor
from ._utils import rand, spec
from .index_checks import check_axis, check_constant_indices, check_indices, move_cost
from .registry import OpDef, Sample, create_op, register

__all__ = ["gather_elements", "scatter"]


# GatherElements (the adjoint of Scatter's values) ------------------------------------------
def _gather_elements_infer(ins, axis):
    x, idx = ins
    check_indices(idx, "gather_elements")
    a = check_axis(axis, len(x.shape), "gather_elements")
    if len(idx.shape) != len(x.shape) or any(
        i != s for d, (i, s) in enumerate(zip(idx.shape, x.shape)) if d != a
    ):
        raise ValueError(
            f"gather_elements indices {idx.shape} must match {x.shape} on every axis but {a}"
        )
    return [spec(idx.shape, x.dtype)]


def _gather_elements_kernel(x, idx, axis):
    return torch.gather(x, axis, idx.long())


def _gather_elements_grad(ctx):
    x, a = ctx.op.inputs[0], ctx.attrs["axis"] % ctx.op.inputs[0].rank
    from .scatter_reduce import scatter_reduce

    return [
        scatter_reduce(ctx.grad_output(0), ctx.input(1), "sum", axis=a, axis_size=x.shape[a]),
        None,
    ]


GATHER_ELEMENTS = register(
    OpDef(
        "GatherElements",
        _gather_elements_infer,
        _gather_elements_kernel,
        grad=_gather_elements_grad,
        cost=move_cost,
        out_name="gatherelements_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(3, 4, seed=4), np.array([[0, 2, 1, 1], [2, 2, 0, 0]], np.int32)],
                lambda x, i: gather_elements(x, i, 0),
                lambda x, i: torch.gather(x, 0, i.long()),
            ),
            Sample(
                [rand(3, 4, seed=5), np.array([[3, 3], [0, 1], [2, 0]], np.int32)],
                lambda x, i: gather_elements(x, i, -1),
                lambda x, i: torch.gather(x, 1, i.long()),
                name="axis-1",
            ),
        ],
    )
)


def gather_elements(t: Tensor, indices: Tensor, axis: int = 0) -> Tensor:
    """``out[..i..] = t[..indices[..i..]..]`` along ``axis`` (ONNX GatherElements)."""
    check_constant_indices(t, indices, int(axis), "gather_elements")
    return create_op(GATHER_ELEMENTS, [t, indices], {"axis": int(axis)})[0]


# Scatter (ONNX ScatterElements) ------------------------------------------------------------
def _scatter_infer(ins, axis, available_memory_proportion):
    t, idx, values = ins
    check_indices(idx, "scatter")
    check_axis(axis, len(t.shape), "scatter")
    if idx.shape != values.shape or len(idx.shape) != len(t.shape):
        raise ValueError(
            f"scatter indices {idx.shape} and values {values.shape} must have the "
            f"same shape and the rank of t {t.shape}"
        )
    if values.dtype != t.dtype:
        raise TypeError(f"scatter values are {values.dtype.name}, t is {t.dtype.name}")
    return [t]


def _scatter_kernel(x, idx, values, axis, available_memory_proportion):
    return x.scatter(axis, idx.long(), values)


def _scatter_grad(ctx):
    from . import init

    a, values = ctx.attrs["axis"], ctx.op.inputs[2]
    g, idx = ctx.grad_output(0), ctx.input(1)
    zeros = init(values.shape, values.dtype, "zeros", "zero")
    return [scatter(g, idx, zeros, a), None, gather_elements(g, idx, a)]


SCATTER = register(
    OpDef(
        "Scatter",
        _scatter_infer,
        _scatter_kernel,
        grad=_scatter_grad,
        cost=move_cost,
        out_name="scatter_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(3, 4), np.array([[0, 2, 1, 1], [2, 1, 0, 2]], np.int32), rand(2, 4, seed=1)],
                lambda t, i, v: scatter(t, i, v),
                lambda t, i, v: t.scatter(0, i.long(), v),
            ),
            Sample(
                [rand(2, 5, seed=2), np.array([[4, 1], [0, 3]], np.int32), rand(2, 2, seed=3)],
                lambda t, i, v: scatter(t, i, v, axis=1),
                lambda t, i, v: t.scatter(1, i.long(), v),
                name="axis1",
            ),
        ],
    )
)


def scatter(
    t: Tensor,
    indices: Tensor,
    values: Tensor,
    axis: int = 0,
    available_memory_proportion: float | None = None,
) -> Tensor:
    """A copy of ``t`` with ``values`` written at ``indices`` along ``axis`` (ScatterElements)."""
    amp = None if available_memory_proportion is None else float(available_memory_proportion)
    check_constant_indices(t, indices, int(axis), "scatter")
    return create_op(
        SCATTER, [t, indices, values], {"axis": int(axis), "available_memory_proportion": amp}
    )[0]
