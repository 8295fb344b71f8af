"""Core ATen ops lowered to the ``Aten`` op (`popxl_core.ops.aten_op`): torch's own kernel,
forward and backward, so each is eager PyTorch bit for bit.

These are the core ATen packets (``torch.Tag.core``) that have no PopXL op of their own:
data movement (``cat``, ``slice``, ``index``, ``gather``, ``scatter*``, padding), the
elementwise functions PopXL lacks (``cos``, ``floor``, ``atan2``, ...), reductions that
return indices (``argmax``, ``max.dim``, ``sort``, ``topk``), the fused normalisations,
``convolution``, pooling, upsampling and their backward ops, and the factories (``full``,
``arange``). The list is explicit, so a new torch that adds a core op fails
``tests/test_fx_core_aten.py`` until the op is lowered or refused (`REFUSED`).

`REFUSED` holds the packets refused by design, with the reason `check` reports.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

import popxl_core as popxl
from popxl_core.ops import Slot, aten_op, torch_random

from ..lowering import LoweringContext, lowers
from .eager_layout import (
    EagerLayout,
    eager_requires_grad,
    eager_stride,
    lower_as_eager_matmul,
    lower_call,
    lower_in_eager_layout,
    lowering_in_eager_layout,
    torch_kernel_in_eager_layout,
)

__all__ = [
    "EAGER_KERNEL_PACKETS",
    "Method",
    "REFUSED",
    "EagerLayout",
    "eager_requires_grad",
    "eager_stride",
    "lower_as_eager_matmul",
    "lower_in_eager_layout",
    "lowering_in_eager_layout",
    "lower_torch_function",
    "lower_with_torch_kernel",
    "lower_with_torch_random",
    "torch_call",
    "torch_kernel_in_eager_layout",
    "torch_kernel_when",
    "torch_unary",
]

aten = torch.ops.aten

_DATA_DEPENDENT = (
    "its output shape or value depends on tensor data, which a static IPU program cannot "
    "have; compute with masks instead (torch.where), or move it out of the model"
)
_SYMBOLIC = "it reads a symbolic size; shapes are static in a captured program"

# packet -> why it is refused (what `check` says)
REFUSED = {
    aten._local_scalar_dense: (
        "Tensor.item() turns a device value into a python number, which a static IPU program "
        "cannot branch on; keep it a tensor"
    ),
    aten.nonzero: _DATA_DEPENDENT,
    aten.sym_numel: _SYMBOLIC,
    aten.sym_size: _SYMBOLIC,
    aten.sym_storage_offset: _SYMBOLIC,
    aten.sym_stride: _SYMBOLIC,
    aten.sym_is_contiguous: _SYMBOLIC,
    aten.resize_: (
        "it resizes a tensor's storage in place, so the tensor's shape changes while the "
        "program runs; make a new tensor of the new shape instead"
    ),
}

TORCH_KERNEL_PACKETS = (
    # data movement
    aten.alias,
    aten.cat,
    aten.constant_pad_nd,
    aten.diagonal,
    aten.flip,
    aten.gather,
    aten.index,
    aten.index_put,
    aten.index_select,
    aten.masked_scatter,
    aten.reflection_pad1d,
    aten.reflection_pad2d,
    aten.reflection_pad3d,
    aten.repeat,
    aten.replication_pad2d,
    aten.replication_pad3d,
    aten.scatter,
    aten.scatter_add,
    aten.scatter_reduce,
    aten.select_scatter,
    aten.slice,
    aten.slice_scatter,
    aten.split_with_sizes,
    aten.col2im,
    # elementwise
    aten.acos,
    aten.acosh,
    aten.asin,
    aten.asinh,
    aten.atan,
    aten.atan2,
    aten.atanh,
    aten.bitwise_xor,
    aten.ceil,
    aten.cos,
    aten.cosh,
    aten.elu,
    aten.erf,
    aten.expm1,
    aten.fill,
    aten.floor,
    aten.fmod,
    aten.gelu,
    aten.hardtanh,
    aten.isinf,
    aten.isnan,
    aten.leaky_relu,
    aten.log10,
    aten.log2,
    aten.logical_and,
    aten.logical_or,
    aten.logical_xor,
    aten.maximum,
    aten.minimum,
    aten.ne,
    aten.reciprocal,
    aten.remainder,
    aten.round,
    aten.sign,
    aten.sin,
    aten.sinh,
    aten.tan,
    aten.trunc,
    # reductions and index-returning ops
    aten.amax,
    aten.amin,
    aten.argmax,
    aten.argmin,
    aten.cumsum,
    aten.max,
    aten.min,
    aten.prod,
    aten.sort,
    aten.topk,
    aten.var,
    aten._log_softmax,
    aten._cdist_forward,
    aten._pdist_forward,
    # normalisation, convolution, pooling, resampling, embedding (and their backward ops)
    aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_no_training,
    aten.native_group_norm,
    aten.native_group_norm_backward,
    aten.native_layer_norm,
    aten.native_layer_norm_backward,
    aten.convolution,
    aten.convolution_backward,
    aten._adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d_backward,
    aten._adaptive_avg_pool3d,
    aten.adaptive_avg_pool1d,
    aten.avg_pool1d,
    aten.avg_pool2d,
    aten.avg_pool2d_backward,
    aten.avg_pool3d,
    aten.max_pool2d_with_indices,
    aten.max_pool2d_with_indices_backward,
    aten.max_pool3d_with_indices,
    aten.upsample_bilinear2d,
    aten.upsample_nearest2d,
    aten.grid_sampler_2d,
    aten.embedding,
    aten.embedding_dense_backward,
    aten._embedding_bag,
    aten._fft_r2c,
    aten._fft_c2r,
    # factories
    aten.arange,
    aten.full,
)


@dataclass(frozen=True)
class Method:
    """``x.<name>(*args, **kwargs)`` as a callable (fx targets of method calls are names)."""

    name: str

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(x, self.name)(*args, **kwargs)

    def __str__(self) -> str:
        return f"Tensor.{self.name}"


def lower_torch_function(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """Lower the node's torch function or method call as one ``Aten`` op running that
    function (eager's own kernels and autograd); ``inplace=`` is left to the driver."""
    target = ctx.node.target
    fn = Method(target) if isinstance(target, str) else target
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
    if any(eager_stride(a) for a in ctx.node.args):  # reductions round by the layout too
        out = torch_kernel_in_eager_layout(ctx, fn, *args, **kwargs)
    else:
        out = torch_call(fn, *args, **kwargs)
    return tuple(out) if isinstance(out, list) else out


def lower_with_torch_kernel(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """Lower the node's ATen call as one ``Aten`` op: tensors become its inputs (cast to the
    dtypes torch saw, e.g. int64 indices), everything else stays an argument."""
    return lower_call(aten_op, ctx, args, kwargs)


def lower_with_torch_random(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
    """Lower the node's random ATen call as one ``TorchRandom`` op: torch's own kernel,
    drawing from torch's default generator in program order (``Options(rng="torch")``)."""
    return lower_call(torch_random, ctx, args, kwargs)


def torch_kernel_when(when: Callable[..., bool]) -> Callable[[Callable], Callable]:
    """Decorate a lowering: calls for which ``when(**named arguments)`` holds go to torch's
    own kernel instead (cases the PopXL ops do not cover, e.g. ``addmm`` with beta/alpha)."""

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def lower(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(ctx, *args, **kwargs)
            bound.apply_defaults()
            named = {k: v for k, v in bound.arguments.items() if k != "ctx"}
            if when(**named):
                return lower_with_torch_kernel(ctx, *args, **kwargs)
            return fn(ctx, *args, **kwargs)

        return lower

    return wrap


def torch_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as one ``Aten`` op, popxl tensors among the arguments as its
    inputs (in their own dtypes); one tensor, or a list where ``fn`` returns several."""
    inputs: list[popxl.Tensor] = []

    def slot(value: Any) -> Any:
        if not isinstance(value, popxl.Tensor):
            return value
        inputs.append(value)
        return Slot(len(inputs) - 1)

    call_args, call_kwargs = pytree.tree_map(slot, (args, kwargs))
    outs = aten_op(fn, inputs, tuple(call_args), call_kwargs)
    return outs[0] if len(outs) == 1 else outs


def torch_unary(overload: Any) -> Callable[[popxl.Tensor], popxl.Tensor]:
    """``x -> overload(x)`` as one ``Aten`` op (torch's kernel, forward and gradient)."""

    def build(x: popxl.Tensor) -> popxl.Tensor:
        return aten_op(overload, [x], (Slot(0),))[0]

    return build


# not core ATen, but kept whole by the fallback's decomposition (`fallback._KEPT`): their core
# decompositions round differently from eager's kernels. (binary_cross_entropy_with_logits is
# decomposed all the same by functorch's functionalize, which the fallback runs; its torch
# function has its own lowering, `lowerings.losses`; kept here for a graph that names it.)
EAGER_KERNEL_PACKETS = (
    aten.linalg_vector_norm,
    aten.binary_cross_entropy,
    aten.binary_cross_entropy_with_logits,
)

lowers(*TORCH_KERNEL_PACKETS, *EAGER_KERNEL_PACKETS)(lower_with_torch_kernel)
