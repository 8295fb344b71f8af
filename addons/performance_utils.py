"""FLOP counts of a program, as popxl.addons' ``performance_utils``: the matmuls' floating
point operations (2·M·N·K each, batch dims included), through every call, loop and branch.

Only MatMul ops count (they dominate a transformer's or MLP's work, and this is the count
popxl.addons reports); `session.report` has the simulator's estimate of all ops.
"""

from __future__ import annotations

import math

import popxl_core

__all__ = [
    "evaluate_FLOPs",
    "evaluate_ir_FLOPs",
    "total_FLOPs",
    "format_flops_scientific",
    "print_FLOPs",
]

_MATMULS = ("MatMul", "MatMulPow2Scaled")


def evaluate_FLOPs(graph: popxl_core.Graph) -> int:  # popxl.addons' name
    """MatMul FLOPs of one execution of ``graph``: a Loop counts its body ``repeat_count``
    times, an If its costlier branch.

    >>> import numpy as np
    >>> ir = popxl_core.Ir()
    >>> with ir.main_graph:
    ...     a = popxl_core.variable(np.ones((2, 3), np.float32))
    ...     b = popxl_core.variable(np.ones((3, 4), np.float32))
    ...     c = a @ b
    >>> evaluate_FLOPs(ir.main_graph)  # 2 * 2 * 4 * 3
    48
    """
    total = 0
    for op in graph.ops:
        if op.type in _MATMULS:
            total += _matmul_flops(op)
        elif op.type == "Loop":
            total += op.attrs["repeat_count"] * evaluate_FLOPs(op.called_graphs[0])
        elif op.type == "If":
            total += max(evaluate_FLOPs(g) for g in op.called_graphs)
        else:
            total += sum(evaluate_FLOPs(g) for g in op.called_graphs)
    return total


def _matmul_flops(op) -> int:
    out = op.outputs[0].shape
    k = op.inputs[0].shape[-1]
    return 2 * math.prod(out) * k


def evaluate_ir_FLOPs(ir: popxl_core.Ir) -> int:
    """MatMul FLOPs of one run of ``ir``'s main graph."""
    return evaluate_FLOPs(ir.main_graph)


def total_FLOPs(ir_or_graph) -> int:
    """`evaluate_ir_FLOPs` for an Ir, `evaluate_FLOPs` for a Graph."""
    if isinstance(ir_or_graph, popxl_core.Ir):
        return evaluate_ir_FLOPs(ir_or_graph)
    return evaluate_FLOPs(ir_or_graph)


def format_flops_scientific(flops: float, precision: int = 2) -> str:
    """``flops`` as ``"<mantissa>e<exp> FLOPs"``, e.g. ``format_flops_scientific(48000)`` is
    ``'4.80e+04 FLOPs'``."""
    return f"{flops:.{precision}e} FLOPs"


def print_FLOPs(ir_or_graph, title: str | None = None) -> int:
    """Print (and return) the MatMul FLOPs of an Ir or Graph."""
    flops = total_FLOPs(ir_or_graph)
    print(f"{title or 'FLOPs'}: {format_flops_scientific(flops)}")
    return flops
