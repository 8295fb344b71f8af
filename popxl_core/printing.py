"""Text forms of graphs: the `print_schedule` format (popxl.addons) and a debug dump."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Optional

from .graph import Graph
from .schedule import schedule
from .tensor import Tensor

__all__ = ["format_schedule", "format_graph"]


def format_schedule(graph: Graph, arg_names: Optional[Dict[Tensor, str]] = None) -> str:
    """The popxl.addons ``print_schedule()`` text of ``graph``.

    Tensors are numbered ``%1, %2, ...`` in order of first mention; ``arg_names`` labels
    named inputs (``weight=%2``).
    """
    counter = iter(range(1, 1 << 30))
    ids: Dict[str, int] = defaultdict(lambda: next(counter))
    names = arg_names or {}
    inputs = ", ".join(
        f"{names[t]}=%{ids[t.id]}" if t in names else f"%{ids[t.id]}" for t in graph.inputs
    )
    lines = [_format_op(op, ids) for op in schedule(graph)]
    outputs = ", ".join(f"%{ids[t.id]}" for t in graph.outputs)
    body = "\n    ".join(lines)
    return f"Graph : {graph.name}\n  ({inputs}) -> ({outputs}) {{\n    {body}\n  }}"


def _format_op(op, ids) -> str:
    called = f"({op.called_graphs[0].id})" if op.type in ("Call", "Loop") else ""

    def fmt(ts):
        return ", ".join(f"%{ids[t.id]} [{t.shape} {t.dtype.name}]" for t in ts)

    return f"{op.opType()}.{op.id}{called} ({fmt(op.inputs)}) -> ({fmt(op.outputs)})"


def format_graph(graph: Graph) -> str:
    """A debug dump: the schedule with real tensor ids."""
    lines = [f"graph {graph.name or 'main'!r} inputs={[t.id for t in graph.inputs]}"]
    for op in schedule(graph):
        ins = ", ".join(t.id for t in op.inputs)
        outs = ", ".join(t.id for t in op.outputs)
        lines.append(f"  {op.opType()}.{op.id}({ins}) -> ({outs})")
    lines.append(f"  outputs={[t.id for t in graph.outputs]}")
    return "\n".join(lines)
