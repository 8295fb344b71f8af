"""Elementwise arithmetic and math ops (binary ops broadcast like numpy)."""

from __future__ import annotations

from typing import Optional

import torch

from ..tensor import Tensor
from ._utils import as_tensor, broadcast_shapes, coerce_pair, rand, same_dtype, spec, unbroadcast
from .registry import OpDef, Sample, create_op, register

__all__ = ["add", "add_", "identity", "rename"]


def binary_infer(ins, **attrs):
    same_dtype(*ins)
    return [spec(broadcast_shapes(ins[0].shape, ins[1].shape), ins[0].dtype)]


def inplace_binary_infer(ins, **attrs):
    out = binary_infer(ins)[0]
    if out.shape != ins[0].shape:
        raise ValueError(f"in-place op cannot broadcast its first input {ins[0].shape} "
                         f"to {out.shape}")
    return [ins[0]]


def _add_grad(ctx):
    g = ctx.grad_output(0)
    return [unbroadcast(g, ctx.op.inputs[0].shape), unbroadcast(g, ctx.op.inputs[1].shape)]


def _add_samples():
    return [
        Sample([rand(3, 4), rand(3, 4, seed=1)], lambda a, b: add(a, b), torch.add),
        Sample([rand(2, 3, 4), rand(4, seed=2)], lambda a, b: add(a, b), torch.add,
               name="broadcast"),
        Sample([rand(3, 1), rand(1, 5, seed=3)], lambda a, b: a + b, torch.add, name="both"),
    ]


def _add_inplace_kernel(a, b):
    return a.add_(b)


ADD = register(OpDef("Add", binary_infer, torch.add, grad=_add_grad, samples=_add_samples,
                     out_name="add_out"))
ADD_LHS_INPLACE = register(OpDef(
    "AddLhsInplace", inplace_binary_infer, _add_inplace_kernel, grad=_add_grad, inplace=(0,),
    out_name="add_out",
    samples=lambda: [Sample([rand(3, 4), rand(4, seed=5)], lambda a, b: add_(a * 1.0, b),
                            torch.add)]))


def add(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs + rhs, broadcasting."""
    return create_op(ADD, list(coerce_pair(lhs, rhs)))[0]


def add_(lhs: Tensor, rhs: Tensor) -> Tensor:
    """lhs += rhs in place; returns the updated alias of lhs."""
    return create_op(ADD_LHS_INPLACE, [lhs, as_tensor(rhs, lhs)])[0]


IDENTITY = register(OpDef(
    "Identity", lambda ins: [ins[0]], lambda x: x.clone(), grad=lambda ctx: [ctx.grad_output(0)],
    out_name="identity_out",
    samples=lambda: [Sample([rand(2, 3)], lambda x: identity(x), lambda x: x * 1)]))


def identity(t: Tensor, output_name: Optional[str] = None) -> Tensor:
    """A copy of ``t`` (optionally with a new name)."""
    return create_op(IDENTITY, [t], out_names=[output_name] if output_name else None)[0]


rename = identity
