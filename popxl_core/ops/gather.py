"""Gather ops: gather, tied_gather (gather_elements and scatter: `scatter`).

`scatter_reduce` and `onehot` have their own modules.

Index conventions (the simulator's, documented because the IPU leaves some undefined):
- ``Gather`` does not wrap negative indices; an index outside ``[0, n)`` gives zeros with
  ``zero_OOR=True``, and an unspecified row on the IPU with ``zero_OOR=False`` (never an
  error), which the simulator also makes zeros.
- ``Scatter`` and ``GatherElements`` need indices in ``[0, n)`` (IPU offsets are unsigned; ONNX's
  negative indices are not wrapped at run time), else they raise.
- ``ScatterReduce`` ignores indices outside ``[0, axis_size)`` (what sharded embeddings need).
Negative host-side indices (``t[-1]``, ``t[np.array([-1])]``) are wrapped when the graph is
built, in `indexing.getitem`.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import torch

from ..sim.speed import declare
from ..tensor import Tensor, constant
from ._utils import rand, randint, spec
from .forms import fold_indexed
from .index_checks import check_axis, check_constant_indices, check_indices, move_cost
from .registry import OpDef, Sample, create_op, register

__all__ = ["GatherIndexWarning", "gather", "tied_gather"]


def _along(mask: torch.Tensor, axis: int, rank: int) -> torch.Tensor:
    """A 1-D tensor shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    return mask.view([1] * axis + [-1] + [1] * (rank - axis - 1))


# Gather / TiedGather ----------------------------------------------------------------------
def _gather_infer(ins, axis, zero_OOR, available_memory_proportion):
    t, idx = ins
    check_indices(idx, "gather")
    a = check_axis(axis, len(t.shape), "gather")
    return [spec(t.shape[:a] + idx.shape + t.shape[a + 1 :], t.dtype)]


def _gather_kernel(x, idx, axis, zero_OOR, available_memory_proportion):
    axis %= x.dim()
    n, flat = x.shape[axis], idx.reshape(-1).long()
    out_shape = x.shape[:axis] + idx.shape + x.shape[axis + 1 :]
    # under torch.compile (Options(kernels="inductor")) no branch on data: always the masked
    # gather, the same values for in-range indices, zeros without the warning otherwise
    compiling = torch.compiler.is_compiling()
    error = None
    if not compiling:
        # torch checks every index itself (IndexError, RuntimeError off axis 0): one kernel,
        # where a range check before it took five
        try:
            return torch.index_select(x, axis, flat).reshape(out_shape)
        except (IndexError, RuntimeError) as e:
            error = e
    valid = (flat >= 0) & (flat < n)
    if error is not None and bool(valid.all()):
        raise error  # every index in range: the error is not about them
    # zero_OOR=False leaves out-of-range rows unspecified on the IPU (no error is raised);
    # the simulator gives them zeros too, so a run is deterministic either way, and says so.
    if not zero_OOR and not compiling:
        _warn_out_of_range(flat[~valid][0].item(), n, axis)
    out = torch.index_select(x, axis, torch.where(valid, flat, 0))
    return torch.where(_along(valid, axis, x.dim()), out, 0).reshape(out_shape)


class GatherIndexWarning(UserWarning):
    """A gather met run-time indices outside the gathered axis (once per op)."""


_warned: weakref.WeakSet = weakref.WeakSet()  # the ops that have warned


def _warn_out_of_range(index: int, n: int, axis: int) -> None:
    """Warn once per op: the IPU raises nothing and returns an unspecified row for such an
    index; the simulator returns zeros and, unlike hardware, can tell."""
    from ..sim.checks import running_op

    op = running_op()
    if op is not None and op in _warned:
        return
    if op is not None:
        _warned.add(op)
    what = f"{op.type} op {op.outputs[0].id!r}" if op is not None else "a Gather op"
    warnings.warn(
        f"{what}: run-time index {index} is outside the valid range [0, {n}) of axis {axis}; "
        "the simulator returns zeros for it (the IPU an unspecified row). Keep the indices in "
        "range, or pass zero_OOR=True to ask for zeros (then no warning).",
        GatherIndexWarning,
        stacklevel=2,
    )


def _gather_grad(ctx):
    from . import reshape
    from .scatter_reduce import scatter_reduce

    t, idx, a = ctx.op.inputs[0], ctx.op.inputs[1], ctx.attrs["axis"] % ctx.op.inputs[0].rank
    n = int(np.prod(idx.shape, dtype=np.int64))
    g = reshape(ctx.grad_output(0), t.shape[:a] + (n,) + t.shape[a + 1 :])
    flat = reshape(ctx.input(1), (n,))
    return [scatter_reduce(g, flat, "sum", axis=a, axis_size=t.shape[a]), None]


