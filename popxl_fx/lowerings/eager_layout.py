"""A node's call as one op running torch's own kernel, as eager made the call: its tensor
arguments in the dtypes torch saw (`lower_call`), laid out in memory as eager's were and
flagged as requiring grad as eager's were (`EagerLayout`), where eager's rounding depends on
those (BLAS calls, at::matmul's folding, ATen's vectorised loops over a strided view).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

import popxl_core as popxl
from popxl_core.ops import Slot, aten_op

from ..lowering import LoweringContext

__all__ = [
    "EagerLayout",
    "eager_requires_grad",
    "eager_stride",
    "lower_as_eager_matmul",
    "lower_call",
    "lower_in_eager_layout",
    "lowering_in_eager_layout",
    "torch_kernel_in_eager_layout",
]


@dataclass(frozen=True)
class EagerLayout:
    """``fn`` with its tensor arguments first laid out in memory as eager's were (``strides``,
    one per positional argument, None: as it comes). The simulator's values are contiguous;
    a matrix product's BLAS call, and the one autograd makes for its backward from the same
    operands, round by the operands' layout (a transposed view is another kernel), so
    ``k.transpose(-2, -1)`` must reach ``bmm`` as the transposed view it is in eager.

    ``requires_grad`` (one flag per positional argument, or empty): the arguments that needed
    a gradient in eager are marked so here too, where the simulator's plain values do not
    (its forward runs without autograd): ``at::matmul`` folds ``w @ x`` of a matrix ``w`` and
    a batched ``x`` into one ``mm`` only when ``w`` requires grad, and batches it (``bmm`` of
    the expanded matrix, other bits) otherwise."""

    fn: Any
    strides: tuple
    requires_grad: tuple = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        laid = [_restride(a, s) for a, s in zip(args, self.strides)] + list(
            args[len(self.strides) :]
        )
        for i, flag in enumerate(self.requires_grad):
            a = laid[i]
            if flag and isinstance(a, torch.Tensor) and not a.requires_grad:
                laid[i] = a.detach().requires_grad_()  # a flag only: nothing differentiates it
        return self.fn(*laid, **kwargs)

    def __str__(self) -> str:
        return str(self.fn)

    def fake_parts(self) -> tuple:
        """What its shape rule's answer depends on (`popxl_core.ops.aten.fake_key`): the wrapped
        operator, and the layouts and flags it gives the arguments."""
        return self.fn, (self.strides, self.requires_grad)


def _restride(x: Any, stride: tuple | None) -> Any:
    if stride is None or not isinstance(x, torch.Tensor) or x.stride() == stride:
        return x
    size = 1 + sum((n - 1) * st for n, st in zip(x.shape, stride))
    return x.new_empty(size).as_strided(x.shape, stride).copy_(x)


def eager_stride(source: Any) -> tuple | None:
    """Eager's strides of a graph argument (fx ``example_value`` or ATen ``val``) where they
    are not the contiguous ones and no two elements share memory (a transposed, permuted or
    sliced view); None otherwise (the simulator's contiguous layout is eager's then, or an
    expanded view, which the kernel reads the same either way)."""
    if not isinstance(source, fx.Node):
        return None
    seen = source.meta.get("val", source.meta.get("example_value"))
    if not isinstance(seen, torch.Tensor) or seen.is_contiguous():
        return None
    return tuple(seen.stride()) if _no_overlap(seen.shape, seen.stride()) else None


def _no_overlap(shape: tuple, stride: tuple) -> bool:
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1)
    reach = 1  # elements spanned by the dims so far
    for st, n in dims:
        if st < reach:
            return False
        reach = st * n
    return True


def lower_in_eager_layout(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """The node's ATen call as one ``Aten`` op, the tensor arguments in eager's memory layout
    (`EagerLayout`): for the matrix products (``mm``, ``bmm``, ``addmm``), forward and
    backward."""
    strides = tuple(eager_stride(a) for a in ctx.node.args)
    if not any(strides):
        return lower_call(aten_op, ctx, args, kwargs)
    return lower_call(aten_op, ctx, args, kwargs, EagerLayout(ctx.node.target, strides))


def eager_requires_grad(source: Any) -> bool:
    """Whether a graph argument required grad in eager (its fx ``example_value``)."""
    if not isinstance(source, fx.Node):
        return False
    seen = source.meta.get("example_value", source.meta.get("val"))
    return isinstance(seen, torch.Tensor) and seen.requires_grad


def lower_as_eager_matmul(ctx: LoweringContext, fn: Any, a: Any, b: Any) -> Any:
    """``fn(a, b)`` (a matrix product) as one ``Aten`` op on eager's layouts and with eager's
    requires-grad flags (`EagerLayout`): the same BLAS calls forward and backward."""
    sources = ctx.node.args[:2]
    strides = tuple(eager_stride(x) for x in sources)
    flags = tuple(eager_requires_grad(x) for x in sources)
    return lower_call(aten_op, ctx, (a, b), {}, EagerLayout(fn, strides, flags))


def torch_kernel_in_eager_layout(ctx: LoweringContext, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as one ``Aten`` op, the node's positional tensor arguments laid
    out as eager's (`EagerLayout`). For elementwise kernels on a strided view in eager (a
    slice, a chunk, a transpose): ATen's vectorised loops run over the view's rows in memory
    order and compute each row's last elements with the scalar function (gelu, silu,
    sigmoid), so which element rounds which way depends on the layout."""
    strides = tuple(eager_stride(a) for a in ctx.node.args)
    return lower_call(aten_op, ctx, args, kwargs, EagerLayout(fn, strides))


