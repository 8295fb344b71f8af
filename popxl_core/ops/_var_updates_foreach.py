"""The multi-tensor forms (`forms.Foreach`, sim/foreach.py) of Accumulate ("add"),
AccumulatorScale and CopyVarUpdate: their float32 kernels' arithmetic over lists, with the
factor shared by the group (the same scalar tensor or attribute)."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..graph import Op
from ._var_updates_common import f32
from .forms import Foreach, columns, shared_identity

__all__ = ["ACCUMULATE_FOREACH", "COPY_FOREACH", "SCALE_FOREACH"]


def _accumulate_key(op: Op) -> Optional[tuple]:
    ins = op.inputs
    if op.attrs.get("kind") != "add" or tuple(ins[0].shape) != tuple(ins[1].shape):
        return None
    if not all(tuple(f.shape) == () for f in ins[2:]):
        return None
    return (op.attrs.get("factor"), *map(shared_identity, ins[2:]))


def _accumulate_kernel(ops, key, mode) -> Callable:
    factor, n = ops[0].attrs.get("factor"), len(ops[0].inputs)

    def accumulate(*flat):
        cols = columns(flat, n)
        f = f32(cols[2][0] if n > 2 else (1.0 if factor is None else factor))
        tt = cols[0]
        summed = torch._foreach_add(tt, torch._foreach_mul(cols[1], f))
        torch._foreach_copy_(tt, summed)
        return tuple(tt)

    return accumulate


def _scale_key(op: Op) -> Optional[tuple]:
    factor = op.attrs.get("factor")
    if len(op.inputs) == 1 and (factor is None or factor == 0.0):
        return None  # a constant 0 zeroes (keeps no inf/nan): not a multiply
    return (factor, *map(shared_identity, op.inputs[1:]))


def _scale_kernel(ops, key, mode) -> Callable:
    factor, n = ops[0].attrs.get("factor"), len(ops[0].inputs)

    def scale(*flat):
        cols = columns(flat, n)
        f = f32(cols[1][0] if n > 1 else factor)
        torch._foreach_mul_(cols[0], f)
        return tuple(cols[0])

    return scale


def _copy_key(op: Op) -> Optional[tuple]:
    return () if tuple(op.inputs[0].shape) == tuple(op.inputs[1].shape) else None


def _copy_kernel(ops, key, mode) -> Callable:
    def copy(*flat):
        targets, values = columns(flat, 2)
        torch._foreach_copy_(targets, values)
        return tuple(targets)

    return copy


ACCUMULATE_FOREACH = Foreach(_accumulate_key, _accumulate_kernel)
SCALE_FOREACH = Foreach(_scale_key, _scale_kernel)
COPY_FOREACH = Foreach(_copy_key, _copy_kernel)
