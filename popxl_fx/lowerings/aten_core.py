"""Core ATen ops, for the decomposition fallback (``torch.ops.aten.*`` overload packets).

Each entry follows the ATen schema of every overload of its packet (``add.Tensor`` and
``add.Scalar`` take the same positional arguments); operands are promoted like torch's
(``bool * 3.0`` is float32). Only ops that survive the core-ATen decompositions and
functionalization have entries (``t``, ``reshape`` and ``clamp_min`` do not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops

from ..lowering import LoweringContext, lowers
from ._common import pdtype
from .aten_kernels import (
    eager_stride,
    lower_in_eager_layout,
    lower_with_torch_kernel,
    torch_kernel_when,
)

__all__: list = []

aten = torch.ops.aten


def _tensor(x: Any, like: popxl.Tensor | None = None) -> popxl.Tensor:
    if isinstance(x, popxl.Tensor):
        return x
    dtype = like.dtype if like is not None else popxl.float32
    return popxl.constant(np.asarray(x, dtype=dtype.as_numpy()), dtype)


def _pair(a: Any, b: Any) -> tuple[popxl.Tensor, popxl.Tensor]:
    """Both operands as tensors of torch's promoted dtype (bool * 3.0 is float32)."""
    promoted = torch.result_type(_probe(a), _probe(b))
    dtype = popxl.dtype.as_dtype(promoted)
    return _as(a, dtype), _as(b, dtype)


def _probe(x: Any) -> Any:
    # a one-element tensor stands for a popxl tensor: same promotion category (dimensioned)
    return torch.empty((1,), dtype=x.dtype.as_torch()) if isinstance(x, popxl.Tensor) else x


def _as(x: Any, dtype: popxl.dtype) -> popxl.Tensor:
    if isinstance(x, popxl.Tensor):
        return x if x.dtype == dtype else ops.cast(x, dtype)
    return popxl.constant(np.asarray(x, dtype=dtype.as_numpy()), dtype)


def _shape(x: popxl.Tensor, shape: Sequence[int]) -> tuple[int, ...]:
    shape = [int(s) for s in shape]
    if -1 in shape:  # the one free dimension takes what the others leave
        known = int(np.prod([s for s in shape if s != -1]))
        shape[shape.index(-1)] = x.nelms // known
    return tuple(shape)


@lowers(aten.view)
def _view(ctx: LoweringContext, x: popxl.Tensor, shape: Sequence[int]) -> popxl.Tensor:
    return ops.reshape(x, _shape(x, shape))


@lowers(aten.permute)
def _permute(ctx: LoweringContext, x: popxl.Tensor, dims: Sequence[int]) -> popxl.Tensor:
    return ops.transpose(x, [d % x.rank for d in dims])


@lowers(aten.clone, aten.lift_fresh_copy)
def _clone(ctx: LoweringContext, x: popxl.Tensor, **_: Any) -> popxl.Tensor:
    return x  # values are immutable in the lowered (functional) graph


@lowers(aten.add)
def _add(ctx: LoweringContext, a: Any, b: Any, alpha: float = 1) -> popxl.Tensor:
    a, b = _pair(a, b)
    return a + (b * alpha if alpha != 1 else b)


@lowers(aten.sub)
def _sub(ctx: LoweringContext, a: Any, b: Any, alpha: float = 1) -> popxl.Tensor:
    a, b = _pair(a, b)
    return a - (b * alpha if alpha != 1 else b)


@lowers(aten.mul)
def _mul(ctx: LoweringContext, a: Any, b: Any) -> popxl.Tensor:
    a, b = _pair(a, b)
    return a * b


@lowers(aten.div)
@torch_kernel_when(lambda rounding_mode, **_: rounding_mode is not None)  # rounds as eager
def _div(ctx: LoweringContext, a: Any, b: Any, rounding_mode: str | None = None) -> popxl.Tensor:
    if any(eager_stride(x) for x in ctx.node.args[:2]):
        # a strided view in eager (F.normalize of a head sliced from qkv, Swin V2): the
        # gradient of the broadcast divisor is summed in the layout autograd gives it there
        return lower_in_eager_layout(ctx, a, b)
    a, b = _pair(a, b)
    return a / b


