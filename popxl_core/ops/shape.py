"""Shape ops: reshape, flatten, transpose, squeeze/unsqueeze, expand.

concat and split live in `concat.py`, the slicing ops (slice, subsample, dynamic_slice,
dynamic_update) in `slicing.py`; both are re-exported here so that ``popxl.ops`` sees the
whole shape family through this module.

Kernels that only re-describe memory (reshape, transpose, expand) return torch views and
declare ``view=True``; the compiler clones their result where a graph modifies tensors in
place. The in-place variants (``ReshapeInplace``, ``TransposeInplace``) return the view
uncloned: their output aliases input 0, as in popxl.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import broadcast_shapes, rand, spec, unbroadcast
from .concat import concat, concat_, split
from .forms import ReplicaFold, fold_rows
from .registry import OpDef, Sample, copy_cost, create_op, no_cost, register
from .slicing import (
    dynamic_slice,
    dynamic_update,
    dynamic_update_,
    slice,
    slice_,
    subsample,
)

__all__ = [
    "concat",
    "concat_",
    "dynamic_slice",
    "dynamic_update",
    "dynamic_update_",
    "expand",
    "flatten",
    "flatten_",
    "reshape",
    "reshape_",
    "slice",
    "slice_",
    "split",
    "squeeze",
    "subsample",
    "transpose",
    "transpose_",
    "unsqueeze",
]


# Reshape -------------------------------------------------------------------------------
def resolve_shape(in_shape: Sequence[int], shape: Sequence[int]) -> tuple:
    """``shape`` with its (single) -1 resolved; ValueError naming both shapes on a mismatch."""
    shape = tuple(int(s) for s in shape)
    # math.prod: exact, and ~20x quicker than numpy's on a handful of dims (every reshape)
    n_in = int(math.prod(in_shape))
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in shape):
        raise ValueError(f"invalid reshape target {shape}: sizes must be >= 0, with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if unknown:
        if known == 0 or n_in % known:
            raise ValueError(
                f"cannot reshape a tensor of shape {tuple(in_shape)} ({n_in} elements) to {shape}"
            )
        shape = shape[: unknown[0]] + (n_in // known,) + shape[unknown[0] + 1 :]
    elif known != n_in:
        raise ValueError(
            f"cannot reshape a tensor of shape {tuple(in_shape)} ({n_in} elements) "
            f"to {shape} ({known} elements)"
        )
    return shape


def _reshape_infer(ins, shape):
    return [spec(resolve_shape(ins[0].shape, shape), ins[0].dtype)]


def _reshape_grad(ctx):
    return [reshape(ctx.grad_output(0), ctx.op.inputs[0].shape)]


def _reshape_samples():
    return [
        Sample([rand(2, 3, 4)], lambda x: reshape(x, (6, 4)), lambda x: x.reshape(6, 4)),
        Sample(
            [rand(2, 3, 4, seed=1)],
            lambda x: reshape(x, (-1, 3)),
            lambda x: x.reshape(-1, 3),
            name="minus1",
        ),
        Sample([rand(2, 3, seed=2)], lambda x: flatten(x), lambda x: x.reshape(-1), name="flatten"),
        Sample(
            [rand(3, 1, 4, 1, seed=3)], lambda x: squeeze(x), lambda x: x.squeeze(), name="squeeze"
        ),
        Sample(
            [rand(3, 1, 4, 1, seed=4)],
            lambda x: squeeze(x, [-1]),
            lambda x: x.squeeze(-1),
            name="squeeze_axis",
        ),
        Sample(
            [rand(3, 4, seed=5)],
            lambda x: unsqueeze(x, [0, -1]),
            lambda x: x[None, :, :, None],
            name="unsqueeze",
        ),
    ]


def _reshape_kernel(x, shape):
    return torch.reshape(x, shape)


def _reshape_direct(op, ins, literal):
    """``speed.DIRECT`` (sim/direct.py): the kernel's torch call."""
    if set(op.attrs) != {"shape"}:
        return None
    return f"torch.reshape({ins[0]}, {literal(tuple(op.attrs['shape']))})"


def _folded_shape(attrs, replicas: int) -> dict:
    """All replicas' rows (sim/fold.py): R times the rows (row-major: replica r's elements
    are rows r*n to (r+1)*n of the result)."""
    shape = list(attrs["shape"])
    if shape[0] != -1:
        shape[0] *= replicas
    return {**attrs, "shape": tuple(shape)}


