"""Matrix multiplication with numpy semantics (1-D promotion, batched, broadcast batch dims)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from .. import dtypes
from ..sim.speed import declare
from ..tensor import Tensor
from ._utils import broadcast_shapes, coerce_pair, rand, same_dtype, spec, unbroadcast
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["matmul", "runs_unpadded"]

_PARTIALS = {
    None: None,
    "float": "float",
    "half": "half",
    dtypes.float32: "float",
    dtypes.float16: "half",
}


def _promote(lhs: tuple[int, ...], rhs: tuple[int, ...]):
    """numpy's 1-D promotion: a 1-D lhs is a row (1, K), a 1-D rhs a column (K, 1)."""
    return ((1, *lhs) if len(lhs) == 1 else lhs), ((*rhs, 1) if len(rhs) == 1 else rhs)


def matmul_shape(lhs: tuple[int, ...], rhs: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of ``lhs @ rhs``; ValueError naming both shapes if they do not fit."""
    if not lhs or not rhs:
        raise ValueError(f"matmul needs tensors of rank >= 1, got shapes {lhs} and {rhs}")
    a, b = _promote(lhs, rhs)
    if a[-1] != b[-2]:
        raise ValueError(
            f"inner dimensions do not match: lhs shape {lhs} has {a[-1]} columns "
            f"but rhs shape {rhs} has {b[-2]} rows"
        )
    try:
        batch = broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise ValueError(
            f"batch dimensions of lhs shape {lhs} and rhs shape {rhs} cannot be broadcast together"
        ) from None
    rows = () if len(lhs) == 1 else (a[-2],)
    cols = () if len(rhs) == 1 else (b[-1],)
    return (*batch, *rows, *cols)


def _infer(ins, output_type, partials_type, available_memory_proportion):
    same_dtype(*ins)
    return [spec(matmul_shape(ins[0].shape, ins[1].shape), output_type or ins[0].dtype)]


# The "ipu" kernel pads rows to a multiple of ROW_BLOCK and columns up to MIN_COLS (`_kernel`).
ROW_BLOCK, MIN_COLS = 8, 16
# ATen's batched matmul computes a product of fewer than this many multiply-adds per batch
# entry with its own loop instead of the BLAS (aten/native/LinearAlgebra.cpp, bmm_out_or_
# baddbmm_): a few padded rows more keep every piece on the BLAS.
BMM_BLAS_MIN_WORK = 400


def _pad_to(x, dim: int, size: int):
    """``x`` with zeros appended along ``dim`` (-1 or -2) up to ``size`` (x if it is)."""
    extra = size - x.shape[dim]
    if extra <= 0:
        return x
    # aten's own op (F.pad's Python front adds ~3 us a call): zeros appended, the same bits
    return torch.constant_pad_nd(x, (0, extra) if dim == -1 else (0, 0, 0, extra))


def _padded_rows(rows: int, cols: int, depth: int, batched_rhs: bool) -> int:
    """The row count the "ipu" kernel computes ``rows`` rows with (``cols``: padded)."""
    padded = -(-rows // ROW_BLOCK) * ROW_BLOCK
    if batched_rhs:
        least = -(-BMM_BLAS_MIN_WORK // max(1, cols * depth))
        padded = max(padded, -(-least // ROW_BLOCK) * ROW_BLOCK)
    return padded


def runs_unpadded(lhs: tuple[int, ...], rhs: tuple[int, ...]) -> bool:
    """Whether the "ipu" kernel computes ``lhs @ rhs`` (shapes) as plain torch.matmul."""
    if len(lhs) < 2 or len(rhs) < 2 or rhs[-1] < MIN_COLS:
        return False
    return _padded_rows(lhs[-2], rhs[-1], lhs[-1], len(rhs) > 2) == lhs[-2]


def _kernel(a, b, output_type, partials_type, available_memory_proportion):
    """``Ir.numerics == "ipu"``: each output row independent of how many rows are computed.

    torch's float32 CPU matmul (MKL) picks its kernel by shape and splits rows between
    threads: a row of a 1-, 2- or 3-row product differs in the last bits from the same row
    of a 12-row one; with two threads, so does a row of a 5-, 6- or 7-row product; and in a
    product of fewer than 12 columns a row's bits depend on its position. Here the rows are
    padded with zeros to a multiple of `ROW_BLOCK` (and, in a batched product, to at least
    `BMM_BLAS_MIN_WORK` multiply-adds) and the columns up to `MIN_COLS`, the
    shapes in which each row is summed in the same order wherever it sits and however many
    there are: tests/test_numerics_invariance.py checks the bits of 1, 2, 3, 4 and 12-row
    pieces against the whole for many shapes, so a CPU or BLAS on which that does not hold
    fails a named test. Operands already of such sizes (a batch of 8 rows into 512 units)
    run torch.matmul unchanged: the cost is torch's. The float64 sum of the exact products
    rounded once (also row-invariant, except next to a rounding boundary) made the seed MLP's
    training step 3.9x slower at batch 8 (benchmarks/numerics_ab.py).
    """
    want = output_type.as_torch() if output_type is not None else a.dtype
    if not a.is_floating_point():
        return torch.matmul(a, b).to(want)
    lhs = a.unsqueeze(0) if a.dim() == 1 else a
    rhs = b.unsqueeze(-1) if b.dim() == 1 else b
    rows, cols = lhs.shape[-2], rhs.shape[-1]
    rhs = _pad_to(rhs, -1, MIN_COLS)
    lhs = _pad_to(lhs, -2, _padded_rows(rows, rhs.shape[-1], lhs.shape[-1], rhs.dim() > 2))
    out = torch.matmul(lhs, rhs)
    if out.shape[-2] != rows or out.shape[-1] != cols:
        out = out[..., :rows, :cols].contiguous()
    if a.dim() == 1:  # numpy's promotion undone: the row first, then the column
        out = out.squeeze(-2)
    if b.dim() == 1:
        out = out.squeeze(-1)
    return out.to(want)


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
        Sample(
            [rand(3, 4, seed=1), rand(4, 5, seed=2)],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="2d",
        ),
        Sample(
            [rand(2, 3, 4, seed=3), rand(2, 4, 5, seed=4)],
            lambda a, b: a @ b,
            torch.matmul,
            name="batched",
        ),
        Sample(
            [rand(2, 1, 3, 4, seed=5), rand(5, 4, 6, seed=6)],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="broadcast_batch",
        ),
        Sample(
            [rand(3, 4, seed=7), rand(2, 4, 5, seed=8)],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="broadcast_2d_lhs",
        ),
        Sample(
            [rand(4, seed=9), rand(2, 4, 5, seed=10)],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="vec_lhs",
        ),
        Sample(
            [rand(2, 3, 4, seed=11), rand(4, seed=12)],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="vec_rhs",
        ),
        Sample(
            [rand(4, seed=13), rand(4, seed=14)],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="dot",
        ),
        Sample(
            [rand(3, 4, seed=15, dtype=np.float16), rand(4, 2, seed=16, dtype=np.float16)],
            lambda a, b: matmul(a, b, output_type=dtypes.float32, partials_type="float"),
            lambda a, b: torch.matmul(a.float(), b.float()),
            name="fp16_out_fp32",
            rtol=1e-3,
            atol=1e-3,
        ),
        Sample(
            [rand(3, 4, seed=17, dtype=np.float16), rand(4, 2, seed=18, dtype=np.float16)],
            lambda a, b: matmul(a, b, available_memory_proportion=0.3),
            lambda a, b: torch.matmul(a.float(), b.float()).half(),
            name="fp16",
            rtol=1e-2,
            atol=1e-2,
        ),
        Sample(
            [
                np.arange(6, dtype=np.int32).reshape(2, 3),
                np.arange(12, dtype=np.int32).reshape(3, 4) - 5,
            ],
            lambda a, b: matmul(a, b),
            torch.matmul,
            name="int32",
            grad=False,
        ),
    ]


def _plain(op) -> bool:
    """The op's kernel is torch.matmul: "torch" numerics, or "ipu" numerics on shapes it
    does not pad (`runs_unpadded`), without an output type or with float32 (those kernels
    add a no-op ``.to(float32)``)."""
    if op.attrs.get("output_type") not in (None, dtypes.float32):
        return False
    if op.graph.ir.numerics == "torch":
        return True
    return runs_unpadded(tuple(op.inputs[0].shape), tuple(op.inputs[1].shape))


def _direct(op, ins, literal):
    """``speed.DIRECT`` (sim/direct.py): ``torch.matmul(a, b)`` where that is the kernel."""
    return f"torch.matmul({ins[0]}, {ins[1]})" if _plain(op) else None


def _transposed_kernel(op, numerics: str = "ipu"):
    """``speed.TRANSPOSED_KERNEL`` (sim/fuse.py): ``(a, b) -> (a @ b).T`` on matrices. Under
    "torch" numerics ``b.T @ a.T``, the call eager PyTorch makes for a linear layer's weight
    gradient (``grad_out.t().mm(input)``), a contiguous result; under "ipu" ``a @ b`` copied
    transposed: the bits of the unfused pair, whose rows do not depend on the row count
    (``b.T @ a.T`` would make them columns)."""
    base = op.opdef.kernel_for(numerics)
    kernel = functools.partial(base, **op.attrs) if op.attrs else base

    def matmul_t(a, b):
        return kernel(b.t(), a.t())

    def matmul_then_t(a, b):
        return kernel(a, b).t().contiguous()

    return matmul_then_t if numerics == "ipu" else matmul_t


MATMUL = register(
    OpDef(
        "MatMul",
        _infer,
        _kernel,
        grad=_grad,
        cost=_cost,
        samples=_samples,
        out_name="matmul_out",
        numerics_kernels={"torch": _torch_kernel},
    )
)
declare(MATMUL, direct=_direct, transposed_kernel=_transposed_kernel)


def matmul(
    lhs: Tensor,
    rhs: Tensor,
    available_memory_proportion: float | None = None,
    output_type: dtypes.dtype | None = None,
    partials_type: dtypes.dtype | str | None = None,
) -> Tensor:
    """``lhs @ rhs`` with numpy semantics; ``output_type`` sets the result dtype.

    Operands of different dtypes (float32 @ float16, say): PopART types a MatMul by its lhs
    (the output is lhs's dtype unless ``output_type`` says otherwise), so rhs is cast to
    lhs's dtype first, an explicit Cast op (its gradient comes back in rhs's dtype, as
    PopART's rhs gradient does). A float8 operand takes only float8 (`matmul_pow2scaled`).
    """
    if available_memory_proportion is not None and not 0 < available_memory_proportion <= 1:
        raise ValueError(
            "matmul: available_memory_proportion must be in (0, 1], got "
            f"{available_memory_proportion}."
        )
    if partials_type not in _PARTIALS:
        raise ValueError(
            f"matmul: partials_type must be float32/'float' or float16/'half', got "
            f"{partials_type!r}."
        )
    if output_type is not None and not isinstance(output_type, dtypes.dtype):
        output_type = dtypes.dtype.as_dtype(output_type)
    attrs = {
        "output_type": output_type,
        "partials_type": _PARTIALS[partials_type],
        "available_memory_proportion": available_memory_proportion,
    }
    lhs, rhs = coerce_pair(lhs, rhs)
    fp8 = (dtypes.float8_143, dtypes.float8_152)
    if lhs.dtype != rhs.dtype and lhs.dtype not in fp8 and rhs.dtype not in fp8:
        from . import cast

        rhs = cast(rhs, lhs.dtype)
    return create_op(MATMUL, [lhs, rhs], attrs)[0]
