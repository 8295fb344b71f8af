"""Index-producing reductions and scans: argmax, argmin, topk, cumsum."""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor
from ._utils import rand, spec
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["argmax", "argmin", "cumsum", "topk"]


def _axis(t: Tensor, axis: int, what: str) -> int:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a popxl.Tensor, got {type(t).__name__}.")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{what}: the axis must be an int, got {axis!r}.")
    if not -t.rank <= axis < t.rank:
        raise ValueError(f"{what}: axis {axis} is out of range for {t.id} of shape {t.shape}.")
    return int(axis) % t.rank


def _scan_cost(ins, outs, attrs) -> Cost:
    return Cost(ins[0].nelms, ins[0].nbytes + sum(o.nbytes for o in outs))


# ArgMax / ArgMin ---------------------------------------------------------------------------
def _arg_infer(ins, dim, keepdim):
    shape = ins[0].shape
    out = (
        tuple(1 if i == dim else s for i, s in enumerate(shape))
        if keepdim
        else tuple(s for i, s in enumerate(shape) if i != dim)
    )
    return [spec(out, dtypes.int32)]


def _arg_samples(fn, ref):
    xi = np.random.default_rng(402).permutation(12).reshape(3, 4).astype(np.int32)
    return lambda: [
        Sample([rand(3, 4, 5, seed=400)], lambda x: fn(x), lambda x: ref(x, 0).int(), name="dim0"),
        Sample(
            [rand(3, 4, 5, seed=401)],
            lambda x: fn(x, -1, True),
            lambda x: ref(x, -1, keepdim=True).int(),
            name="last_keepdim",
        ),
        Sample([xi], lambda x: fn(x, 1), lambda x: ref(x, 1).int(), name="int32"),
    ]


ARGMAX = register(
    OpDef(
        "ArgMax",
        _arg_infer,
        lambda x, dim, keepdim: torch.argmax(x, dim, keepdim).int(),
        cost=_scan_cost,
        out_name="argmax_out",
        samples=_arg_samples(lambda *a: argmax(*a), torch.argmax),
    )
)
ARGMIN = register(
    OpDef(
        "ArgMin",
        _arg_infer,
        lambda x, dim, keepdim: torch.argmin(x, dim, keepdim).int(),
        cost=_scan_cost,
        out_name="argmin_out",
        samples=_arg_samples(lambda *a: argmin(*a), torch.argmin),
    )
)


def argmax(t: Tensor, dim: int = 0, keepdim: bool = False) -> Tensor:
    """Index (int32) of the largest value along ``dim``; the first one on ties."""
    return create_op(ARGMAX, [t], {"dim": _axis(t, dim, "argmax"), "keepdim": bool(keepdim)})[0]


def argmin(t: Tensor, dim: int = 0, keepdim: bool = False) -> Tensor:
    """Index (int32) of the smallest value along ``dim``; the first one on ties."""
    return create_op(ARGMIN, [t], {"dim": _axis(t, dim, "argmin"), "keepdim": bool(keepdim)})[0]


# TopK ------------------------------------------------------------------------------------
def _topk_infer(ins, k, axis, largest, sorted, available_memory_proportion):
    shape = list(ins[0].shape)
    if not 1 <= k <= shape[axis]:
        raise ValueError(f"k={k} must be between 1 and the size {shape[axis]} of axis {axis}")
    shape[axis] = k
    return [spec(shape, ins[0].dtype), spec(shape, dtypes.int32)]


def _topk_kernel(x, k, axis, largest, sorted, available_memory_proportion):
    values, indices = torch.topk(x, k, dim=axis, largest=largest, sorted=sorted)
    return values, indices.int()


def _topk_grad(ctx):
    """The value gradients go back to the positions they were taken from."""
    from . import init, scatter

    g = ctx.grad_output(0)
    if g is None:
        return [None]
    x = ctx.op.inputs[0]
    zeros = init(x.shape, g.dtype, "zeros", "zero")
    return [scatter(zeros, ctx.output(1), g, ctx.attrs["axis"])]


def _topk_samples():
    def ref(x, k, axis, largest, sorted_):
        v, i = torch.topk(x, k, dim=axis, largest=largest, sorted=sorted_)
        return v, i.int()

    return [
        Sample(
            [rand(4, 6, seed=410)],
            lambda x: topk(x, 3, -1, True, True)[0],
            lambda x: ref(x, 3, -1, True, True)[0],
            name="largest_values",
        ),
        Sample(
            [rand(5, 3, seed=411)],
            lambda x: topk(x, 2, 0, False, True)[0],
            lambda x: ref(x, 2, 0, False, True)[0],
            name="smallest_axis0",
        ),
        Sample(
            [rand(3, 6, seed=412)],
            lambda x: topk(x, 4, 1, True, True),
            lambda x: ref(x, 4, 1, True, True),
            name="values_and_indices",
        ),
    ]


TOPK = register(
    OpDef(
        "TopK",
        _topk_infer,
        _topk_kernel,
        grad=_topk_grad,
        cost=_scan_cost,
        samples=_topk_samples,
        out_name="topk_out",
    )
)


def topk(
    t: Tensor,
    k: int,
    axis: int,
    largest: bool,
    sorted: bool,
    available_memory_proportion: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) values along ``axis`` and their int32 indices."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"topk: k must be an int, got {k!r}.")
    attrs = {
        "k": int(k),
        "axis": _axis(t, axis, "topk"),
        "largest": bool(largest),
        "sorted": bool(sorted),
        "available_memory_proportion": available_memory_proportion,
    }
    values, indices = create_op(TOPK, [t], attrs)
    return values, indices


# CumSum ------------------------------------------------------------------------------------
def _cumsum_kernel(x, dim, reverse):
    if reverse:
        return torch.flip(torch.cumsum(torch.flip(x, (dim,)), dim), (dim,)).to(x.dtype)
    return torch.cumsum(x, dim).to(x.dtype)


def _cumsum_grad(ctx):
    # Each input feeds every later (earlier, when reversed) output: a scan the other way.
    a = ctx.attrs
    return [_cumsum(ctx.grad_output(0), a["dim"], not a["reverse"])]


def _cumsum_samples():
    xi = np.arange(12, dtype=np.int32).reshape(3, 4) - 6
    return [
        Sample(
            [rand(4, 5, seed=420)], lambda x: cumsum(x), lambda x: torch.cumsum(x, 0), name="dim0"
        ),
        Sample(
            [rand(2, 3, 4, seed=421)],
            lambda x: cumsum(x, -1),
            lambda x: torch.cumsum(x, -1),
            name="last",
        ),
        Sample(
            [rand(2, 5, seed=422)],
            lambda x: _cumsum(x, 1, True),
            lambda x: torch.flip(torch.cumsum(torch.flip(x, (1,)), 1), (1,)),
            name="reverse",
        ),
        Sample([xi], lambda x: cumsum(x, 1), lambda x: torch.cumsum(x, 1).int(), name="int32"),
    ]


CUMSUM = register(
    OpDef(
        "CumSum",
        lambda ins, dim, reverse: [ins[0]],
        _cumsum_kernel,
        grad=_cumsum_grad,
        cost=_scan_cost,
        samples=_cumsum_samples,
        out_name="cumsum_out",
    )
)


def _cumsum(t: Tensor, dim: int, reverse: bool) -> Tensor:
    return create_op(CUMSUM, [t], {"dim": _axis(t, dim, "cumsum"), "reverse": reverse})[0]


def cumsum(t: Tensor, dim: int = 0) -> Tensor:
    """Running sum of ``t`` along ``dim``."""
    return _cumsum(t, dim, False)
