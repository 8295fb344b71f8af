"""On-chip bytes of remote variables' data along the schedule: what phasing makes smaller.

An always-live variable is on chip for the whole program. A remote variable (weights or
optimiser state in Streaming Memory) is on chip only from the ``remote_load`` of its buffer
entry to the last use of what was loaded: the loaded tensor, the full tensor all-gathered
from an RTS shard, and copies of either (to and from IO tiles, ``identity``). This module
marks those tensors, following them into and out of called graphs, and sums their bytes live
at each step, in the way `liveness.py` does for all not-always-live tensors (they are part of
its curve). Its peak is the largest phase's variables for a phased program, where an unphased
one keeps them all on chip (ipu_model.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import Graph, Op
from ..ops.collectives.replicated import ALL_GATHER
from ..ops.conditional import CONDITIONAL
from ..ops.elementwise import IDENTITY
from ..ops.io import IO_TILE_COPY
from ..ops.remote import REMOTE_LOAD, REMOTE_LOAD_INPLACE
from ..remote_variables import remote_info
from ..tensor import Tensor
from .cost import nbytes_of
from .liveness import LivenessAnalysis, _alias_source, _buffer_spans, _live_curve, _own_outputs

__all__ = ["VariableLiveness", "VariableCurve"]

_LOADS = frozenset((REMOTE_LOAD, REMOTE_LOAD_INPLACE))
# ops whose output 0 is a new buffer holding the same variable data as input 0
_CARRIES = frozenset((ALL_GATHER, IO_TILE_COPY, IDENTITY))


@dataclass
class VariableCurve:
    """Bytes of remote variables' data live per IPU at each step of one graph (callees'
    peaks included at call steps), and which of the graph's tensors hold such data."""

    curve: list[dict[int, int]] = field(default_factory=list)
    peak: dict[int, int] = field(default_factory=dict)
    marked_outputs: tuple[bool, ...] = ()


class VariableLiveness:
    """The liveness of loaded remote-variable data of an Ir's graphs (cached per graph and
    per which of its inputs hold variable data)."""

    def __init__(self, ir, analysis: LivenessAnalysis | None = None) -> None:
        self.buffers = {
            info.buffer for v in ir.main_graph.variables if (info := remote_info(v)) is not None
        }
        # the schedules the liveness of all tensors already computed
        self.analysis = analysis or LivenessAnalysis()
        self._cache: dict[tuple[Graph, tuple[bool, ...]], VariableCurve] = {}

    def of(self, graph: Graph, inputs: tuple[bool, ...] | None = None) -> VariableCurve:
        """The curve of ``graph`` when its inputs flagged True hold variable data."""
        key = (graph, inputs if inputs is not None else (False,) * len(graph._inputs))
        if key not in self._cache:
            self._cache[key] = self._analyse(graph, key[1])
        return self._cache[key]

    def _analyse(self, graph: Graph, inputs: tuple[bool, ...]) -> VariableCurve:
        if not self.buffers and not any(inputs):  # no remote variables: nothing to follow
            return VariableCurve([{} for _ in graph._ops], {}, (False,) * len(graph._outputs))
        order = self.analysis.of(graph).ops
        marked = {t for t, flag in zip(graph._inputs, inputs) if flag}
        callees: dict[int, VariableCurve] = {}
        for i, op in enumerate(order):
            if op.called_graphs:
                callees[i] = self._callee(op, marked)
                marked.update(t for t, m in zip(op.outputs, callees[i].marked_outputs) if m)
            elif self._holds_variable(op, marked):
                marked.add(op.outputs[0])
                src = _alias_source(op)
                if src is not None:  # an in-place fill: the buffer it fills holds the data
                    marked.add(src)
        spans = {t: s for t, s in _buffer_spans(graph, order).items() if t in marked}
        curve = _live_curve(spans, len(order))
        for i, callee in callees.items():
            curve[i] = _call_step(curve[i], order[i], marked, callee.peak)
        peak: dict[int, int] = {}
        for step in curve:
            for ipu, nbytes in step.items():
                peak[ipu] = max(peak.get(ipu, 0), nbytes)
        outs = tuple(t in marked for t in graph._outputs)
        return VariableCurve(curve, peak, outs)

    def _holds_variable(self, op: Op, marked: set[Tensor]) -> bool:
        if not op.outputs:
            return False
        if op.opdef in _LOADS:
            return op.attrs["buffer"] in self.buffers
        src = _alias_source(op)
        carried = op.opdef in _CARRIES and op.inputs and op.inputs[0] in marked
        return bool(carried) or (src is not None and src in marked)

    def _callee(self, op: Op, marked: set[Tensor]) -> VariableCurve:
        """The dearest callee's curve, with the inputs that hold variable data flagged (an
        If's condition input shifts its operands: its branches are taken unflagged)."""
        curves = []
        for g in op.called_graphs:
            flags = None
            if op.opdef is not CONDITIONAL and len(op.inputs) == len(g._inputs):
                flags = tuple(t in marked for t in op.inputs)
            curves.append(self.of(g, flags))
        best = max(curves, key=lambda c: sum(c.peak.values()))
        outs = tuple(
            any(c.marked_outputs[k] for c in curves if k < len(c.marked_outputs))
            for k in range(len(op.outputs))
        )
        return VariableCurve(best.curve, best.peak, outs)


def _call_step(
    step: dict[int, int], op: Op, marked: set[Tensor], callee_peak: dict[int, int]
) -> dict[int, int]:
    """What the caller keeps live across a call plus the callee's own peak (the call's
    outputs are counted inside the callee)."""
    step = dict(step)
    for t in _own_outputs(op):
        if t in marked:
            step[t.ipu] = step.get(t.ipu, 0) - nbytes_of(t)
    for ipu, nbytes in callee_peak.items():
        step[ipu] = step.get(ipu, 0) + nbytes
    return step
