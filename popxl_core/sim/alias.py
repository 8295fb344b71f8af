"""When may a graph return a torch view instead of a copy? Static alias analysis for compile.

A view op (reshape, transpose, slice, ...) returns a torch view of its input. Inside a graph
without in-place ops that is always safe; a view *returned* from a graph is safe unless some
caller later writes the tensor it aliases (or the returned view) while the other is still
read. The compiler used to copy every returned view; copying a transposed weight matrix each
step dominated small training steps. `ViewOutputs.needs_copy` copies only where an alias can be
observed, decided once from the IR, at Session build:

* the view's root (following view ops back) is made inside the graph by a non-view op and no
  other graph output shares it: the caller receives the only handle on that storage;
* the root is a graph input and every call site is a plain ``call`` after which no write to
  the aliased tensor is followed by a read of the returned value (or anything viewed or
  called from it).

Everything else is copied, as before.
"""

from __future__ import annotations

import bisect
from typing import Dict, List, Set, Tuple

from ..graph import Graph, Op
from ..ops.call import CALL
from ..schedule import schedule
from ..tensor import Tensor

__all__ = ["ViewOutputs", "view_root"]


def view_root(t: Tensor) -> Tensor:
    """``t`` followed back through view ops (their input 0) within its graph."""
    while t.producer is not None and t.producer.opdef.view:
        t = t.producer.inputs[0]
    return t


def _is_plain_call(op: Op, g: Graph) -> bool:
    return op.opdef is CALL and tuple(op.called_graphs) == (g,)


class _GraphIndex:
    """What `ViewOutputs` asks of one graph, computed once (dictionaries instead of list
    scans, so that the analysis stays linear in the graph size)."""

    def __init__(self, g: Graph) -> None:
        self.inputs: Dict[Tensor, int] = {}
        for k, t in enumerate(g._inputs):
            self.inputs.setdefault(t, k)
        self.outputs: Dict[Tensor, int] = {}
        self.root_count: Dict[Tensor, int] = {}
        for k, t in enumerate(g._outputs):
            self.outputs.setdefault(t, k)
            root = view_root(t)
            self.root_count[root] = self.root_count.get(root, 0) + 1
        self.order = schedule(g)
        self.position = {op: k for k, op in enumerate(self.order)}
        self.consumers: Dict[Tensor, List[Op]] = {}
        self.written: Set[Tensor] = set()
        self.writers: List[Op] = []  # in schedule order
        for op in self.order:
            for t in op.inputs:
                readers = self.consumers.setdefault(t, [])
                if not readers or readers[-1] is not op:
                    readers.append(op)
            modified = op.modified_inputs()
            if modified:
                self.writers.append(op)
                self.written.update(op.inputs[k] for k in modified)