RESHAPE = register(
    OpDef(
        "Reshape",
        _reshape_infer,
        _reshape_kernel,
        grad=_reshape_grad,
        cost=copy_cost,
        view=True,
        samples=_reshape_samples,
        out_name="reshape_out",
        fp16_in_fp32=False,
    )
)
declare(RESHAPE, direct=_reshape_direct, replica_fold=fold_rows(0, attrs=_folded_shape, exact=True))
# In-place variants return the view itself and leave ``view`` False, so the compiler never
# clones it: the alias is the point. It is a true alias when torch can view the input's
# strides with the new shape (always, unless a TransposeInplace came first).
RESHAPE_INPLACE = register(
    OpDef(
        "ReshapeInplace",
        _reshape_infer,
        _reshape_kernel,
        grad=_reshape_grad,
        cost=no_cost,
        inplace=(0,),
        out_name="reshape_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(4, 3, seed=6)], lambda x: reshape_(x * 1.0, (2, 6)), lambda x: x.reshape(2, 6)
            ),
            Sample(
                [rand(4, 3, seed=7)],
                lambda x: flatten_(x * 1.0),
                lambda x: x.reshape(-1),
                name="flatten_",
            ),
        ],
    )
)


def reshape(t: Tensor, shape: Sequence[int]) -> Tensor:
    """``t`` with a new shape of the same number of elements (one -1 may be inferred)."""
    return create_op(RESHAPE, [t], {"shape": _shape_attr(shape)})[0]


def reshape_(t: Tensor, shape: Sequence[int]) -> Tensor:
    """Like `reshape`, but the output aliases ``t``."""
    return create_op(RESHAPE_INPLACE, [t], {"shape": _shape_attr(shape)})[0]


def _shape_attr(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def flatten(t: Tensor) -> Tensor:
    """``t`` as a 1-D tensor of shape ``(t.nelms,)`` (a Reshape)."""
    return reshape(t, (-1,))


def flatten_(t: Tensor) -> Tensor:
    """Like `flatten`, but the output aliases ``t`` (a ReshapeInplace)."""
    return reshape_(t, (-1,))


def squeeze(t: Tensor, axes: int | Sequence[int] | None = None) -> Tensor:
    """Drop size-1 axes (all of them if ``axes`` is None); built as a Reshape, like popxl."""
    if axes is None:
        drop = {i for i, s in enumerate(t.shape) if s == 1}
    else:
        drop = set(_axes_in_range(axes, t.rank, "squeeze"))
        bad = [a for a in sorted(drop) if t.shape[a] != 1]
        if bad:
            raise ValueError(f"squeeze: axes {bad} of {t.id!r} {t.shape} do not have size 1")
    return reshape(t, [s for i, s in enumerate(t.shape) if i not in drop])


def unsqueeze(t: Tensor, axes: int | Sequence[int]) -> Tensor:
    """Insert size-1 axes at positions ``axes`` of the output (not in popxl; a Reshape)."""
    rank = t.rank + (1 if isinstance(axes, (int, np.integer)) else len(axes))
    new = set(_axes_in_range(axes, rank, "unsqueeze"))
    if len(new) != rank - t.rank:
        raise ValueError(f"unsqueeze: axes {axes} repeat an axis")
    dims = iter(t.shape)
    return reshape(t, [1 if i in new else next(dims) for i in range(rank)])


def _axes_in_range(axes, rank: int, what: str) -> list[int]:
    axes = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    for a in axes:
        if not -rank <= a < rank:
            raise ValueError(f"{what}: axis {a} is out of range for rank {rank}")
    return [int(a) % rank for a in axes]


# Transpose -----------------------------------------------------------------------------
def _transpose_infer(ins, permutation):
    rank = len(ins[0].shape)
    if sorted(permutation) != list(range(rank)):
        raise ValueError(
            f"permutation {tuple(permutation)} is not a permutation of the "
            f"{rank} axes of shape {ins[0].shape}"
        )
    return [spec([ins[0].shape[p] for p in permutation], ins[0].dtype)]


def _transpose_grad(ctx):
    inverse = tuple(int(i) for i in np.argsort(ctx.attrs["permutation"]))
    return [transpose(ctx.grad_output(0), inverse)]


def _transpose_kernel(x, permutation):
    return x.permute(permutation)


def _transpose_samples():
    return [
        Sample([rand(2, 3, 4)], lambda x: transpose(x), lambda x: x.permute(2, 1, 0)),
        Sample(
            [rand(2, 3, 4, seed=1)],
            lambda x: transpose(x, (1, 2, 0)),
            lambda x: x.permute(1, 2, 0),
            name="perm",
        ),
        Sample([rand(3, 5, seed=2)], lambda x: x.T, lambda x: x.T, name="T"),
    ]


def _transpose_direct(op, ins, literal):
    """``speed.DIRECT`` (sim/direct.py): the kernel's torch call."""
    if set(op.attrs) != {"permutation"}:
        return None
    return f"{ins[0]}.permute({literal(tuple(op.attrs['permutation']))})"


def _matrix_transpose(op) -> bool:
    """``speed.MATRIX_TRANSPOSE`` (sim/fuse.py): swaps the two axes of a matrix."""
    return tuple(op.attrs.get("permutation", ())) == (1, 0)


def _keeps_rows(attrs, shapes, per) -> bool:
    """A permutation keeping axis 0 keeps each replica's rows (sim/fold.py)."""
    return int(attrs["permutation"][0]) == 0


TRANSPOSE = register(
    OpDef(
        "Transpose",
        _transpose_infer,
        _transpose_kernel,
        grad=_transpose_grad,
        cost=copy_cost,
        view=True,
        samples=_transpose_samples,
        out_name="transpose_out",
        fp16_in_fp32=False,
    )
)
declare(
    TRANSPOSE,
    direct=_transpose_direct,
    matrix_transpose=_matrix_transpose,
    replica_fold=ReplicaFold(rows=_keeps_rows, exact=True),
)
TRANSPOSE_INPLACE = register(
    OpDef(
        "TransposeInplace",
        _transpose_infer,
        _transpose_kernel,
        grad=_transpose_grad,
        cost=no_cost,
        inplace=(0,),
        out_name="transpose_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample(
                [rand(2, 3, 4, seed=3)],
                lambda x: transpose_(x * 1.0, (0, 2, 1)),
                lambda x: x.permute(0, 2, 1),
            )
        ],
    )
)


