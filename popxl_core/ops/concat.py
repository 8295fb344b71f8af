"""Concat (and ConcatInplace) and Split: joining tensors along an axis, cutting one in pieces."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import rand, spec
from .forms import fold_axis
from .registry import OpDef, Sample, copy_cost, create_op, no_cost, register
from .slicing import slice

__all__ = ["concat", "concat_", "split"]


# Concat / Split --------------------------------------------------------------------------
def _concat_infer(ins, axis):
    if not ins:
        raise ValueError("concat needs at least one tensor")
    if len({t.dtype for t in ins}) > 1:
        # PopXL's message, which its tests match
        raise TypeError(
            "All inputs to a concat operation must have the same type: got "
            + ", ".join(t.dtype.name for t in ins)
        )
    ranks = {len(s.shape) for s in ins}
    if len(ranks) > 1:
        raise ValueError(
            f"concat inputs must have the same rank, got shapes {[s.shape for s in ins]}"
        )
    rank = ranks.pop()
    if not -rank <= axis < rank:
        raise ValueError(f"concat axis {axis} is out of range for rank {rank}")
    axis %= rank
    rest = {s.shape[:axis] + s.shape[axis + 1 :] for s in ins}
    if len(rest) > 1:
        raise ValueError(
            f"concat inputs must match on every axis but {axis}, got shapes "
            f"{[s.shape for s in ins]}"
        )
    size = sum(s.shape[axis] for s in ins)
    return [spec(ins[0].shape[:axis] + (size,) + ins[0].shape[axis + 1 :], ins[0].dtype)]


def _concat_kernel(*xs, axis):
    return torch.cat(xs, axis)


def _concat_grad(ctx):
    g, axis = ctx.grad_output(0), ctx.attrs["axis"] % ctx.op.outputs[0].rank
    grads, start = [], 0
    for t in ctx.op.inputs:
        grads.append(slice(g, start, start + t.shape[axis], axis=axis))
        start += t.shape[axis]
    return grads


def _concat_samples(fn):
    def samples():
        return [
            Sample(
                [rand(2, 3), rand(4, 3, seed=1)],
                lambda a, b: fn([a, b]),
                lambda a, b: torch.cat([a, b]),
            ),
            Sample(
                [rand(2, 3, seed=2), rand(2, 1, seed=3), rand(2, 2, seed=4)],
                lambda a, b, c: fn([a, b, c], axis=-1),
                lambda a, b, c: torch.cat([a, b, c], -1),
                name="axis-1",
            ),
        ]

    return samples


CONCAT = register(
    OpDef(
        "Concat",
        _concat_infer,
        _concat_kernel,
        grad=_concat_grad,
        cost=copy_cost,
        samples=_concat_samples(lambda ts, axis=0: concat(ts, axis)),
        out_name="concat_out",
        fp16_in_fp32=False,
    )
)
declare(CONCAT, replica_fold=fold_axis("axis", every=True))
# popxl's ConcatInplace makes the output an alias of all its inputs. torch cannot express
# that, so the simulator copies: writes into the output do not reach the inputs.
CONCAT_INPLACE = register(
    OpDef(
        "ConcatInplace",
        _concat_infer,
        _concat_kernel,
        grad=_concat_grad,
        cost=no_cost,
        samples=_concat_samples(lambda ts, axis=0: concat_(ts, axis)),
        out_name="concat_out",
        fp16_in_fp32=False,
    )
)


def concat(ts: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along ``axis``."""
    return create_op(CONCAT, list(ts), {"axis": int(axis)})[0]


def concat_(ts: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Like `concat`; popxl aliases the inputs (the simulator copies, see ConcatInplace)."""
    return create_op(CONCAT_INPLACE, list(ts), {"axis": int(axis)})[0]


def _split_infer(ins, axis, splits):
    shape = ins[0].shape
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"split axis {axis} is out of range for shape {shape}")
    axis %= len(shape)
    if sum(splits) != shape[axis] or any(s < 0 for s in splits):
        raise ValueError(
            f"split sizes {list(splits)} do not add up to {shape[axis]}, the size "
            f"of axis {axis} of shape {shape}"
        )
    return [spec(shape[:axis] + (s,) + shape[axis + 1 :], ins[0].dtype) for s in splits]


def _split_kernel(x, axis, splits):
    # Clones: a multi-output kernel cannot be wrapped by the compiler's view cloning.
    return tuple(p.clone() for p in torch.split(x, list(splits), axis))


def _split_grad(ctx):
    n = len(ctx.op.outputs)
    return [concat([ctx.grad_output_or_zero(i) for i in range(n)], ctx.attrs["axis"])]


SPLIT = register(
    OpDef(
        "Split",
        _split_infer,
        _split_kernel,
        grad=_split_grad,
        cost=copy_cost,
        out_name="split_out",
        fp16_in_fp32=False,
        samples=lambda: [
            Sample([rand(6, 2)], lambda x: split(x, 3), lambda x: torch.split(x, 2)),
            Sample(
                [rand(2, 5, seed=1)],
                lambda x: split(x, [1, 4], axis=1),
                lambda x: torch.split(x, [1, 4], 1),
                name="sizes",
            ),
            Sample(
                [rand(2, 5, seed=2)],
                lambda x: split(x, [2, 3], axis=-1)[1],
                lambda x: torch.split(x, [2, 3], -1)[1],
                name="one_used",
            ),
        ],
    )
)
declare(SPLIT, replica_fold=fold_axis("axis"))


def split(t: Tensor, splits: int | list[int], axis: int = 0) -> list[Tensor]:
    """Split ``t`` along ``axis`` into ``splits`` equal parts, or parts of the given sizes."""
    if not -t.rank <= axis < t.rank:
        raise ValueError(f"split: axis {axis} is out of range for {t.id!r} {t.shape}")
    if isinstance(splits, (int, np.integer)):
        size = t.shape[axis]
        if splits <= 0 or size % splits:
            raise ValueError(
                f"split: cannot split axis {axis} of {t.id!r} {t.shape} into {splits} equal parts"
            )
        splits = [size // splits] * int(splits)
    return create_op(SPLIT, [t], {"axis": int(axis), "splits": tuple(int(s) for s in splits)})
