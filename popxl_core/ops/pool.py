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
from . import _spatial as sp
from ._dtype_rules import check_float
from ._utils import rand, same_dtype, spec
from .registry import Cost, OpDef, Sample, create_op, register

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
        _, idx = torch.ops.aten.max_pool2d_with_indices(x, *args)
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


def _ref_avg(kernel, strides, pads, ceil_mode=False):
    """torch's own average pool where it can express the pads; else sum / count by hand."""
    r = len(kernel)
    if sp.is_symmetric(pads):
        pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[r]
        return lambda x: pool(x, kernel, strides, pads[:r], ceil_mode, count_include_pad=False)
    unfold = torch.nn.Unfold(kernel, stride=strides)

    def ref(x):  # 2-D only
        xp = F.pad(x, sp.torch_pads(pads))
        ones = F.pad(torch.ones_like(x), sp.torch_pads(pads))
        n, c = x.shape[:2]
        out = [
            (x.shape[2 + i] + pads[i] + pads[r + i] - kernel[i]) // strides[i] + 1 for i in range(r)
        ]
        sums = unfold(xp.reshape(n * c, 1, *xp.shape[2:])).sum(1)
        counts = unfold(ones.reshape(n * c, 1, *xp.shape[2:])).sum(1)
        return (sums / counts).reshape(n, c, *out)

    return ref


def _avg_samples():
    S = Sample
    return [
        S(
            [rand(2, 3, 6, 7, seed=110)],
            lambda x: average_pool(x, (2, 3)),
            _ref_avg((2, 3), (1, 1), (0,) * 4),
            name="default_stride_1",
        ),
        S(
            [rand(2, 3, 6, 7, seed=116)],
            lambda x: average_pool(x, (2, 3), (2, 3)),
            _ref_avg((2, 3), (2, 3), (0,) * 4),
            name="stride_kernel",
        ),
        S(
            [rand(2, 3, 7, 7, seed=111)],
            lambda x: average_pool(x, (3, 3), (2, 2), (1, 1, 1, 1)),
            _ref_avg((3, 3), (2, 2), (1, 1, 1, 1)),
            name="padded",
        ),
        S(
            [rand(1, 2, 6, 5, seed=112)],
            lambda x: average_pool(x, (3, 2), (2, 1), (1, 0, 2, 1)),
            _ref_avg((3, 2), (2, 1), (1, 0, 2, 1)),
            name="asym",
        ),
        S(
            [rand(2, 2, 8, seed=113)],
            lambda x: average_pool(x, (3,), (2,), (1, 1), ceil_mode=True),
            _ref_avg((3,), (2,), (1, 1), True),
            name="1d_ceil",
        ),
        S(
            [rand(1, 2, 4, 5, 6, seed=114)],
            lambda x: average_pool(x, (2, 2, 3)),
            _ref_avg((2, 2, 3), (1, 1, 1), (0,) * 6),
            name="3d",
        ),
        S(
            [rand(2, 2, 5, 6, seed=115)],
            lambda x: create_op(
                AVERAGE_POOL,
                [x],
                {
                    "kernel": (3, 3),
                    "strides": (2, 2),
                    "pads": (1,) * 4,
                    "ceil_mode": True,
                    "count_include_pad": True,
                },
            )[0],
            lambda x: F.avg_pool2d(x, 3, 2, 1, True, count_include_pad=True),
            name="count_include_pad_ceil",
        ),
    ]


def _max_samples():
    S = Sample
    return [
        S(
            [rand(2, 3, 6, 7, seed=120)],
            lambda x: max_pool(x, (2, 2)),
            lambda x: F.max_pool2d(x, 2, 1),
            name="default_stride_1",
        ),
        S(
            [rand(2, 3, 6, 7, seed=125)],
            lambda x: max_pool(x, (2, 2), (2, 2)),
            lambda x: F.max_pool2d(x, 2),
            name="stride_kernel",
        ),
        S(
            [rand(2, 3, 9, 8, seed=121)],
            lambda x: max_pool(x, (3, 2), (2, 1), (1, 1, 1, 1), dilation=(2, 1)),
            lambda x: F.max_pool2d(x, (3, 2), (2, 1), 1, (2, 1)),
            name="dilated",
        ),
        S(
            [rand(1, 2, 7, seed=122)],
            lambda x: max_pool(x, (3,), (2,), (0, 2)),
            lambda x: F.max_pool1d(F.pad(x, (0, 2), value=float("-inf")), 3, 2),
            name="1d_asym",
        ),
        S(
            [rand(1, 2, 7, 6, seed=123)],
            lambda x: max_pool(x, (2, 2), (2, 2), ceil_mode=True),
            lambda x: F.max_pool2d(x, 2, ceil_mode=True),
            name="ceil",
        ),
        S(
            [rand(1, 2, 5, 5, seed=124)],
            lambda x: max_pool(x, (3, 3), (3, 3), auto_pad="same_upper"),
            lambda x: F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3),
            name="same_upper",
        ),
    ]


def _grad_op_samples(which):
    cases = [
        (rand(2, 3, 7, 6, seed=130), (3, 2), (2, 2), (1, 0, 1, 1), False),
        (rand(1, 2, 9, seed=131), (2,), (3,), (0, 1), True),
        # overlapping windows, pads torch applies itself (MaxPoolGrad's native path)
        (rand(2, 3, 6, 6, seed=132), (3, 3), (2, 2), (1, 1, 1, 1), True),
    ]
    out = []
    for i, (x, k, s, p, ceil) in enumerate(cases):
        attrs = {"kernel": k, "strides": s, "pads": p, "ceil_mode": ceil}
        if which == "max":
            attrs["dilation"] = (1,) * len(k)
        fwd = _max_kernel if which == "max" else _avg_kernel
        y_shape = fwd(torch.from_numpy(x), **attrs).shape
        dy = rand(*y_shape, seed=140 + i)

        def build(dy, x, attrs=attrs):
            if which == "max":
                return create_op(MAX_POOL_GRAD, [dy, x], attrs)[0]
            return create_op(AVERAGE_POOL_GRAD, [dy], {"input_shape": x.shape, **attrs})[0]

        def ref(dy, x, fwd=fwd, attrs=attrs):
            x = x.detach().requires_grad_()
            with torch.enable_grad():
                return torch.autograd.grad(fwd(x, **attrs), x, dy)[0]

        out.append(Sample([dy, x], build, ref, grad=False, name=f"case{i}"))
    return out


AVERAGE_POOL = register(
    OpDef(
        "AveragePool",
        _pool_infer,
        _avg_kernel,
        grad=_avg_grad,
        cost=_pool_cost,
        samples=_avg_samples,
        out_name="average_pool_out",
    )
)
AVERAGE_POOL_GRAD = register(
    OpDef(
        "AveragePoolGrad",
        _avg_grad_infer,
        _avg_grad_kernel,
        cost=_pool_cost,
        samples=lambda: _grad_op_samples("avg"),
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
        samples=_max_samples,
        out_name="max_pool_out",
    )
)
MAX_POOL_GRAD = register(
    OpDef(
        "MaxPoolGrad",
        _max_grad_infer,
        _max_grad_kernel,
        cost=_pool_cost,
        samples=lambda: _grad_op_samples("max"),
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
