"""Elementwise kernels that write into an input that is dead after them (``out=``).

Adam's update is a chain of elementwise ops on weight-sized temporaries; eager torch runs it
in place. A float32 op with an ``out=`` form (``speed.OUT_KERNEL``: add, sub, mul, div, sqrt)
writes its result (the same kernel with ``out=``, the same bits) into the storage of a
temporary of the output's shape that no op reads any more: one of its own inputs that it
reads last, else one that died earlier in the schedule. Only temporaries made by those same
kernels, or by a kernel declared ``fresh_outputs`` (batch norm's), qualify (fresh tensors
that no view, call, variable or graph output shares); the
generated code keeps every name alive until the graph returns, so without reuse each
temporary would be a new allocation. At run time the ``out=`` form is taken only where the
storage and every input are contiguous: otherwise torch lays the result out like a strided
input (a permuted view), and the storage's layout would change the order of a later
reduction over it (eager's bits).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch

from ..graph import Graph, Op
from ..ops.forms import float32_only
from ..tensor import Tensor
from .speed import OUT_KERNEL

__all__ = ["reuse_plan", "reusable_in", "inplace_kernel"]


def _eligible(op: Op) -> bool:
    fresh = OUT_KERNEL.get(op.opdef) is not None and not op.attrs
    return fresh and not op.modified_inputs() and float32_only(op)


def _liveness(ops: List[Op], g: Graph):
    last: Dict[Tensor, int] = {}
    readers: Dict[Tensor, List[Op]] = {}
    for k, op in enumerate(ops):
        for t in op.inputs:
            last[t] = k
            readers.setdefault(t, []).append(op)
    return last, readers, set(g._outputs)


def reusable_in(ops: List[Op], g: Graph) -> Callable[[Tensor, Op, int], bool]:
    """``(t, op, k) ->`` may ``op``, at position ``k`` of ``ops``, write into its input ``t``."""
    last, readers, outputs = _liveness(ops, g)
    return lambda t, op, k: _reusable(t, op, k, last, readers, outputs)


def reuse_plan(
    ops: List[Op], g: Graph, fixed: Optional[Dict[Op, Optional[Tensor]]] = None
) -> Dict[Op, Tensor]:
    """op -> the tensor whose storage it writes its result into, for ops of ``ops`` (the live
    schedule): a dead input of its own, else a temporary that died earlier (a buffer pool).
    ``fixed`` holds decisions made elsewhere (multi-tensor groups: an input, or None)."""
    fixed = fixed or {}
    last, readers, outputs = _liveness(ops, g)
    plan: Dict[Op, Tensor] = {}
    free: Dict[tuple, List[Tensor]] = {}  # shape -> temporaries no op reads any more
    for k, op in enumerate(ops):
        if op in fixed:
            fixed_out = fixed[op]
            if fixed_out is not None:
                plan[op] = fixed_out
        elif _eligible(op):
            shape = tuple(op.outputs[0].shape)
            mine = [t for t in op.inputs if _reusable(t, op, k, last, readers, outputs)]
            if mine:
                plan[op] = mine[0]
            elif free.get(shape):
                plan[op] = free[shape].pop()
        for t in set(op.inputs):
            if last[t] == k and t is not plan.get(op) and _owned(t, op, readers, outputs):
                free.setdefault(tuple(t.shape), []).append(t)
    return plan


def _owned(t: Tensor, op: Op, readers, outputs) -> bool:
    """``t`` is a fresh float32 temporary of ``op``'s graph whose readers only read it."""
    src = t.producer
    return (
        src is not None
        and src.graph is op.graph
        and (_eligible(src) or _fresh(src))
        and t not in outputs
        and all(_reads_only(r, t) for r in readers[t])
    )


def _fresh(op: Op) -> bool:
    """A kernel declared to return new tensors (`OpDef.fresh_outputs`), all float32."""
    return op.opdef.fresh_outputs and not op.modified_inputs() and float32_only(op)


def _reads_only(r: Op, t: Tensor) -> bool:
    """``r`` neither writes ``t`` nor returns anything that may share its storage: a fresh
    kernel, a host store (a copy), or an in-place op whose target is another tensor."""
    if _eligible(r) or r.opdef.reads_only:
        return True
    written = {r.inputs[i] for i in r.modified_inputs()}
    return bool(r.opdef.inplace) and not r.called_graphs and t not in written


def _reusable(t: Tensor, op: Op, k: int, last, readers, outputs) -> bool:
    return (
        _owned(t, op, readers, outputs)
        and last[t] == k
        and op.inputs.count(t) == 1
        and tuple(t.shape) == tuple(op.outputs[0].shape)
    )


def inplace_kernel(op: Op) -> Callable:
    """``op``'s kernel writing its result into its last argument (the storage to reuse),
    where that storage's layout (contiguous) is the one torch would give the result: with an
    input in another layout (a permuted view) torch's result follows that input's strides,
    and a later reduction over it (eager's kernel on eager's layout) sums in that order, so
    the result is then allocated as the kernel makes it (the same values, eager's layout)."""
    fn = OUT_KERNEL.get(op.opdef)

    def into(*args):
        ins, storage = args[:-1], args[-1]
        if storage.is_contiguous() and all(_contiguous(a) for a in ins):
            return fn(*ins, out=storage)
        return fn(*ins)

    return into


def _contiguous(a) -> bool:
    return not isinstance(a, torch.Tensor) or a.is_contiguous()
