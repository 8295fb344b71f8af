"""Matrix multiplication with numpy semantics (1-D promotion, batched, broadcast batch dims)."""

from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..tensor import Tensor
from ._utils import broadcast_shapes, coerce_pair, rand, same_dtype, spec, unbroadcast
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["matmul"]

_PARTIALS = {None: None, "float": "float", "half": "half", dtypes.float32: "float",
             dtypes.float16: "half"}


def _promote(lhs: tuple[int, ...], rhs: tuple[int, ...]):
    """numpy's 1-D promotion: a 1-D lhs is a row (1, K), a 1-D rhs a column (K, 1)."""
    return ((1, *lhs) if len(lhs) == 1 else lhs), ((*rhs, 1) if len(rhs) == 1 else rhs)


def matmul_shape(lhs: tuple[int, ...], rhs: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of ``lhs @ rhs``; ValueError naming both shapes if they do not fit."""
    if not lhs or not rhs:
        raise ValueError(f"matmul needs tensors of rank >= 1, got shapes {lhs} and {rhs}")
    a, b = _promote(lhs, rhs)
    if a[-1] != b[-2]:
        raise ValueError(f"inner dimensions do not match: lhs shape {lhs} has {a[-1]} columns "
                         f"but rhs shape {rhs} has {b[-2]} rows")
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise ValueError(f"batch dimensions of lhs shape {lhs} and rhs shape {rhs} cannot be "
                         "broadcast together") from None
    rows = () if len(lhs) == 1 else (a[-2],)
    cols = () if len(rhs) == 1 else (b[-1],)
    return (*batch, *rows, *cols)


def _infer(ins, output_type, partials_type, available_memory_proportion):
    same_dtype(*ins)
    return [spec(matmul_shape(ins[0].shape, ins[1].shape), output_type or ins[0].dtype)]


def _kernel(a, b, output_type, partials_type, available_memory_proportion):
    """``Ir.numerics == "ipu"``: every output element independent of the batch size.

    The products of two float32 (or float16, arriving as float32 by OpDef.fp16_in_fp32)
    numbers are exact in float64, and any order of their float64 sum is within about
    K * 2**-53 (relative to sum |a*b|) of the exact value, so rounding it once to float32
    gives the same element whichever BLAS kernel torch picked for the shape (MKL picks by the
    number of rows), unless the exact sum lies that close to a float32 rounding boundary.
    torch's float32 kernel differs between row counts by an ulp or more (12 rows against 3
    of an (M, 8) @ (8, 16) product: 58 of 96 elements of two chained products).
    """
    want = output_type.as_torch() if output_type is not None else a.dtype
    if not a.is_floating_point():
        return torch.matmul(a, b).to(want)
    return torch.matmul(a.double(), b.double()).to(want)


def _torch_kernel(a, b, output_type, partials_type, available_memory_proportion):
    """``Ir.numerics == "torch"``: torch's float32 kernel, bit for bit eager PyTorch's."""
    out = torch.matmul(a, b)
    want = output_type.as_torch() if output_type is not None else a.dtype
    return out.to(want)


def _cost(ins, outs, attrs) -> Cost:
    a, b = _promote(ins[0].shape, ins[1].shape)
    batch = int(np.prod(broadcast_shapes(a[:-2], b[:-2]), dtype=np.int64))
    flops = 2 * a[-2] * a[-1] * b[-1] * batch
    return Cost(flops, ins[0].nbytes + ins[1].nbytes + outs[0].nbytes)


def _swap_last(t: Tensor) -> Tensor:
    from . import transpose

    perm = [*range(t.rank - 2), t.rank - 1, t.rank - 2]
    return transpose(t, perm)


def _grad(ctx):
    """dA = G @ B^T, dB = A^T @ G on the promoted shapes, summed over broadcast batch dims."""
    from . import cast, reshape

    lhs, rhs = ctx.op.inputs
    g = ctx.grad_output(0)
    if g.dtype != lhs.dtype:  # output_type changed the dtype: differentiate in the input's
        g = cast(g, lhs.dtype)
    a_shape, b_shape = _promote(lhs.shape, rhs.shape)
    a, b = ctx.input(0), ctx.input(1)
    a = reshape(a, a_shape) if a.shape != a_shape else a
    b = reshape(b, b_shape) if b.shape != b_shape else b
    batch = broadcast_shapes(a_shape[:-2], b_shape[:-2])
    g_shape = (*batch, a_shape[-2], b_shape[-1])
    g = reshape(g, g_shape) if g.shape != g_shape else g
    grads = [None, None]
    if ctx.requires_grad(0):
        grads[0] = _fit(matmul(g, _swap_last(b)), a_shape, lhs.shape)
    if ctx.requires_grad(1):
        grads[1] = _fit(matmul(_swap_last(a), g), b_shape, rhs.shape)
    return grads


def _fit(g: Tensor, promoted: tuple[int, ...], shape: tuple[int, ...]) -> Tensor:
    """Sum the broadcast batch dims of ``g``, then undo the 1-D promotion."""
    from . import reshape

    g = unbroadcast(g, promoted)
    return reshape(g, shape) if g.shape != tuple(shape) else g


def _samples():
    return [
        Sample([rand(3, 4, seed=1), rand(4, 5, seed=2)], lambda a, b: matmul(a, b), torch.matmul,
               name="2d"),
        Sample([rand(2, 3, 4, seed=3), rand(2, 4, 5, seed=4)], lambda a, b: a @ b, torch.matmul,
               name="batched"),
        Sample([rand(2, 1, 3, 4, seed=5), rand(5, 4, 6, seed=6)], lambda a, b: matmul(a, b),
               torch.matmul, name="broadcast_batch"),
        Sample([rand(3, 4, seed=7), rand(2, 4, 5, seed=8)], lambda a, b: matmul(a, b),
               torch.matmul, name="broadcast_2d_lhs"),
        Sample([rand(4, seed=9), rand(2, 4, 5, seed=10)], lambda a, b: matmul(a, b),
               torch.matmul, name="vec_lhs"),
        Sample([rand(2, 3, 4, seed=11), rand(4, seed=12)], lambda a, b: matmul(a, b),
               torch.matmul, name="vec_rhs"),
        Sample([rand(4, seed=13), rand(4, seed=14)], lambda a, b: matmul(a, b), torch.matmul,
               name="dot"),
        Sample([rand(3, 4, seed=15, dtype=np.float16), rand(4, 2, seed=16, dtype=np.float16)],
               lambda a, b: matmul(a, b, output_type=dtypes.float32, partials_type="float"),
               lambda a, b: torch.matmul(a.float(), b.float()), name="fp16_out_fp32",
               rtol=1e-3, atol=1e-3),
        Sample([rand(3, 4, seed=17, dtype=np.float16), rand(4, 2, seed=18, dtype=np.float16)],
               lambda a, b: matmul(a, b, available_memory_proportion=0.3),
               lambda a, b: torch.matmul(a.float(), b.float()).half(), name="fp16",
               rtol=1e-2, atol=1e-2),
        Sample([np.arange(6, dtype=np.int32).reshape(2, 3),
                np.arange(12, dtype=np.int32).reshape(3, 4) - 5],
               lambda a, b: matmul(a, b), torch.matmul, name="int32", grad=False),
    ]


MATMUL = register(OpDef("MatMul", _infer, _kernel, grad=_grad, cost=_cost, samples=_samples,
                        out_name="matmul_out", numerics_kernels={"torch": _torch_kernel}))


def matmul(lhs: Tensor, rhs: Tensor, available_memory_proportion: float | None = None,
           output_type: dtypes.dtype | None = None, partials_type: dtypes.dtype | str | None = None
           ) -> Tensor:
    """``lhs @ rhs`` with numpy semantics; ``output_type`` sets the result dtype."""
    if available_memory_proportion is not None and not 0 < available_memory_proportion <= 1:
        raise ValueError("matmul: available_memory_proportion must be in (0, 1], got "
                         f"{available_memory_proportion}.")
    if partials_type not in _PARTIALS:
        raise ValueError(f"matmul: partials_type must be float32/'float' or float16/'half', got "
                         f"{partials_type!r}.")
    if output_type is not None and not isinstance(output_type, dtypes.dtype):
        output_type = dtypes.dtype.as_dtype(output_type)
    attrs = {"output_type": output_type, "partials_type": _PARTIALS[partials_type],
             "available_memory_proportion": available_memory_proportion}
    return create_op(MATMUL, list(coerce_pair(lhs, rhs)), attrs)[0]
