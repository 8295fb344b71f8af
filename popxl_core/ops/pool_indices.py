"""2-D max pooling that hands its argmax indices to its gradient: MaxPoolWithIndices and
MaxPoolIndicesGrad, eager PyTorch's own pair (``max_pool2d_with_indices`` and its backward).

``MaxPool``'s gradient op recomputes the indices from its input, so a training step pools
every window twice; eager autograd keeps the indices of the one forward. popxl_fx lowers
``F.max_pool2d`` to this pair where torch applies the pads itself (symmetric, at most half the
window): the forward outputs ``(y, indices)`` (int64, y's shape) and the gradient op reads them.
Where nothing reads the indices (inference), the forward runs torch's ``max_pool2d`` alone
(a dead-output kernel, `sim/variants.py`). Same kernels as eager training: the same bits.
PopXL's public ``ops.max_pool`` keeps its one-output MaxPool op.
"""

from __future__ import annotations

import torch

from .. import dtypes
from ..sim.speed import declare
from ..tensor import Tensor
from . import _pool_layout
from ._utils import rand, spec
from .pool import MAX_POOL, _native_pads, _pool_attrs, _pool_cost
from .registry import OpDef, Sample, create_op, register

__all__ = ["max_pool2d_with_indices", "native_max_pool2d", "torch_applies_pads"]

_aten = torch.ops.aten


def torch_applies_pads(kernel, pads, dilation) -> bool:
    """``pads`` (ONNX order) are ones torch's pooling applies itself."""
    return _native_pads(kernel, pads, dilation)


def native_max_pool2d(x: Tensor, attrs: dict) -> bool:
    """Whether ``attrs`` (MaxPool's) describe a 2-D pool whose pads torch applies itself."""
    kernel = attrs["kernel"]
    return (
        len(kernel) == 2
        and len(x.shape) == 4
        and _native_pads(kernel, attrs["pads"], attrs["dilation"])
    )


def _args(kernel, strides, pads, ceil_mode, dilation) -> tuple:
    return (list(kernel), list(strides), list(pads[:2]), list(dilation), ceil_mode)


def _infer(ins, **attrs):
    (y,) = MAX_POOL.infer(ins, **attrs)
    return [y, spec(y.shape, dtypes.int64)]


def _kernel(x, **attrs):
    return _pool_layout.max_pool2d_with_indices(x, *_args(**attrs))


def _values_only(x, **attrs):
    """The indices are dead: eager's inference kernel, the same maxima."""
    return _pool_layout.max_pool2d(x, *_args(**attrs)), None


def _grad_infer(ins, **_):
    return [ins[1]]


def _grad_kernel(dy, x, indices, **attrs):
    return _aten.max_pool2d_with_indices_backward(dy, x, *_args(**attrs), indices)


def _grad(ctx):
    ins = [ctx.grad_output(0), ctx.input(0), ctx.output(1)]
    return [create_op(MAX_POOL_INDICES_GRAD, ins, dict(ctx.attrs))[0]]


_CASES = [  # x, kernel, strides, pads (symmetric, at most half the window), ceil_mode
    (rand(2, 3, 8, 8, seed=150), (3, 3), (2, 2), (1, 1, 1, 1), False),  # resnet's stem pool
    (rand(1, 2, 7, 6, seed=151), (2, 2), (2, 2), (0, 0, 0, 0), True),
]


def _attrs(k, s, p, ceil) -> dict:
    return {"kernel": k, "strides": s, "pads": p, "ceil_mode": ceil, "dilation": (1, 1)}


def _samples():
    out = []
    for i, (x, k, s, p, ceil) in enumerate(_CASES):
        attrs = _attrs(k, s, p, ceil)

        def build(x, attrs=attrs):
            return create_op(MAX_POOL_WITH_INDICES, [x], attrs)[0]

        def ref(x, k=k, s=s, p=p, ceil=ceil):
            return torch.nn.functional.max_pool2d(x, k, s, p[:2], 1, ceil)

        out.append(Sample([x], build, ref, rtol=0.0, atol=0.0, name=f"case{i}"))
    return out


def _grad_samples():
    out = []
    for i, (x, k, s, p, ceil) in enumerate(_CASES):
        attrs = _attrs(k, s, p, ceil)
        y_shape = _kernel(torch.from_numpy(x), **attrs)[0].shape
        dy = rand(*y_shape, seed=160 + i)

        def build(dy, x, attrs=attrs):
            _, idx = create_op(MAX_POOL_WITH_INDICES, [x], attrs)
            return create_op(MAX_POOL_INDICES_GRAD, [dy, x, idx], attrs)[0]

        def ref(dy, x, k=k, s=s, p=p, ceil=ceil):  # eager autograd
            x = x.detach().requires_grad_()
            with torch.enable_grad():
                y = torch.nn.functional.max_pool2d(x, k, s, p[:2], 1, ceil)
                return torch.autograd.grad(y, x, dy)[0]

        out.append(Sample([dy, x], build, ref, grad=False, rtol=0.0, atol=0.0, name=f"case{i}"))
    return out


MAX_POOL_WITH_INDICES = register(
    OpDef(
        "MaxPoolWithIndices",
        _infer,
        _kernel,
        grad=_grad,
        cost=_pool_cost,
        samples=_samples,
        out_name="max_pool_out",
    )
)
declare(MAX_POOL_WITH_INDICES, dead_output_kernels={frozenset({1}): _values_only})
MAX_POOL_INDICES_GRAD = register(
    OpDef(
        "MaxPoolIndicesGrad",
        _grad_infer,
        _grad_kernel,
        cost=_pool_cost,
        samples=_grad_samples,
        out_name="max_pool_grad_out",
    )
)


def max_pool2d_with_indices(
    t: Tensor, kernel, stride, padding, dilation, ceil_mode: bool
) -> Tensor:
    """torch's 2-D max pooling (``padding`` in ONNX order, symmetric, at most half the
    window) as MaxPoolWithIndices; returns the pooled values (the indices are the op's
    second output, read by its gradient)."""
    attrs, dil = _pool_attrs("max_pool", t, kernel, stride, padding, dilation, "not_set", ceil_mode)
    attrs = {**attrs, "dilation": dil}
    if not native_max_pool2d(t, attrs):
        raise ValueError(
            f"max_pool2d_with_indices: pads {attrs['pads']} for kernel {attrs['kernel']} are "
            "not ones torch applies itself (symmetric, at most half the window); use ops.max_pool."
        )
    return create_op(MAX_POOL_WITH_INDICES, [t], attrs)[0]
