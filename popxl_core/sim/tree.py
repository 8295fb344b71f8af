"""The program tree of a plan: main -> call(graph) -> repeat(n) ..., like PopVision's.

Calls, repeats and branches nest; host, remote and IPU-Link transfers and collectives are
listed where they happen; runs of other ops are folded into one "compute" line with their
op count and cycles.
"""

from __future__ import annotations

from typing import Any

from ..graph import Graph
from ..ops.call import CALL, REPEAT
from ..ops.code_load import REMOTE_CODE_LOAD
from ..ops.io import HOST_LOAD, HOST_STORE, IO_TILE_COPY, IPU_COPY
from ..ops.remote import REMOTE_LOAD, REMOTE_LOAD_INPLACE, REMOTE_STORE
from ..schedule import schedule
from .cost import CostModel

__all__ = ["program_tree", "tree_text"]

# the transfers the tree shows, with every collective (`OpDef.collective`)
_SHOWN = frozenset(
    (HOST_LOAD, HOST_STORE, REMOTE_CODE_LOAD, REMOTE_LOAD, REMOTE_LOAD_INPLACE, REMOTE_STORE)
    + (IPU_COPY, IO_TILE_COPY)
)


def program_tree(plan) -> dict[str, Any]:
    """The main graph as a nested dict: ``kind``, ``name``, ``cycles`` (one execution),
    ``children``; calls and repeats carry their callee as one child."""
    return _graph_node(plan.main, plan.model, "main", 1)


def _graph_node(graph: Graph, model: CostModel, kind: str, times: int) -> dict[str, Any]:
    children: list[dict[str, Any]] = []
    for op in schedule(graph):
        if op.called_graphs:
            children.append(_control_node(op, model))
        elif op.opdef in _SHOWN or op.opdef.collective:
            children.append(
                {
                    "kind": op.type,
                    "name": f"{op.type}.{op.id}",
                    "cycles": model.op_work(op).cycles.total,
                    "children": [],
                }
            )
        elif model.op_work(op).cycles.total:  # ops without a compute set (Init) are not shown
            _fold_compute(children, model.op_work(op).cycles.total)
    name = graph.name or "main"
    return {
        "kind": kind,
        "name": name,
        "times": times,
        "cycles": model.graph_work(graph).cycles.total,
        "children": children,
    }


def _control_node(op, model: CostModel) -> dict[str, Any]:
    if op.opdef is REPEAT:
        n = op.attrs["repeat_count"]
        return _graph_node(op.called_graphs[0], model, f"repeat({n})", n)
    kind = "call" if op.opdef is CALL else op.type.lower()
    branches = [_graph_node(g, model, "branch", 1) for g in op.called_graphs]
    if len(branches) == 1:
        return branches[0] | {"kind": kind}
    return {
        "kind": kind,
        "name": f"{op.type}.{op.id}",
        "times": 1,
        "cycles": model.op_work(op).cycles.total,
        "children": branches,
    }


def _fold_compute(children: list[dict[str, Any]], cycles: int) -> None:
    last = children[-1] if children else None
    if last is not None and last["kind"] == "compute":
        last["ops"] += 1
        last["cycles"] += cycles
    else:
        children.append(
            {"kind": "compute", "name": "compute", "ops": 1, "cycles": cycles, "children": []}
        )


def tree_text(node: dict[str, Any], depth: int = 0) -> str:
    """One line per node, indented by depth."""
    pad = "  " * depth
    if node["kind"] == "main":
        line = f"main graph: {node['cycles']:,} cycles per run (without the fixed run overhead)"
    elif node["kind"] == "compute":
        line = f"{pad}{node['ops']} compute op(s): {node['cycles']:,} cycles"
    elif "times" in node:
        line = f"{pad}{node['kind']} {node['name']!r}: {node['cycles']:,} cycles per execution"
    else:
        line = f"{pad}{node['name']}: {node['cycles']:,} cycles"
    return "\n".join([line, *(tree_text(c, depth + 1) for c in node["children"])])
