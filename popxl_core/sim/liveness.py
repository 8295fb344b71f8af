"""Liveness of not-always-live tensors over each graph's schedule, per IPU.

A tensor's buffer is live from the step of the op that produces it to the step of its last
consumer; graph outputs stay live to the graph's last step. An in-place or view output, and the
tensor a HostLoad fills, share their input's buffer: they add no bytes but keep it alive. At a
call step the callee's own peak is added to what the caller keeps live across the call (the
call's outputs are the callee's outputs, so they are counted inside the callee).
Variables, constants, graph inputs and stream tensors are not part of it: the first two are
always-live, graph inputs belong to the caller, stream tensors are stream buffers.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

from ..graph import Graph, Op
from ..ops.io import HOST_LOAD
from ..ops.remote import REMOTE_LOAD_INPLACE
from ..schedule import schedule
from ..tensor import Tensor
from .cost import nbytes_of

__all__ = ["TOP_N", "LiveTensor", "Liveness", "LivenessAnalysis", "flat_curve", "live_at_peak"]

TOP_N = 5  # how many of the largest tensors live at a peak are kept for reports

# A HostLoad writes the stream data into the buffer its Init input allocated (as in PopART).
_FILLS_INPUT = frozenset((HOST_LOAD, REMOTE_LOAD_INPLACE))


class LiveTensor(NamedTuple):
    """A tensor live at a peak: its id, bytes, the op that made it (``"<type>.<id>"``), that
    op's graph and, for programs from popxl_fx, the torch module path the op came from."""

    name: str
    nbytes: int
    op: str
    graph: str
    module_path: str | None = None

    @classmethod
    def of(cls, t: Tensor) -> LiveTensor:
        op = t.producer
        made = f"{op.type}.{op.id}" if op is not None else "input"
        return cls(
            t.id, nbytes_of(t), made, t.graph.name or "main", getattr(op, "module_path", None)
        )


@dataclass
class Liveness:
    """Not-always-live bytes of one graph.

    Attributes:
        steps: ``"<OpType>.<id>"`` of every op, in schedule order.
        curve: bytes live per IPU at each step, callees' peaks included.
        peak: the largest value of ``curve`` per IPU.
        peak_step: the step index of that peak per IPU.
        top: per IPU, the largest tensors live at the peak (`LiveTensor`).
        base: at each call or loop step, what the caller keeps live across it (the callee's
            own curve adds to it).
    """

    graph: Graph
    steps: list[str] = field(default_factory=list)
    curve: list[dict[int, int]] = field(default_factory=list)
    peak: dict[int, int] = field(default_factory=dict)
    peak_step: dict[int, int] = field(default_factory=dict)
    top: dict[int, list[LiveTensor]] = field(default_factory=dict)
    base: dict[int, dict[int, int]] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)


class LivenessAnalysis:
    """Computes (and caches) the liveness of a graph and of every graph it calls."""

    def __init__(self) -> None:
        self._cache: dict[Graph, Liveness] = {}

    def of(self, graph: Graph) -> Liveness:
        if graph not in self._cache:
            self._cache[graph] = self._analyse(graph)
        return self._cache[graph]

    def _analyse(self, graph: Graph) -> Liveness:
        order = schedule(graph)
        spans = _buffer_spans(graph, order)
        curve = _live_curve(spans, len(order))
        live = Liveness(graph, [f"{op.type}.{op.id}" for op in order], ops=order)
        for i, op in enumerate(order):
            step = curve[i]
            if op.called_graphs:
                live.base[i] = self._across_call(op, step)
                step = self._call_step(op, live.base[i])
            live.curve.append(step)
        for i, step in enumerate(live.curve):
            for ipu, nbytes in step.items():
                if nbytes > live.peak.get(ipu, -1):
                    live.peak[ipu], live.peak_step[ipu] = nbytes, i
        for ipu, i in live.peak_step.items():
            live.top[ipu] = self._top_at(order[i], i, ipu, spans)
        return live

    @staticmethod
    def _across_call(op: Op, step: dict[int, int]) -> dict[int, int]:
        """Caller's live bytes at a call step without the call's outputs."""
        step = dict(step)
        for t in _own_outputs(op):
            step[t.ipu] -= nbytes_of(t)
        return step

    def _call_step(self, op: Op, step: dict[int, int]) -> dict[int, int]:
        """What the caller keeps live across the call plus the (largest) callee peak."""
        step = dict(step)
        peaks = [self.of(g).peak for g in op.called_graphs]
        for ipu in {i for p in peaks for i in p}:
            step[ipu] = step.get(ipu, 0) + max(p.get(ipu, 0) for p in peaks)
        return step

    def _top_at(self, op: Op, i: int, ipu: int, spans) -> list[LiveTensor]:
        skip = set(_own_outputs(op)) if op.called_graphs else set()
        found = [
            LiveTensor.of(t)
            for t, (a, b) in spans.items()
            if a <= i <= b and t.ipu == ipu and t not in skip
        ]
        if op.called_graphs:
            callee = max((self.of(g) for g in op.called_graphs), key=lambda lv: lv.peak.get(ipu, 0))
            found += callee.top.get(ipu, [])
        return heapq.nlargest(TOP_N, found, key=lambda x: x.nbytes)