def _perm_attr(t: Tensor, permutation) -> tuple:
    if permutation is None:
        return tuple(reversed(range(t.rank)))
    return tuple(int(p) % max(t.rank, 1) if -t.rank <= p < 0 else int(p) for p in permutation)


def transpose(t: Tensor, permutation: Sequence[int] | None = None) -> Tensor:
    """Permute the axes of ``t`` (reverse them if ``permutation`` is None)."""
    return create_op(TRANSPOSE, [t], {"permutation": _perm_attr(t, permutation)})[0]


def transpose_(t: Tensor, permutation: Sequence[int] | None = None) -> Tensor:
    """Like `transpose`, but the output aliases ``t``."""
    return create_op(TRANSPOSE_INPLACE, [t], {"permutation": _perm_attr(t, permutation)})[0]


# Expand --------------------------------------------------------------------------------
def _expand_infer(ins, shape):
    # ONNX Expand: bidirectional numpy broadcasting of the input shape and ``shape``.
    return [spec(broadcast_shapes(ins[0].shape, shape), ins[0].dtype)]


def _expand_kernel(x, shape):
    return torch.broadcast_to(x, torch.broadcast_shapes(x.shape, shape))


def _expand_grad(ctx):
    return [unbroadcast(ctx.grad_output(0), ctx.op.inputs[0].shape)]


EXPAND = register(
    OpDef(
        "Expand",
        _expand_infer,
        _expand_kernel,
        grad=_expand_grad,
        cost=copy_cost,
        view=True,
        out_name="expand_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample([rand(3, 1)], lambda x: expand(x, (2, 3, 4)), lambda x: x.expand(2, 3, 4)),
            Sample(
                [rand(1, 4, seed=1)],
                lambda x: expand(x, (3, 1)),
                lambda x: x.expand(3, 4),
                name="bidirectional",
            ),
        ],
    )
)


def expand(t: Tensor, shape: Sequence[int]) -> Tensor:
    """Broadcast ``t`` to ``shape`` (numpy rules, in both directions like ONNX Expand)."""
    return create_op(EXPAND, [t], {"shape": _shape_attr(shape)})[0]