def _unary(fn) -> Any:
    def lower(ctx: LoweringContext, x: popxl.Tensor) -> popxl.Tensor:
        return fn(x)

    return lower


for _packet, _fn in (
    (aten.sigmoid, ops.sigmoid),
    (aten.exp, ops.exp),
    (aten.log, ops.log),
    (aten.neg, ops.negate),
    (aten.abs, ops.abs),
    (aten.sqrt, ops.sqrt),
    (aten.tanh, ops.tanh),
    (aten.relu, ops.relu),
):
    lowers(_packet)(_unary(_fn))
# 1 / sqrt(x) and log(x + 1) round differently from torch's kernels: use those
lowers(aten.rsqrt, aten.log1p)(lower_with_torch_kernel)


@lowers(aten.pow)
def _pow(ctx: LoweringContext, x: Any, exponent: Any) -> popxl.Tensor:
    if not isinstance(x, popxl.Tensor):
        x = _tensor(x, exponent)
    return ops.pow(x, exponent)


def _dims(x: popxl.Tensor, dims: Any) -> list[int] | None:
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return None  # all dimensions
    return [d % max(x.rank, 1) for d in ([dims] if isinstance(dims, int) else dims)]


def _zero_dim(x: Any, **_: Any) -> bool:
    """popxl's reductions need an axis; torch's kernel keeps its rules for 0-d tensors."""
    return isinstance(x, popxl.Tensor) and x.rank == 0


def _reduce_input(x: popxl.Tensor, dtype: torch.dtype | None) -> popxl.Tensor:
    """torch casts the input of sum/mean to ``dtype`` before reducing; without one, sum
    accumulates bool and integer inputs in int64 (int32 here: the IPU has no 64-bit ints)."""
    if dtype is None and not x.dtype.is_floating_point:
        dtype = torch.int64
    if dtype is None:
        return x
    return x if x.dtype == pdtype(dtype) else ops.cast(x, pdtype(dtype))


def _complex(x: popxl.Tensor, **kwargs: Any) -> bool:
    """Casts to or from complex: popxl's Cast has no complex gradient; torch's kernel has."""
    dtype = kwargs.get("dtype")
    return x.dtype.as_torch().is_complex or (dtype is not None and dtype.is_complex)


@lowers(aten._to_copy)
@torch_kernel_when(lambda x, kwargs: _complex(x, **kwargs))
def _to_copy(ctx: LoweringContext, x: popxl.Tensor, **kwargs: Any) -> popxl.Tensor:
    """``Tensor.to(dtype)`` after decomposition; device, layout and memory format do not
    exist on the IPU."""
    dtype = kwargs.get("dtype")
    return x if dtype is None or pdtype(dtype) == x.dtype else ops.cast(x, pdtype(dtype))


