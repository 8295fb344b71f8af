"""A first handful of lowerings: linear, reshapes, getattr (getitem moved to shape.py).

Family files (activations, linear, shape, ...) may take these entries over: move an entry,
do not register a target twice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

import popxl_core as popxl
from popxl_core import ops

from ..lowering import LoweringContext, lowers

__all__ = ["linear"]


@lowers(nn.Linear)
def _linear_module(ctx: LoweringContext, module: nn.Linear, x: popxl.Tensor) -> popxl.Tensor:
    bias = ctx.param("bias") if module.bias is not None else None
    return linear(ctx.param("weight"), x, bias, _eager_input(ctx), module.weight.requires_grad)


@lowers(F.linear)
def _linear(
    ctx: LoweringContext, x: popxl.Tensor, weight: popxl.Tensor, bias: popxl.Tensor | None = None
) -> popxl.Tensor:
    w_eager = _example(ctx.node.args[1]) if len(ctx.node.args) > 1 else None
    grad = w_eager.requires_grad if isinstance(w_eager, torch.Tensor) else True
    return linear(weight, x, bias, _eager_input(ctx), grad)


def linear(
    weight: popxl.Tensor,
    x: popxl.Tensor,
    bias: popxl.Tensor | None = None,
    eager_x: torch.Tensor | None = None,
    weight_requires_grad: bool = True,
) -> popxl.Tensor:
    """F.linear with eager's kernels: ``eager_x`` (the input as eager has it, when known) picks
    addmm or mm + add like ``at::linear``; without it the input is taken to be contiguous.
    Under ``Options(numerics="ipu")`` a PopXL program's ``x @ w.T + b`` (MatMul, then Add)."""
    fold = _eager_fold(x.rank, eager_x, bias is not None, weight_requires_grad)
    if (
        fold is None or popxl.gcg().ir.numerics == "ipu"
    ):  # eager batches the GEMM (bmm) here: no bitwise twin, same maths
        y = x @ ops.transpose(weight)
        return y + bias if bias is not None else y
    return ops.linear(x, weight, bias, fold)


def _eager_fold(rank: int, eager_x, has_bias: bool, weight_requires_grad: bool) -> str | None:
    """What ``at::linear`` does with this input: 'addmm', 'mm' (then add the bias) or None."""
    contiguous = eager_x is None or eager_x.is_contiguous()
    if rank < 2:
        return None
    if has_bias and (rank == 2 or contiguous):
        return "addmm"
    # at::matmul folds the input into a matrix (copying) when the weight needs a gradient or
    # the fold is a free view; otherwise it batches
    if rank == 2 or contiguous or weight_requires_grad or _foldable(eager_x):
        return "mm"
    return None


def _foldable(t: torch.Tensor) -> bool:
    return all(t.stride(i) == t.stride(i + 1) * t.shape[i + 1] for i in range(t.dim() - 2))


def _example(arg: Any) -> Any:
    return arg.meta.get("example_value") if isinstance(arg, fx.Node) else None


def _eager_input(ctx: LoweringContext) -> torch.Tensor | None:
    """The eager value of the node's first argument, if the node is this module's own call."""
    node = ctx.node
    if node.op == "call_module" and node.target != ctx.module_path:
        return None  # a child lowered from inside its parent's lowering
    value = _example(node.args[0]) if node.args else None
    return value if isinstance(value, torch.Tensor) else None


@lowers("view", "reshape", torch.reshape)
def _reshape(ctx: LoweringContext, x: popxl.Tensor, *shape: Any) -> popxl.Tensor:
    # -1 is resolved from shape propagation, which ran the same call in torch.
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(torch.flatten, "flatten")
def _flatten(
    ctx: LoweringContext, x: popxl.Tensor, start_dim: int = 0, end_dim: int = -1
) -> popxl.Tensor:
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(nn.Flatten)
def _flatten_module(ctx: LoweringContext, module: nn.Flatten, x: popxl.Tensor) -> popxl.Tensor:
    return ops.reshape(x, tuple(ctx.expected().shape))


@lowers(getattr)
def _getattr(ctx: LoweringContext, obj: Any, name: str) -> Any:
    if isinstance(obj, popxl.Tensor) and name in ("T", "mT"):
        perm = (
            list(range(obj.rank))[::-1]
            if name == "T"
            else [*range(obj.rank - 2), obj.rank - 1, obj.rank - 2]
        )
        return ops.transpose(obj, perm)
    if isinstance(obj, popxl.Tensor):
        raise NotImplementedError(
            f"Tensor.{name} (fx node '{ctx.node.name}') has no "
            "lowering; supported attributes: T, mT."
        )
    return getattr(obj, name)