def _scalar_index(i: int) -> Tensor:
    from . import reshape

    # Reshaped, so the test holds whatever shape a host scalar constant gets.
    return reshape(constant(np.array([i], np.int32)), ())


def _gather_samples(fn, with_getitem: bool = False):
    def samples():
        def oor(x, i):
            valid = (i >= 0) & (i < 4)
            return torch.where(valid[:, None], x[torch.where(valid, i, 0).long()], 0)

        return [
            Sample(
                [rand(5, 3), np.array([4, 0, 4], np.int32)],
                lambda x, i: fn(x, i),
                lambda x, i: x[i.long()],
            ),
            Sample(
                [rand(3, 4, 2, seed=1), randint(2, 3, high=4, seed=1)],
                lambda x, i: fn(x, i, axis=1),
                lambda x, i: x[:, i.long()],
                name="axis1",
            ),
            Sample(
                [rand(4, 3, seed=2), np.array([1, 5, -1, 3], np.int32)],
                lambda x, i: fn(x, i, zero_OOR=True),
                oor,
                name="zero_OOR",
            ),
            Sample(
                [rand(4, 3, seed=6), np.array([7, 2, -9, 0], np.int32)],
                lambda x, i: fn(x, i),
                oor,
                name="oor_no_error",
            ),
            Sample(
                [rand(4, 3, seed=3)],
                lambda x: fn(x, _scalar_index(2), -2),
                lambda x: x[2],
                name="scalar_index",
            ),
        ] + (
            []
            if not with_getitem
            else [
                Sample(
                    [rand(4, 3, seed=4), np.array([[3, 0], [1, 1]], np.int32)],
                    lambda x, i: x[i],
                    lambda x, i: x[i.long()],
                    name="getitem_tensor",
                ),
                Sample(
                    [rand(4, 3, seed=5)],
                    lambda x: x[np.array([-1, 2])],
                    lambda x: x[[3, 2]],
                    name="getitem_host_array",
                ),
            ]
        )

    return samples


GATHER = register(
    OpDef(
        "Gather",
        _gather_infer,
        _gather_kernel,
        grad=_gather_grad,
        cost=move_cost,
        out_name="gather_out",
        fp16_in_fp32=False,
        samples=_gather_samples(lambda *a, **k: gather(*a, **k), True),
    )
)
declare(GATHER, replica_fold=fold_indexed())
# popxl's TiedGather is a Gather whose weight is shared with a MatMul (tied embeddings); the
# numbers are the same, only the op type (and its IPU tile layout) differs.
TIED_GATHER = register(
    OpDef(
        "TiedGather",
        _gather_infer,
        _gather_kernel,
        grad=_gather_grad,
        cost=move_cost,
        out_name="tiedgather_out",
        fp16_in_fp32=False,
        samples=_gather_samples(lambda *a, **k: tied_gather(*a, **k)),
    )
)


def _gather_attrs(axis, zero_OOR, available_memory_proportion) -> dict:
    amp = None if available_memory_proportion is None else float(available_memory_proportion)
    return {"axis": int(axis), "zero_OOR": bool(zero_OOR), "available_memory_proportion": amp}


def _index_tensor(indices, like: Tensor) -> Tensor:
    if isinstance(indices, Tensor):
        return indices
    arr = np.asarray(indices)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"gather indices must be integers, got {arr.dtype} host data")
    return constant(arr.astype(np.int32))


def _gather(opdef: OpDef, what: str, t, indices, axis, amp, zero_OOR) -> Tensor:
    """`gather` and `tied_gather`: the op ``opdef`` (``what`` names it in errors)."""
    attrs = _gather_attrs(axis, zero_OOR, amp)
    if not zero_OOR:
        check_constant_indices(t, indices, int(axis), what)
    return create_op(opdef, [t, _index_tensor(indices, t)], attrs)[0]


def gather(
    t: Tensor,
    indices,
    axis: int = 0,
    available_memory_proportion: float | None = None,
    zero_OOR: bool = False,
) -> Tensor:
    """Select slices of ``t`` along ``axis`` at ``indices`` (numpy ``take``)."""
    return _gather(GATHER, "gather", t, indices, axis, available_memory_proportion, zero_OOR)


def tied_gather(
    t: Tensor,
    indices,
    axis: int = 0,
    available_memory_proportion: float | None = None,
    zero_OOR: bool = False,
) -> Tensor:
    """`gather` for a weight shared with a matmul (a TiedGather op)."""
    amp = available_memory_proportion
    return _gather(TIED_GATHER, "tied_gather", t, indices, axis, amp, zero_OOR)