@lowers(aten.sum)
@torch_kernel_when(_zero_dim)
def _sum(
    ctx: LoweringContext,
    x: popxl.Tensor,
    dim: Any = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> popxl.Tensor:
    return ops.sum(_reduce_input(x, dtype), _dims(x, dim), keepdim)


@lowers(aten.mean)
@torch_kernel_when(_zero_dim)
def _mean(
    ctx: LoweringContext,
    x: popxl.Tensor,
    dim: Any = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> popxl.Tensor:
    x = x if dtype is None else _reduce_input(x, dtype)  # torch: mean needs a float dtype
    return ops.mean(x, _dims(x, dim), keepdim)


def _compare(build) -> Any:
    def lower(ctx: LoweringContext, a: Any, b: Any) -> popxl.Tensor:
        return build(*_pair(a, b))

    return lower


_build: Callable[..., Any]  # the two loops below bind it to builders of two arities
for _packet, _build in (
    (aten.gt, ops.greater),
    (aten.lt, ops.less),
    (aten.eq, ops.equal),
    (aten.ge, lambda a, b: ops.logical_not(ops.less(a, b))),
    (aten.le, lambda a, b: ops.logical_not(ops.greater(a, b))),
):
    lowers(_packet)(_compare(_build))


@lowers(aten.where)
def _where(ctx: LoweringContext, cond: popxl.Tensor, a: Any, b: Any) -> popxl.Tensor:
    a, b = _pair(a, b)
    return ops.where(cond, a, b)


@lowers(aten.scalar_tensor)
def _scalar_tensor(
    ctx: LoweringContext, value: Any, dtype: torch.dtype | None = None, **_: Any
) -> popxl.Tensor:
    dt = popxl.dtype.as_dtype(dtype or torch.get_default_dtype())
    return popxl.constant(np.asarray(value, dtype=dt.as_numpy()), dt)


@lowers(aten.clamp)
def _clamp(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    x, low, high = (list(args) + [kwargs.get("min"), kwargs.get("max")])[:3]
    if kwargs or any(_computed(ctx, i, b) for i, b in ((1, low), (2, high))):
        return lower_with_torch_kernel(ctx, *args, **kwargs)  # computed bounds: torch's kernel
    return _clip(ctx, x, low, high)


def _clip(ctx: LoweringContext, x: popxl.Tensor, low: Any, high: Any) -> Any:
    # clip's kernel clamps exactly like torch.clamp (gradient included), so tensor bounds
    # that are constants of the ATen graph are read back as numbers.
    low, high = (_number(ctx, i, b) for i, b in ((1, low), (2, high)))
    low = float("-inf") if low is None else low
    return ops.clip(x, low, float("inf") if high is None else high)


def _computed(ctx: LoweringContext, position: int, bound: Any) -> bool:
    """A tensor bound that is not a constant of the ATen graph (clamp.Tensor)."""
    if not isinstance(bound, popxl.Tensor):
        return False
    source = ctx.node.args[position] if len(ctx.node.args) > position else None
    return getattr(source, "target", None) is not aten.scalar_tensor.default


def _number(ctx: LoweringContext, position: int, bound: Any) -> float | None:
    if not isinstance(bound, popxl.Tensor):
        return None if bound is None else float(bound)
    return float(ctx.node.args[position].args[0])


@lowers(aten.mm, aten.bmm)
def _mm(ctx: LoweringContext, a: popxl.Tensor, b: popxl.Tensor) -> popxl.Tensor:
    if any(eager_stride(x) for x in ctx.node.args):  # a transposed view in eager
        return lower_in_eager_layout(ctx, a, b)
    return a @ b


# BLAS accumulates the product into beta * bias: torch's own kernel, bit for bit, on the
# operands laid out as in eager
lowers(aten.addmm)(lower_in_eager_layout)


@lowers(aten.copy_)
def _copy_(ctx: LoweringContext, dst: popxl.Tensor, src: popxl.Tensor, *_: Any) -> popxl.Tensor:
    # Only the fallback's tagged writes are lowered: into a module's buffer, or into the
    # argument an in-place call updates (the driver rebinds that argument to the result).
    # Any other in-place copy would change a value the functional graph already used.
    if ctx.node.meta.get("self_update"):
        return src
    if "root_buffer_update" in ctx.node.meta:  # a model buffer passed to a function
        buffer = ctx.owner.variable(ctx.node.meta["root_buffer_update"])
        ops.var_updates.copy_var_update_(
            buffer, src if src.dtype == buffer.dtype else ops.cast(src, buffer.dtype)
        )
        return src
    name = ctx.node.meta.get("buffer_update")
    if name is None:
        what = ctx.node.meta.get("mutates", "an input")
        raise NotImplementedError(
            f"aten.copy_ into {what} (fx node '{ctx.node.name}') is an in-place update "
            "the simulated program cannot reproduce, which has no lowering."
        )
    ctx.update_buffer(name, src)
    return src


@lowers(aten.copy)
def _copy(ctx: LoweringContext, dst: popxl.Tensor, src: popxl.Tensor, *_: Any) -> Any:
    """The functional copy: ``src`` in ``dst``'s dtype, broadcast to ``dst``'s shape
    (torch has no derivative for aten.copy itself; this one's is expand's and cast's)."""
    value = src if src.dtype == dst.dtype else ops.cast(src, dst.dtype)
    return value if value.shape == dst.shape else ops.expand(value, dst.shape)


@lowers(aten.unsqueeze)
def _unsqueeze(ctx: LoweringContext, x: popxl.Tensor, dim: int) -> popxl.Tensor:
    return ops.unsqueeze(x, dim % (x.rank + 1))


@lowers(aten.squeeze)
def _squeeze(ctx: LoweringContext, x: popxl.Tensor, dims: Any = None) -> popxl.Tensor:
    # torch ignores listed dimensions whose size is not 1; popxl's squeeze rejects them.
    listed = range(x.rank) if dims is None else ([dims] if isinstance(dims, int) else dims)
    ones = [d % x.rank for d in listed if x.shape[d % x.rank] == 1]
    return ops.squeeze(x, ones) if ones else x


@lowers(aten.select)
def _select(ctx: LoweringContext, x: popxl.Tensor, dim: int, index: int) -> popxl.Tensor:
    dim, index = dim % x.rank, index % x.shape[dim % x.rank]
    part = ops.slice(x, start=[index], stop=[index + 1], axis=[dim])
    return ops.squeeze(part, [dim])


@lowers(aten.expand)
def _expand(ctx: LoweringContext, x: popxl.Tensor, shape: Sequence[int], **_: Any) -> Any:
    lead = len(shape) - x.rank  # -1 keeps the input's size (only allowed on its own dims)
    full = [x.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(shape)]
    return ops.expand(x, full)


@lowers(aten._softmax)
def _softmax(ctx: LoweringContext, x: popxl.Tensor, dim: int, half_to_float: bool) -> Any:
    return ops.softmax(x, dim % x.rank)


@lowers(aten.logical_not)
def _logical_not(ctx: LoweringContext, x: popxl.Tensor) -> popxl.Tensor:
    return ops.logical_not(x if x.dtype == popxl.bool else ops.cast(x, popxl.bool))


@lowers(aten.any)
@torch_kernel_when(_zero_dim)
def _any(ctx: LoweringContext, x: popxl.Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    counts = ops.sum(ops.cast(ops.cast(x, popxl.bool), popxl.int32), _dims(x, dim), keepdim)
    return ops.greater(counts, _tensor(0, counts))


@lowers(aten.full_like)
def _full_like(ctx: LoweringContext, x: popxl.Tensor, value: Any, **kwargs: Any) -> Any:
    dtype = kwargs.get("dtype")
    dt = popxl.dtype.as_dtype(dtype) if dtype is not None else x.dtype
    return popxl.constant(np.full(x.shape, value, dtype=dt.as_numpy()), dt)


def _logical(build, name: str) -> Any:
    def lower(ctx: LoweringContext, *args: Any) -> popxl.Tensor:
        tensors = [a for a in args if isinstance(a, popxl.Tensor)]
        if any(t.dtype != popxl.bool for t in tensors):  # integers: torch's bitwise kernel
            return lower_with_torch_kernel(ctx, *args)
        return build(*[_tensor(a, tensors[0]) for a in args])

    return lower


for _packet, _build, _name in (
    (aten.bitwise_and, ops.logical_and, "bitwise_and"),
    (aten.bitwise_or, ops.logical_or, "bitwise_or"),
    (aten.bitwise_not, ops.logical_not, "bitwise_not"),
):
    lowers(_packet)(_logical(_build, _name))
