"""SparseAccumulate: rows of an update added into an accumulator at the rows a tensor of
indices names.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from ._utils import rand, randint
from ._var_updates_common import (
    Factor,
    check_float,
    check_scalar,
    f16,
    f32,
    factor_inputs,
    in_dtype_of,
)
from .registry import OpDef, Sample, create_op, elementwise_cost, register

__all__ = ["sparse_accumulate_"]


# SparseAccumulate -----------------------------------------------------------------------
def _sparse_infer(ins, axis, factor, has_f, has_w):
    t, x = ins[0], ins[1]
    idx = ins[3 if has_f else 2]
    check_float("t", t)
    check_float("X", x)
    if has_f:
        check_scalar("f", ins[2])
    if not idx.dtype.is_int:
        raise TypeError(f"indices must be an integer tensor, got {idx.dtype.name}")
    rank = len(t.shape)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for the accumulator's rank {rank}")
    axis %= rank
    want = (*t.shape[:axis], *idx.shape, *t.shape[axis + 1 :])
    if x.shape != want:
        raise ValueError(
            f"X has shape {x.shape}; gathering {idx.shape} indices on axis {axis} "
            f"of {t.shape} gives {want}"
        )
    if has_w and ins[-1].shape != t.shape:
        raise ValueError(f"W has shape {ins[-1].shape}, the accumulator has {t.shape}")
    return [t]


def _sparse_kernel(t, x, *rest, axis, factor, has_f, has_w):
    f = f32(rest[0] if has_f else (1.0 if factor is None else factor))
    idx = rest[1 if has_f else 0].reshape(-1).long()
    axis %= t.dim()
    c = in_dtype_of(t)
    src = c(x).reshape(*t.shape[:axis], idx.numel(), *t.shape[axis + 1 :])
    t.index_add_(axis, idx, c(f) * src)
    return t


def _sparse_samples():
    t, w = rand(5, 3, seed=20), rand(5, 3, seed=23)
    idx = np.array([4, 0, 4], np.int32)  # a repeated index accumulates twice
    x = rand(3, 3, seed=21)

    def ref(a, b, i, f=1.0):
        return a.index_add(0, i.long(), f * b)

    return [
        Sample([t, x, idx], lambda a, b, i: sparse_accumulate_(a, b, i), ref, grad=False),
        Sample(
            [t, x, idx, np.array(0.5, np.float32)],
            lambda a, b, i, f: sparse_accumulate_(a, b, i, f=f),
            ref,
            grad=False,
            name="tensor_f",
        ),
        Sample(
            [t, rand(5, 2, seed=22), np.array([2, 1], np.int32), w],
            lambda a, b, i, ww: sparse_accumulate_(a, b, i, axis=1, f=-2.0, W=ww),
            lambda a, b, i, ww: a.index_add(1, i.long(), -2.0 * b),
            grad=False,
            name="axis1_float_f_W",
        ),
        Sample(
            [rand(4, 2, seed=24), rand(2, 3, 2, seed=25), randint(2, 3, high=4, seed=3)],
            lambda a, b, i: sparse_accumulate_(a, b, i),
            lambda a, b, i: a.index_add(0, i.reshape(-1).long(), b.reshape(6, 2)),
            grad=False,
            name="2d_indices",
        ),
        Sample(
            [rand(5, 3, seed=26, dtype=np.float16), x, idx],
            lambda a, b, i: sparse_accumulate_(a, b, i, f=0.3),
            lambda a, b, i: a.index_add(0, i.long(), f16(0.3) * b.half()),
            grad=False,
            rtol=0,
            atol=0,
            name="float16_state",
        ),
    ]


SPARSE_ACCUMULATE = register(
    OpDef(
        "SparseAccumulate",
        _sparse_infer,
        _sparse_kernel,
        cost=elementwise_cost,
        inplace=(0,),
        samples=_sparse_samples,
        out_name="sparseaccumulate_out",
        fp16_in_fp32=False,
    )
)


def sparse_accumulate_(
    t: Tensor,
    X: Tensor,
    indices: Tensor,
    axis: int = 0,
    f: Factor | None = None,
    W: Tensor | None = None,
) -> Tensor:
    """In place: t[indices along axis] += f * X (the update of a gather's gradient)."""
    factor, extra = factor_inputs(f)
    ins = [t, X, *extra, indices, *([W] if W is not None else [])]
    attrs = {"axis": int(axis), "factor": factor, "has_f": bool(extra), "has_w": W is not None}
    return create_op(SPARSE_ACCUMULATE, ins, attrs)[0]
