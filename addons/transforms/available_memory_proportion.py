"""Set the available memory proportion of every op that has one, per IPU.

On an IPU the proportion bounds the temporary memory a matmul, convolution, gather, ...
plans for; the simulator's numbers do not depend on it, but programs set it and read it back.
"""

from __future__ import annotations

from typing import Sequence

import popxl_core

__all__ = ["set_available_memory_proportion_by_ipu", "set_graph_available_memory_proportion_by_ipu"]

_KEYS = ("available_memory_proportion", "available_memory_proportions")


def set_available_memory_proportion_by_ipu(ir: popxl_core.Ir, proportions: Sequence[float]) -> None:
    """Set the proportion of every op in every graph of ``ir``: ``proportions[op.ipu]``."""
    for g in ir.graphs:
        set_graph_available_memory_proportion_by_ipu(g, proportions)


def set_graph_available_memory_proportion_by_ipu(
    graph: popxl_core.Graph, proportions: Sequence[float]
) -> None:
    """Set the proportion of every op of ``graph`` that has one to ``proportions[op.ipu]``.

    >>> import numpy as np
    >>> ir = popxl_core.Ir()
    >>> with ir.main_graph:
    ...     w = popxl_core.variable(np.ones((2, 2), np.float32))
    ...     y = w @ w
    >>> set_graph_available_memory_proportion_by_ipu(ir.main_graph, [0.3])
    >>> y.producer.attrs["available_memory_proportion"]
    0.3
    """
    props = [_checked(p) for p in proportions]
    graph.ir.check_editable("setting available memory proportions")
    for op in graph.ops:
        key = next((k for k in _KEYS if k in op.attrs), None)
        if key is None:
            continue
        if op.ipu >= len(props):
            raise ValueError(
                f"{op.type}.{op.id} is on IPU {op.ipu}, but only {len(props)} proportions were "
                "given: pass one per IPU."
            )
        p = props[op.ipu]
        # a convolution takes one proportion per conv it runs (all the same here)
        op.attrs[key] = p if key == _KEYS[0] else tuple(p for _ in op.attrs[key] or (0,))


def _checked(p) -> float:
    p = float(p)
    if not 0 < p <= 1:
        raise ValueError(f"An available memory proportion must be in (0, 1], got {p}.")
    return p
