"""Pooling (NC + 1 to 3 spatial dims, ONNX pads): AveragePool, MaxPool and their gradient ops.

Average pooling leaves the padding out of the divisor (ONNX ``count_include_pad=0``, the only
mode popxl exposes; the op attribute ``count_include_pad`` exists for the torch frontend).
Kernels pad explicitly and pool with torch, so any (asymmetric) ONNX padding works. The
gradient kernels differentiate the forward kernel with torch autograd, which keeps forward
and backward windows identical by construction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tensor import Tensor
from . import _pool_layout
from . import _spatial as sp
from ._dtype_rules import check_float
from ._pool_samples import avg_samples, grad_op_samples, max_samples
from ._utils import same_dtype, spec
from .registry import Cost, OpDef, create_op, register

__all__ = ["average_pool", "max_pool"]

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def _out_size(n, k, s, pb, pe, d, ceil_mode) -> int:
    ek = sp.effective_kernel(k, d)
    span = n + pb + pe - ek
    if span < 0 or pb >= ek or pe >= ek:
        raise ValueError(
            f"a pooling window of {ek} does not fit the input size {n} with pads "
            f"({pb}, {pe}) (pads must be smaller than the window)"
        )
    out = (-(-span // s) if ceil_mode else span // s) + 1
    # torch's and ONNX's rule: the last window must start inside the input or the begin pad
    if ceil_mode and (out - 1) * s >= n + pb:
        out -= 1
    return out


def _pool_infer(ins, kernel, strides, pads, ceil_mode, dilation=None, **_):
    x = ins[0]
    r = sp.check_rank(x.shape, "pooling")
    if len(kernel) != r:
        raise ValueError(
            f"kernel_size {tuple(kernel)} must have {r} values for the input {tuple(x.shape)}"
        )
    check_float(x, "the pooling input")
    dil = dilation or (1,) * r
    out = [
        _out_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[r + i], dil[i], ceil_mode)
        for i in range(r)
    ]
    return [spec((*x.shape[:2], *out), x.dtype)]


def _crop_to(y: torch.Tensor, sizes) -> torch.Tensor:
    for i, n in enumerate(sizes):
        y = y.narrow(2 + i, 0, n)
    return y


def _out_sizes(x, kernel, strides, pads, ceil_mode, dilation=None):
    r = len(kernel)
    dil = dilation or (1,) * r
    return [
        _out_size(x.shape[2 + i], kernel[i], strides[i], pads[i], pads[r + i], dil[i], ceil_mode)
        for i in range(r)
    ]


def _sum_pool(x, kernel, strides, ceil_mode):
    if len(kernel) == 1:
        y = F.avg_pool2d(
            x.unsqueeze(-2), (1, kernel[0]), (1, strides[0]), 0, ceil_mode, divisor_override=1
        )
        return y.squeeze(-2)
    pool = F.avg_pool2d if len(kernel) == 2 else F.avg_pool3d
    return pool(x, kernel, strides, 0, ceil_mode, divisor_override=1)


def _avg_kernel(x, kernel, strides, pads, ceil_mode, count_include_pad=False):
    sums = _sum_pool(sp.prepad(x, pads), kernel, strides, ceil_mode)
    ones = x.new_ones((1, 1, *x.shape[2:]))
    counts = _sum_pool(
        sp.prepad(ones, pads, 1.0 if count_include_pad else 0.0), kernel, strides, ceil_mode
    )
    return _crop_to(sums / counts, _out_sizes(x, kernel, strides, pads, ceil_mode))


def _native_pads(kernel, pads, dilation) -> bool:
    """Pads torch's max pooling applies itself (implicit -inf): symmetric and at most half
    the effective window, where its output size rule is `_out_size`'s."""
    r = len(kernel)
    return sp.is_symmetric(pads) and all(
        pads[i] <= sp.effective_kernel(kernel[i], dilation[i]) // 2 for i in range(r)
    )


def _max_kernel(x, kernel, strides, pads, ceil_mode, dilation):
    r = len(kernel)
    dil = dilation or (1,) * r
    if _native_pads(kernel, pads, dil):  # no padded copy of x
        if r == 2:  # channels-last where that is faster: the same bits (_pool_layout.py)
            return _pool_layout.max_pool2d(x, kernel, strides, pads[:r], dil, ceil_mode)
        return _MAX_POOL[r](x, kernel, strides, pads[:r], dil, ceil_mode)
    xp = sp.prepad(x, pads, float("-inf"))
    y = _MAX_POOL[r](xp, kernel, strides, 0, dil, ceil_mode)
    return _crop_to(y, _out_sizes(x, kernel, strides, pads, ceil_mode, dil))


def _vjp(fn, x, dy, attrs):
    x = x.detach().requires_grad_()
    with torch.enable_grad():
        return torch.autograd.grad(fn(x, **attrs), x, dy)[0]


def _avg_grad_kernel(dy, input_shape, **attrs):
    return _vjp(_avg_kernel, dy.new_zeros(input_shape), dy, attrs)


def _max_grad_kernel(dy, x, **attrs):
    kernel, strides, pads = attrs["kernel"], attrs["strides"], attrs["pads"]
    dil = attrs.get("dilation") or (1,) * len(kernel)
    if len(kernel) == 2 and _native_pads(kernel, pads, dil):
        # the two kernels autograd would run, without recording a graph to run them
        args = (kernel, strides, pads[:2], dil, attrs["ceil_mode"])
        _, idx = _pool_layout.max_pool2d_with_indices(x, *args)
        return torch.ops.aten.max_pool2d_with_indices_backward(dy, x, *args, idx)
    return _vjp(_max_kernel, x, dy, attrs)


