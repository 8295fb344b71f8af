"""PopART's dot checks: Graphviz files of the Ir at named points (``ir.dot_checkpoint``).

Which checks write a file comes from ``POPART_DOT_CHECKS`` (names joined by ``:``) when it is
set and not empty, else from the session option ``dotChecks``; ``ALL`` writes every check, and
the check ``FINAL`` is the program as the Session compiles it. Names compare case-blind (PopXL's
tests name the check ``"Foo"`` and enable it with ``FOO``). Files go to the option ``logDir``
(the working directory when empty), numbered in the order they are written.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, Set

from .schedule import schedule

if TYPE_CHECKING:
    from .ir import Ir

__all__ = ["dot_checkpoint", "enabled_checks", "graph_dot"]


def enabled_checks(ir: "Ir") -> Set[str]:
    """The enabled check names, upper-case."""
    env = os.environ.get("POPART_DOT_CHECKS", "")
    names = env.split(":") if env else ir._pb_ir.getSessionOptions().dotChecks
    return {n.upper() for n in names if n}


def dot_checkpoint(ir: "Ir", check: str) -> None:
    """Write ``<logDir>/<n>_<check>.dot`` if ``check`` (or ALL) is enabled."""
    checks = enabled_checks(ir)
    if check.upper() not in checks and "ALL" not in checks:
        return
    folder = ir._pb_ir.getSessionOptions().logDir or os.getcwd()
    os.makedirs(folder, exist_ok=True)
    ir._dot_count = getattr(ir, "_dot_count", 0) + 1
    path = os.path.join(folder, f"{ir._dot_count:03d}_{check}.dot")
    with open(path, "w") as f:
        f.write(graph_dot(ir, check))


def graph_dot(ir: "Ir", title: str) -> str:
    """The Ir's graphs as one Graphviz digraph: ops as boxes, tensors as the edges' labels."""
    lines = [f'digraph "{title}" {{']
    for g in ir._graphs.values():
        lines.append(f'  subgraph "cluster_{g.id}" {{ label="{g.name or "main"}";')
        producer: Dict[str, int] = {}
        for op in schedule(g):
            lines.append(f'    op{op.id} [shape=box, label="{op.type} ({op.id})"];')
            for t in op.inputs:
                if t.id in producer:
                    lines.append(f'    op{producer[t.id]} -> op{op.id} [label="{t.id}"];')
            for t in op.outputs:
                producer[t.id] = op.id
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