def live_at_peak(analysis: LivenessAnalysis, graph: Graph, ipu: int) -> list[Tensor]:
    """Every not-always-live buffer of ``graph`` live at its peak on ``ipu``; at a call step,
    what the caller keeps across the call plus the largest callee's own peak set (the full
    list behind ``Liveness.top``, for reports that group it, e.g. by module)."""
    live = analysis.of(graph)
    i = live.peak_step.get(ipu)
    if i is None:
        return []
    op = live.ops[i]
    skip = set(_own_outputs(op)) if op.called_graphs else set()
    found = [
        t
        for t, (a, b) in _buffer_spans(graph, live.ops).items()
        if a <= i <= b and t.ipu == ipu and t not in skip
    ]
    if op.called_graphs:
        callee = max(op.called_graphs, key=lambda g: analysis.of(g).peak.get(ipu, 0))
        found += live_at_peak(analysis, callee, ipu)
    return found


def flat_curve(
    analysis: LivenessAnalysis, graph: Graph, ipu: int, prefix: str = ""
) -> list[tuple[str, int]]:
    """``(step path, bytes)`` on ``ipu`` along ``graph``'s schedule with every call and loop
    expanded into its callee's steps (one iteration of a loop: they all look alike); a path
    reads ``"Call.3/Add.1"``."""
    live = analysis.of(graph)
    out: list[tuple[str, int]] = []
    for i, (name, step) in enumerate(zip(live.steps, live.curve)):
        op = live.ops[i]
        if not op.called_graphs:
            out.append((prefix + name, step.get(ipu, 0)))
            continue
        # an If shows its dearer branch, the one the peak counts
        callee = max(op.called_graphs, key=lambda g: analysis.of(g).peak.get(ipu, 0))
        base = live.base[i].get(ipu, 0)
        inner = flat_curve(analysis, callee, ipu, f"{prefix}{name}/")
        out.extend((path, base + b) for path, b in inner)
        if not inner:
            out.append((prefix + name, base))
    return out


def _alias_source(op: Op) -> Tensor | None:
    """The input whose buffer output 0 shares, if any."""
    if not op.inputs or not op.outputs:
        return None
    if op.opdef.inplace:
        return op.inputs[op.opdef.inplace[0]]
    if op.opdef.view or op.opdef in _FILLS_INPUT:
        return op.inputs[0]
    return None


def _buffer_spans(graph: Graph, order: list[Op]) -> dict[Tensor, tuple[int, int]]:
    """First and last step of every buffer the graph's ops allocate."""
    root: dict[Tensor, Tensor] = {}
    first: dict[Tensor, int] = {}
    last: dict[Tensor, int] = {}
    for i, op in enumerate(order):
        for t in op.inputs:
            b = root.get(t)
            if b is not None:
                last[b] = i
        src = _alias_source(op)
        for k, t in enumerate(op.outputs):
            if k == 0 and src is not None:
                root[t] = root.get(src, src)  # may be a variable or input: then not a buffer
            else:
                root[t] = t
                first[t] = last[t] = i
    for t in graph._outputs:
        b = root.get(t)
        if b in first:
            last[b] = len(order) - 1
    return {b: (first[b], last[b]) for b in first}


def _live_curve(spans: dict[Tensor, tuple[int, int]], n: int) -> list[dict[int, int]]:
    delta: dict[int, list[int]] = {}
    for t, (a, b) in spans.items():
        d = delta.setdefault(t.ipu, [0] * (n + 1))
        d[a] += nbytes_of(t)
        d[b + 1] -= nbytes_of(t)
    curve: list[dict[int, int]] = [{} for _ in range(n)]
    for ipu, d in delta.items():
        acc = 0
        for i in range(n):
            acc += d[i]
            curve[i][ipu] = acc
    return curve


def _own_outputs(op: Op) -> list[Tensor]:
    """Outputs of ``op`` that are new buffers (not aliases of an input)."""
    src = _alias_source(op)
    return [t for k, t in enumerate(op.outputs) if not (k == 0 and src is not None)]
