"""Ops whose torch kernel all-reduces small partial results over a replica group part way
through (Graphcore's C++ ``CrossEntropySharded`` and ``LayerNormDistributed``: local
reductions, a GCL all-reduce, more local work).

The kernel is ``kernel(*inputs, exchange, **attrs)``; ``exchange(i, value)`` is the op's
``i``-th all-reduce of ``value`` over the op's group (``reductions[i]``: 'add', 'max', ...).
In the simulator each exchange is one ``RT.collective`` barrier, so every replica of the
group runs its kernel up to the exchange, the members' values are reduced in replica order
(the same bits on every member, as the replicated all-reduce computes them), and each replica
goes on with the result. On one replica ``exchange`` returns the value. Float16 operands
are computed (and their partial results exchanged) in float32; the cost model counts the
exchanges in the op's dtype, as the IPU sends them.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from popxl_core.ops.collectives.collectives import group_table, reduce_values
from popxl_core.ops.registry import get_opdef

__all__ = ["exchanging_emit", "table_kernel", "widened"]


def _reduce(replica, x, values, *, op, table):
    """One all-reduce of an exchanging op: the group members' values, in replica order."""
    return reduce_values(op, [values[m] for m in table.members[replica]]).to(x.dtype)


def _reducers(op, table, reductions: Sequence[str]) -> list:
    out = []
    for i, kind in enumerate(reductions):
        fn = functools.partial(_reduce, op=kind, table=table)
        # what the runtime reads: the name in replica-mismatch errors and between processes,
        # and that the result is one per group (computed once, copied for the members)
        fn.op_name = f"{op.type}.{op.id}.{i}"  # type: ignore[attr-defined]
        fn.group_members = table.members  # type: ignore[attr-defined]
        out.append(fn)
    return out


def _run(kernel: Callable, reducers: list, attrs: dict, runtime, *inputs):
    def exchange(i: int, value: torch.Tensor) -> torch.Tensor:
        return runtime.collective(value.contiguous(), reducers[i])

    return kernel(*inputs, exchange=exchange, **attrs)


def exchanging_emit(kernel: Callable, reductions: Sequence[str]) -> Callable:
    """The `OpDef.emit` of an op whose ``kernel`` exchanges with ``reductions``, over the
    op's ``group`` attribute (None: every replica); the other attributes go to the kernel."""

    def emit(op, em) -> None:
        table = group_table(op.attrs["group"], em.program.ir.replication_factor)
        attrs = {k: v for k, v in op.attrs.items() if k != "group"}
        attrs["numerics"] = em.program.ir.numerics
        fn = functools.partial(_run, kernel, _reducers(op, table, reductions), attrs)
        k = em.bind_global("exchanging", fn)
        ins = ", ".join(em.name(t) for t in op.inputs)
        outs = ", ".join(em.name(t) for t in op.outputs)
        em.emit(f"{outs}, = {k}(RT, {ins})")

    return emit


def table_kernel(name: str, numerics: str) -> Callable:
    """The kernel the op table's row ``name`` runs under ``numerics`` (the ``ipu`` numerics
    compute a pointwise op's element alike wherever it sits, so a shard's ``exp`` is the
    whole tensor's)."""
    kernel = get_opdef(name).kernel_for(numerics)
    assert kernel is not None  # the rows asked for (Exp, Log, Sqrt) have kernels
    return kernel


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 where it is narrower (the IPU's float16 reductions accumulate in
    float32); the op rounds its outputs back to the input's dtype."""
    return t.float() if t.is_floating_point() and t.element_size() < 4 else t
