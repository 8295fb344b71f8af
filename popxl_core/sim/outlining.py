"""What outlining saves: the code of a program as compiled against the same program inlined.

A graph is compiled once however many ``Call`` ops call it (ipu_model.md: code is one of the
always-live memory categories), so outlining N identical blocks into one graph called N times
keeps one copy of the block's code where inlining keeps N. Loop bodies (``Repeat``) and
branches are one copy either way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..ops.call import CALL
from .graphs import reachable_graphs  # the graphs the planner walks
from .units import fmt_bytes

__all__ = ["Outlining", "outlining"]


@dataclass(frozen=True)
class Outlining:
    """Code bytes as compiled and as if every ``Call`` were inlined (estimates, all IPUs).

    Attributes:
        code_bytes: every graph's code once (the report's code memory).
        inlined_code_bytes: the same program with each ``Call`` replaced by its graph's ops.
        call_sites: graph name -> how many ``Call`` ops call it, for graphs called more than
            once.
    """

    code_bytes: int
    inlined_code_bytes: int
    call_sites: dict[str, int] = field(default_factory=dict)

    @property
    def saved_bytes(self) -> int:
        return self.inlined_code_bytes - self.code_bytes

    def line(self) -> str:
        graphs = ", ".join(f"{g} x{n}" for g, n in self.call_sites.items())
        return (
            f"Outlining: code {fmt_bytes(self.code_bytes)}, inlined "
            f"{fmt_bytes(self.inlined_code_bytes)}, saved {fmt_bytes(self.saved_bytes)} "
            f"({graphs or 'no graph called twice'})"
        )

    def to_dict(self) -> dict:
        return {
            "code_bytes": self.code_bytes,
            "inlined_code_bytes": self.inlined_code_bytes,
            "saved_bytes": self.saved_bytes,
            "call_sites": dict(self.call_sites),
        }


def outlining(plan) -> Outlining:
    """The `Outlining` of a `Plan` (needs the plan's main graph and cost model)."""
    model = plan.model
    own: dict = {}
    inlined: dict = {}

    def code(g) -> int:
        if g not in own:
            own[g] = sum(model.code_bytes(op) for op in g._ops)
        return own[g]

    def expanded(g) -> int:
        if g not in inlined:
            total = 0
            for op in g._ops:
                if op.opdef is CALL:  # the call op becomes its graph's ops
                    total += expanded(op.called_graphs[0])
                    continue
                total += model.code_bytes(op) + sum(expanded(c) for c in op.called_graphs)
            inlined[g] = total
        return inlined[g]

    graphs = reachable_graphs(plan.main)
    sites = Counter(op.called_graphs[0].name for g in graphs for op in g._ops if op.opdef is CALL)
    return Outlining(
        sum(code(g) for g in graphs),
        expanded(plan.main),
        {name: n for name, n in sites.items() if n > 1},
    )
