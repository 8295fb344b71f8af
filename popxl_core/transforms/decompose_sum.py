"""``decompose_sum``: PopART's DecomposeSum transform (n-ary gradient sums into a tree of adds)."""

from __future__ import annotations

from ..graph import Graph
from ..ops.registry import all_opdefs

__all__ = ["decompose_sum"]


def decompose_sum(graph: Graph) -> Graph:
    """Rewrite every Sum of more than two inputs in ``graph`` as a chain of Adds; returns it.

    PopART decomposes the sums that its autodiff makes where a tensor feeds several
    consumers, so that each partial gradient dies as soon as it is added. This project's
    autodiff accumulates such gradients with two-input Adds as it goes and the op table
    declares no n-ary Sum, so a graph here has nothing to decompose: the graph comes back as
    it was, which is what PopART gives for a graph without such sums.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"decompose_sum takes a popxl.Graph, got {type(graph).__name__}.")
    assert "Sum" not in all_opdefs(), "an n-ary Sum op exists: decompose_sum must rewrite it"
    return graph