def _pool_cost(ins, outs, attrs) -> Cost:
    """One flop per window element of every pooled value (dy is pooled-shaped in the grads)."""
    pooled = outs[0] if "input_shape" not in attrs and len(ins) == 1 else ins[0]
    window = 1
    for k in attrs["kernel"]:
        window *= k
    nbytes = sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs)
    return Cost(pooled.nelms * window, nbytes)


def _avg_grad_infer(ins, input_shape, **_):
    return [spec(input_shape, ins[0].dtype)]


def _max_grad_infer(ins, **_):
    same_dtype(*ins)
    return [ins[1]]


def _avg_grad(ctx):
    attrs = {"input_shape": ctx.op.inputs[0].shape, **ctx.attrs}
    return [create_op(AVERAGE_POOL_GRAD, [ctx.grad_output(0)], attrs)[0]]


def _max_grad(ctx):
    return [create_op(MAX_POOL_GRAD, [ctx.grad_output(0), ctx.input(0)], dict(ctx.attrs))[0]]


AVERAGE_POOL = register(
    OpDef(
        "AveragePool",
        _pool_infer,
        _avg_kernel,
        grad=_avg_grad,
        cost=_pool_cost,
        samples=avg_samples,
        out_name="average_pool_out",
    )
)
AVERAGE_POOL_GRAD = register(
    OpDef(
        "AveragePoolGrad",
        _avg_grad_infer,
        _avg_grad_kernel,
        cost=_pool_cost,
        samples=lambda: grad_op_samples("avg"),
        out_name="average_pool_grad_out",
    )
)
MAX_POOL = register(
    OpDef(
        "MaxPool",
        _pool_infer,
        _max_kernel,
        grad=_max_grad,
        cost=_pool_cost,
        samples=max_samples,
        out_name="max_pool_out",
    )
)
MAX_POOL_GRAD = register(
    OpDef(
        "MaxPoolGrad",
        _max_grad_infer,
        _max_grad_kernel,
        cost=_pool_cost,
        samples=lambda: grad_op_samples("max"),
        out_name="max_pool_grad_out",
    )
)


def _pool_attrs(op, t, kernel_size, stride, padding, dilation, auto_pad, ceil_mode):
    r = sp.check_rank(t.shape, op)
    kernel = sp.spatial_tuple(kernel_size, r, f"{op} kernel_size", 0)
    # PopXL's default stride is 1 in every spatial dim (not the kernel size, as in torch)
    strides = sp.spatial_tuple(1 if stride is None else stride, r, f"{op} stride", 1)
    dil = sp.spatial_tuple(dilation, r, f"{op} dilation", 1)
    pads = sp.spatial_tuple(padding, 2 * r, f"{op} padding", 0)
    if min(kernel) < 1 or min(strides) < 1 or min(dil) < 1 or min(pads) < 0:
        raise ValueError(
            f"{op}: kernel_size, stride and dilation must be >= 1 and padding "
            f">= 0, got {kernel}, {strides}, {dil}, {pads}"
        )
    pads = sp.auto_pads(auto_pad, t.shape[2:], kernel, strides, dil, pads)
    return {"kernel": kernel, "strides": strides, "pads": pads, "ceil_mode": bool(ceil_mode)}, dil


def _check_unsupported(op, out_pads, in_dilations) -> None:
    if out_pads is not None and any(out_pads):
        raise ValueError(f"{op}: out_pads {tuple(out_pads)} is not supported (only zeros)")
    if in_dilations is not None and any(d != 1 for d in in_dilations):
        raise ValueError(f"{op}: in_dilations {tuple(in_dilations)} is not supported (only ones)")


def average_pool(
    t: Tensor,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...] | None = None,
    padding: tuple[int, ...] | None = None,
    out_pads: tuple[int, ...] | None = None,
    dilation: tuple[int, ...] | None = None,
    in_dilations: tuple[int, ...] | None = None,
    auto_pad: str = "not_set",
    ceil_mode: bool = False,
) -> Tensor:
    """Average over windows of ``kernel_size`` (stride defaults to 1, as in popxl, unlike
    torch); padding, in ONNX order, is not counted in the divisor."""
    _check_unsupported("average_pool", out_pads, in_dilations)
    attrs, dil = _pool_attrs(
        "average_pool", t, kernel_size, stride, padding, dilation, auto_pad, ceil_mode
    )
    if any(d != 1 for d in dil):
        raise ValueError(f"average_pool: dilation {dil} is not supported (only ones)")
    return create_op(AVERAGE_POOL, [t], attrs)[0]


def max_pool(
    t: Tensor,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...] | None = None,
    padding: tuple[int, ...] | None = None,
    out_pads: tuple[int, ...] | None = None,
    dilation: tuple[int, ...] | None = None,
    in_dilations: tuple[int, ...] | None = None,
    auto_pad: str = "not_set",
    ceil_mode: bool = False,
    storage_order: str = "row",
) -> Tensor:
    """Maximum over (dilated) windows of ``kernel_size`` (stride defaults to 1, as in popxl);
    padding, in ONNX order, never wins. ``storage_order`` only affects indices, which popxl
    does not return."""
    _check_unsupported("max_pool", out_pads, in_dilations)
    if storage_order not in ("row", "column"):
        raise ValueError(
            f"max_pool: storage_order must be 'row' or 'column', got {storage_order!r}"
        )
    attrs, dil = _pool_attrs(
        "max_pool", t, kernel_size, stride, padding, dilation, auto_pad, ceil_mode
    )
    return create_op(MAX_POOL, [t], {**attrs, "dilation": dil})[0]