class ViewOutputs:
    """Per-Ir cache of call sites and per-graph indexes for `needs_copy`."""

    def __init__(self, ir) -> None:
        self._sites: Dict[Graph, List[Tuple[Graph, Op]]] = {}
        for h in ir._graphs.values():
            for op in h._ops:
                for c in op.called_graphs:
                    self._sites.setdefault(c, []).append((h, op))
        self._index: Dict[Graph, _GraphIndex] = {}
        self._roots_of: Dict[Tensor, Set[Tensor]] = {}
        # per caller graph: {root tensor: schedule positions of the ops writing into it}
        self._writes: Dict[Graph, Dict[Tensor, List[int]]] = {}
        # per call op: {caller tensor: the outputs that may alias it}, outputs always aliased
        self._call_maps: Dict[Op, Tuple[Dict[Tensor, List[Tensor]], List[Tensor]]] = {}

    def index(self, g: Graph) -> _GraphIndex:
        if g not in self._index:
            self._index[g] = _GraphIndex(g)
        return self._index[g]

    def is_output(self, g: Graph, t: Tensor) -> bool:
        """Whether ``t`` is an output of ``g``."""
        return t in self.index(g).outputs

    def needs_copy(self, g: Graph, out: Tensor) -> bool:
        """Whether graph output ``out`` (a view) must be copied before ``g`` returns it.
        ``g`` must have no op that writes a tensor in place (the caller checks)."""
        gi = self.index(g)
        root = view_root(out)
        if gi.root_count.get(root, 0) > 1:
            return True  # two outputs share storage: a write through one shows in the other
        if root.producer is not None:
            return False  # made here, by a non-view kernel: a fresh tensor only this view sees
        if root not in gi.inputs:
            return True  # a constant or variable: never hand out its storage
        i, j = gi.inputs[root], gi.outputs[out]
        return not all(self._site_safe(h, op, g, i, j) for h, op in self._sites.get(g, []))

    def _site_safe(self, h: Graph, op: Op, g: Graph, i: int, j: int) -> bool:
        if not _is_plain_call(op, g):
            return False
        if j >= len(op.outputs):
            return True  # the caller drops the output
        hi = self.index(h)
        here = hi.position[op]
        derived = self._derived(h, op.outputs[j])
        if any(t in hi.outputs or t in hi.written for t in derived):
            return False  # written through the view, or handed further up
        first_write = self._first_write(h, self._roots(op.inputs[i]), here)
        if first_write is None:
            return True
        return not any(
            hi.position[r] > first_write for t in derived for r in hi.consumers.get(t, ())
        )

    def _first_write(self, h: Graph, src: Set[Tensor], after: int):
        """The schedule position of the first op of ``h`` after ``after`` that writes a tensor
        sharing storage with one of ``src``, or None."""
        writes = self._writes.get(h)
        if writes is None:
            hi = self.index(h)
            writes = self._writes[h] = {}
            for w in hi.writers:
                for k in w.modified_inputs():
                    for r in self._roots(w.inputs[k]):
                        positions = writes.setdefault(r, [])
                        if not positions or positions[-1] != hi.position[w]:
                            positions.append(hi.position[w])
        found = None
        for r in src:
            positions = writes.get(r, [])
            k = bisect.bisect_right(positions, after)
            if k < len(positions) and (found is None or positions[k] < found):
                found = positions[k]
        return found

    def _roots(self, t: Tensor) -> Set[Tensor]:
        """Tensors of ``t``'s graph whose storage ``t`` may share: through views, and through
        calls (any input of a call whose output is rooted at one of its graph's inputs)."""
        t = view_root(t)
        if t in self._roots_of:
            return self._roots_of[t]
        op = t.producer
        roots = {t}
        if op is not None and op.called_graphs:
            k = op.outputs.index(t)
            for c in op.called_graphs:
                inner = view_root(c._outputs[k]) if k < len(c._outputs) else None
                if inner is not None and inner.producer is None:
                    for x in op.inputs:  # conservative: any input may be the one aliased
                        roots |= self._roots(x)
        self._roots_of[t] = roots
        return roots

    def _derived(self, h: Graph, t: Tensor) -> Set[Tensor]:
        """``t`` and every tensor of ``h`` that may alias it (views of it, call outputs):
        followed forward from ``t`` through the ops that read it, not over all of ``h``."""
        hi = self.index(h)
        derived = {t}
        pending = [t]
        while pending:
            x = pending.pop()
            for op in hi.consumers.get(x, ()):
                if op.opdef.view:
                    new = op.outputs
                elif op.called_graphs:
                    new = self._call_aliases(op, x)
                else:
                    continue
                for out in new:
                    if out not in derived:
                        derived.add(out)
                        pending.append(out)
        return derived

    def _call_aliases(self, op: Op, x: Tensor) -> List[Tensor]:
        """Outputs of ``op`` that may alias its input ``x``: of a plain call, those its graph
        returns as (views of) the input ``x`` feeds, or from an inner call; else all."""
        if op.opdef is not CALL:
            return list(op.outputs)
        if op not in self._call_maps:
            g = op.called_graphs[0]
            gi = self.index(g)
            by_input: Dict[Tensor, List[Tensor]] = {}
            always: List[Tensor] = []
            for t, inner in zip(op.outputs, g._outputs):
                root = view_root(inner)
                if root in gi.inputs:
                    by_input.setdefault(op.inputs[gi.inputs[root]], []).append(t)
                elif root.producer is not None and root.producer.called_graphs:
                    always.append(t)
            self._call_maps[op] = (by_input, always)
        by_input, always = self._call_maps[op]
        return always + by_input.get(x, [])
