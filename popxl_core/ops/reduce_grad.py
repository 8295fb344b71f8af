"""``ReduceSumGrad``: a reduced gradient broadcast back to the input's shape (times a scale),
the gradient of sum and mean (`popxl_core.ops.reduce`), and the reductions' shape rules."""

from __future__ import annotations

from collections.abc import Sequence

from ..tensor import Tensor
from ._utils import spec
from .registry import OpDef, create_op, register

__all__ = ["REDUCE_SUM_GRAD", "expand_reduced", "keep_shape", "reduced_shape"]


# shape rules -----------------------------------------------------------------------------
def keep_shape(shape: Sequence[int], axes: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with the reduced axes kept as size 1."""
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def reduced_shape(shape: Sequence[int], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return keep_shape(shape, axes)
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _expand_infer(ins, shape, axes, keepdims, scale):
    want = reduced_shape(shape, axes, keepdims)
    if tuple(ins[0].shape) != want:
        raise ValueError(f"gradient shape {ins[0].shape} does not match the reduced shape {want}")
    return [spec(shape, ins[0].dtype)]


def _expand_kernel(g, shape, axes, keepdims, scale):
    out = g.reshape(keep_shape(shape, axes)).expand(tuple(shape))  # a tuple: 0-d too
    return (out * scale).to(g.dtype) if scale != 1.0 else out.contiguous()


def _expand_kernel_torch(g, shape, axes, keepdims, scale):
    """``Ir.numerics == "torch"``: mean's gradient as eager's ``mean_backward`` computes it,
    the expanded gradient divided by the count (``grad.expand(shape) / n``); times ``1 / n``
    is another rounding where ``1 / n`` is inexact (n = 11: 1 ulp off)."""
    n = round(1.0 / scale) if scale else 0
    if scale == 1.0 or n == 0 or 1.0 / n != scale:  # not a mean's 1 / n: as the IPU does
        return _expand_kernel(g, shape, axes, keepdims, scale)
    return g.reshape(keep_shape(shape, axes)).expand(tuple(shape)) / n


def _expand_samples():
    from ._reduce_samples import expand_samples

    return expand_samples()


def _expand_grad(ctx):
    from .reduce import sum

    a = ctx.attrs
    g = sum(ctx.grad_output(0), a["axes"], a["keepdims"])
    if a["scale"] != 1.0:
        from . import mul

        g = mul(g, a["scale"])
    return [g]


REDUCE_SUM_GRAD = register(
    OpDef(
        "ReduceSumGrad",
        _expand_infer,
        _expand_kernel,
        grad=_expand_grad,
        samples=_expand_samples,
        out_name="reducesumgrad_out",
        numerics_kernels={"torch": _expand_kernel_torch},
    )
)


def expand_reduced(
    g: Tensor, shape: Sequence[int], axes: tuple[int, ...], keepdims: bool, scale: float = 1.0
) -> Tensor:
    """Broadcast a reduced tensor ``g`` back to ``shape`` (times ``scale``): sum's gradient."""
    attrs = {
        "shape": tuple(shape),
        "axes": tuple(axes),
        "keepdims": keepdims,
        "scale": float(scale),
    }
    return create_op(REDUCE_SUM_GRAD, [g], attrs)[0]