def lowering_in_eager_layout(fn: Any) -> Callable[..., Any]:
    """A lowering like `lower_in_eager_layout` that runs ``fn`` instead of the node's target
    (a callable with its own shape rule on fake tensors, e.g. `moe.GroupedMM`)."""

    def lower(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        strides = tuple(eager_stride(a) for a in ctx.node.args)
        return lower_call(aten_op, ctx, args, kwargs, EagerLayout(fn, strides))

    return lower


def lower_call(
    make: Callable, ctx: LoweringContext, args: tuple, kwargs: dict, fn: Any = None
) -> Any:
    """``make(fn or the node's target, inputs, args, kwargs)``: the tensors among ``args`` and
    ``kwargs`` become the op's inputs, cast to the dtypes torch saw (e.g. int64 indices)."""
    node = ctx.node
    inputs: list[popxl.Tensor] = []
    wanted: list[torch.dtype] = []
    values = pytree.tree_leaves((node.args, node.kwargs))

    def slot(value: Any, source: Any) -> Any:
        if not isinstance(value, popxl.Tensor):
            return value
        inputs.append(value)
        wanted.append(_torch_dtype(source, value))
        return Slot(len(inputs) - 1)

    flat, spec = pytree.tree_flatten((args, kwargs))
    values += [None] * (len(flat) - len(values))  # a module's hyper-parameters: not in the node
    filled = [slot(v, s) for v, s in zip(flat, values)]
    call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
    inputs = [
        t if t.dtype.as_torch() == d else popxl.ops.cast(t, _dtype(d))
        for t, d in zip(inputs, wanted)
    ]
    outs = make(fn or node.target, inputs, tuple(call_args), call_kwargs)
    expected = ctx.expected()
    return outs if isinstance(expected, (tuple, list)) else outs[0]


def _torch_dtype(source: Any, value: popxl.Tensor) -> torch.dtype:
    """The dtype torch saw for this argument (the IR may hold a narrower one)."""
    seen = (
        source.meta.get("val", source.meta.get("example_value"))
        if isinstance(source, fx.Node)
        else None
    )
    return seen.dtype if isinstance(seen, torch.Tensor) else value.dtype.as_torch()


def _dtype(d: torch.dtype) -> popxl.dtype:
    return popxl.dtype.as_dtype(d)
