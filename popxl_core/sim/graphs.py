"""The graphs a program runs: the main graph and every graph it calls (the planner's walk)."""

from __future__ import annotations

from ..graph import Graph

__all__ = ["reachable_graphs"]


def reachable_graphs(main: Graph) -> list[Graph]:
    """The main graph and every graph it calls, directly or not, in discovery order."""
    found: dict[Graph, None] = {main: None}
    stack = [main]
    while stack:
        for op in stack.pop()._ops:
            for g in op.called_graphs:
                if g not in found:
                    found[g] = None
                    stack.append(g)
    return list(found)
