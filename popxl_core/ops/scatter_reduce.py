"""ScatterReduce: reduce slices of ``data`` into an output of ``axis_size`` along ``axis``.

Indices either have ``data``'s shape (element-wise, like ONNX ScatterElements with a
reduction) or, with ``enable_index_broadcast``, are 1-D with one index per position of
``data`` along ``axis`` (like ``torch.index_add``; an embedding gradient). Indices outside
``[0, axis_size)`` are ignored. Positions no index reaches hold ``initial_values``, or 0.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import rand, spec
from .forms import ReplicaFold
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["scatter_reduce"]

REDUCTIONS = {"sum": "sum", "max": "amax", "min": "amin", "mul": "prod", "none": None}


def _infer(ins, reduction, axis, axis_size, enable_index_broadcast):
    data, idx = ins[0], ins[1]
    if not idx.dtype.is_int:
        raise TypeError(f"scatter_reduce indices must be an integer tensor, got {idx.dtype.name}")
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"scatter_reduce reduction must be one of {sorted(REDUCTIONS)}, got {reduction!r}"
        )
    rank = len(data.shape)
    if not 0 <= axis < rank:
        raise ValueError(f"scatter_reduce axis {axis} is out of range for shape {data.shape}")
    broadcast = enable_index_broadcast and idx.shape == (data.shape[axis],)
    if idx.shape != data.shape and not broadcast:
        raise ValueError(
            f"scatter_reduce indices {idx.shape} must have the data shape "
            f"{data.shape}" + (f" or be ({data.shape[axis]},)" if enable_index_broadcast else "")
        )
    out = spec(data.shape[:axis] + (axis_size,) + data.shape[axis + 1 :], data.dtype)
    if len(ins) == 3 and (ins[2].shape != out.shape or ins[2].dtype != out.dtype):
        raise ValueError(
            f"scatter_reduce initial_values must be {out.shape} {out.dtype.name}, "
            f"got {ins[2].shape} {ins[2].dtype.name}"
        )
    return [out]


def _kernel(data, idx, *initial, reduction, axis, axis_size, enable_index_broadcast):
    idx = idx.long()
    # One extra slot along the axis collects the out-of-range contributions; it is cut off.
    # (1-D indices: sent there before they are broadcast, one index per data row)
    idx = torch.where((idx >= 0) & (idx < axis_size), idx, axis_size)
    return _scatter(data, idx, initial, reduction, axis, axis_size)


def _scatter(data, idx, initial, reduction: str, axis: int, axis_size: int) -> torch.Tensor:
    """`_kernel` on int64 indices already in ``[0, axis_size]`` (``axis_size``: cut off)."""
    if idx.shape != data.shape:
        idx = idx.view([1] * axis + [-1] + [1] * (data.dim() - axis - 1)).expand(data.shape)
    out_shape = data.shape[:axis] + (axis_size + 1,) + data.shape[axis + 1 :]
    base = data.new_zeros(out_shape)
    if initial:
        base.narrow(axis, 0, axis_size).copy_(initial[0])
    if reduction == "none":
        out = base.scatter(axis, idx, data)
    else:
        out = base.scatter_reduce(
            axis, idx, data, REDUCTIONS[reduction], include_self=bool(initial)
        )
    return out.narrow(axis, 0, axis_size)


def _torch_kernel(data, idx, *initial, reduction, axis, axis_size, enable_index_broadcast):
    """``Ir.numerics == "torch"``: a sum of rows at 1-D indices (an embedding's gradient)
    made by eager's embedding backward itself, row after row into zeros (in float16 each add
    rounded to float16, where torch's scatter_reduce rounds differently; in float32 the same
    sums, one call where a scatter takes six)."""
    half = data.dtype in (torch.float16, torch.bfloat16)
    compiling = torch.compiler.is_compiling()
    # traced by inductor, float32 keeps `_kernel`'s scatter; float16 needs eager's rounding
    eager_kernel = half or (data.is_floating_point() and not compiling)
    if not eager_kernel or reduction != "sum" or initial or axis != 0 or idx.dim() != 1:
        return _kernel(
            data,
            idx,
            *initial,
            reduction=reduction,
            axis=axis,
            axis_size=axis_size,
            enable_index_broadcast=enable_index_broadcast,
        )
    i, slots = idx.long(), axis_size
    if compiling:  # traced by inductor: out-of-range indices to a cut-off slot, as _kernel
        i, slots = torch.where((i >= 0) & (i < axis_size), i, axis_size), axis_size + 1
    # eager's CPU kernel adds only the rows whose index is in [0, slots): the rest are cut
    # off as `_kernel` cuts them (tests/test_fx_fp16.py holds it to that)
    rows = torch.ops.aten.embedding_dense_backward(
        data.reshape(data.shape[0], -1), i, slots, -1, False
    )
    return rows[:axis_size].reshape((axis_size, *data.shape[1:]))


def _grad(ctx):
    from . import init
    from .gather import gather
    from .scatter import gather_elements

    reduction, axis = ctx.attrs["reduction"], ctx.attrs["axis"]
    if reduction not in ("sum", "none"):
        raise NotImplementedError(
            f"autodiff: ScatterReduce with reduction={reduction!r} has no "
            "gradient rule (only 'sum' and 'none')."
        )
    data, idx_fwd = ctx.op.inputs[0], ctx.op.inputs[1]
    g, idx = ctx.grad_output(0), ctx.input(1)
    if idx_fwd.shape == data.shape:
        # gather_elements needs in-range indices; dropped (out-of-range) ones are rare enough
        # that the simulator raises rather than guessing.
        d_data = gather_elements(g, idx, axis)
    else:
        d_data = gather(g, idx, axis, zero_OOR=True)
    grads = [d_data, None]
    if len(ctx.op.inputs) == 3:
        if reduction == "sum":
            grads.append(g)
        else:  # overwritten positions do not reach the initial values
            zeros = init(data.shape, data.dtype, "zeros", "zero")
            grads.append(
                scatter_reduce(
                    zeros,
                    idx,
                    "none",
                    initial_values=g,
                    axis=axis,
                    axis_size=ctx.op.outputs[0].shape[axis],
                )
            )
    return grads


def _cost(ins, outs, attrs) -> Cost:
    return Cost(ins[0].nelms, 2 * ins[0].nbytes + ins[1].nbytes + outs[0].nbytes)


def _i32(*v):
    return np.array(v, dtype=np.int32)


def _samples():
    rows = _i32(0, 2, 0, 1)

    def index_add(d, i):
        return torch.zeros(3, 3).index_add(0, i.long(), d)

    return [
        Sample(
            [rand(4, 3), rows], lambda d, i: scatter_reduce(d, i, "sum", axis_size=3), index_add
        ),
        Sample(
            [rand(4, 3, seed=1), _i32(0, 7, -1, 1)],
            lambda d, i: scatter_reduce(d, i, "sum", axis_size=3),
            lambda d, i: torch.zeros(3, 3).index_add(0, torch.tensor([0, 1]), d[[0, 3]]),
            name="out_of_range_ignored",
        ),
        Sample(
            [
                rand(2, 4, seed=2),
                np.array([[0, 2, 2, 1], [1, 1, 0, 0]], np.int32),
                rand(2, 3, seed=3),
            ],
            lambda d, i, z: scatter_reduce(d, i, "sum", initial_values=z, axis=1),
            lambda d, i, z: z.scatter_add(1, i.long(), d),
            name="elementwise_initial",
        ),
        Sample(
            [rand(4, 3, seed=4), rows],
            lambda d, i: scatter_reduce(d, i, "max", axis_size=3),
            lambda d, i: torch.stack([torch.maximum(d[0], d[2]), d[3], d[1]]),
            grad=False,
            name="max",
        ),
        Sample(
            [rand(2, 3, seed=5), _i32(2, 0), rand(3, 3, seed=6)],
            lambda d, i, z: scatter_reduce(d, i, "none", initial_values=z),
            lambda d, i, z: z.index_copy(0, i.long(), d),
            name="none",
        ),
    ]


def _replica_rows(attrs, shapes, per) -> bool:
    """Replicas folded (sim/fold.py): 1-D per-replica indices into axis 0, no initial values
    (an embedding's gradient)."""
    return len(per) == 2 and all(per) and len(shapes[1]) == 1 and attrs["axis"] == 0


def _folded(args, replicas, dead, buffers, reduction, axis, axis_size, enable_index_broadcast):
    """Every replica's scatter into its own ``axis_size`` rows of one result: replica r's
    indices offset by ``r * axis_size`` (out-of-range ones still cut off), so each target
    row sums its replica's rows in their order."""
    data, idx = args
    size = replicas * axis_size
    idx = idx.long()
    flat = idx + _offsets(replicas, idx.shape[0] // replicas, axis_size)
    if not _in_range(idx, axis_size):
        flat = torch.where((idx >= 0) & (idx < axis_size), flat, size)
    return _scatter(data, flat, (), reduction, 0, size)


@functools.lru_cache(maxsize=16)
def _offsets(replicas: int, rows: int, axis_size: int) -> torch.Tensor:
    """Replica r's rows' offset, ``r * axis_size`` (read, never written)."""
    return torch.arange(replicas).repeat_interleave(rows) * axis_size


def _in_range(idx: torch.Tensor, axis_size: int) -> bool:
    """Every index in ``[0, axis_size)`` (one kernel)."""
    if idx.numel() == 0:
        return True
    lo, hi = torch.aminmax(idx)
    return int(lo) >= 0 and int(hi) < axis_size


SCATTER_REDUCE = register(
    OpDef(
        "ScatterReduce",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="scatterreduce_out",
        numerics_kernels={"torch": _torch_kernel},
    )
)
declare(SCATTER_REDUCE, replica_fold=ReplicaFold(rows=_replica_rows, kernels=(_folded,)))


def scatter_reduce(
    data: Tensor,
    indices: Tensor,
    reduction: str,
    initial_values: Tensor | None = None,
    axis: int = 0,
    axis_size: int | None = None,
    enable_index_broadcast: bool = True,
    available_memory_proportion: float | None = None,
) -> Tensor:
    """Reduce ``data`` into ``axis_size`` slots along ``axis`` at ``indices``.

    ``reduction`` is one of 'sum', 'max', 'min', 'mul' or 'none' (overwrite).

    ``axis_size`` defaults to ``initial_values.shape[axis]``, else ``data.shape[axis]``.
    """
    axis = int(axis) % data.rank if -data.rank <= axis < data.rank else int(axis)
    if axis_size is None:
        src = initial_values if initial_values is not None else data
        axis_size = src.shape[axis] if 0 <= axis < src.rank else 0
    inputs = [data, indices] + ([initial_values] if initial_values is not None else [])
    attrs = {
        "reduction": reduction,
        "axis": axis,
        "axis_size": int(axis_size),
        "enable_index_broadcast": bool(enable_index_broadcast),
    }
    return create_op(SCATTER_REDUCE, inputs, attrs)[0]
