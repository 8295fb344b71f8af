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

from typing import Dict, List, Set, Tuple

from ..graph import Graph, Op
from ..schedule import schedule
from ..tensor import Tensor

__all__ = ["ViewOutputs", "view_root"]


def view_root(t: Tensor) -> Tensor:
    """``t`` followed back through view ops (their input 0) within its graph."""
    while t.producer is not None and t.producer.opdef.view:
        t = t.producer.inputs[0]
    return t


def _is_plain_call(op: Op, g: Graph) -> bool:
    return op.type == "Call" and tuple(op.called_graphs) == (g,)


class ViewOutputs:
    """Per-Ir cache of call sites and schedules for `needs_copy`."""

    def __init__(self, ir) -> None:
        self._sites: Dict[Graph, List[Tuple[Graph, Op]]] = {}
        for h in ir._graphs.values():
            for op in h._ops:
                for c in op.called_graphs:
                    self._sites.setdefault(c, []).append((h, op))
        self._positions: Dict[Graph, Dict[Op, int]] = {}

    def needs_copy(self, g: Graph, out: Tensor) -> bool:
        """Whether graph output ``out`` (a view) must be copied before ``g`` returns it.
        ``g`` must have no op that writes a tensor in place (the caller checks)."""
        root = view_root(out)
        if sum(view_root(o) is root for o in g._outputs) > 1:
            return True  # two outputs share storage: a write through one shows in the other
        if root.producer is not None:
            return False  # made here, by a non-view kernel: a fresh tensor only this view sees
        if root not in g._inputs:
            return True  # a constant or variable: never hand out its storage
        i, j = g._inputs.index(root), g._outputs.index(out)
        return not all(self._site_safe(h, op, g, i, j) for h, op in self._sites.get(g, []))

    def _site_safe(self, h: Graph, op: Op, g: Graph, i: int, j: int) -> bool:
        if not _is_plain_call(op, g):
            return False
        if j >= len(op.outputs):
            return True  # the caller drops the output
        pos = self._position(h)
        here = pos[op]
        derived = self._derived(h, op.outputs[j])
        if any(t in h._outputs for t in derived) or any(
            h_op.inputs[k] in derived for h_op in h._ops for k in h_op.modified_inputs()
        ):
            return False  # written through the view, or handed further up
        src = self._roots(op.inputs[i])
        first_write = min(
            (
                pos[w]
                for w in h._ops
                if pos[w] > here
                and any(self._roots(w.inputs[k]) & src for k in w.modified_inputs())
            ),
            default=None,
        )
        if first_write is None:
            return True
        return not any(pos[r] > first_write and set(r.inputs) & derived for r in h._ops)

    def _position(self, h: Graph) -> Dict[Op, int]:
        if h not in self._positions:
            self._positions[h] = {op: k for k, op in enumerate(schedule(h))}
        return self._positions[h]

    def _roots(self, t: Tensor) -> Set[Tensor]:
        """Tensors of ``t``'s graph whose storage ``t`` may share: through views, and through
        calls (any input of a call whose output is rooted at one of its graph's inputs)."""
        t = view_root(t)
        op = t.producer
        if op is None or not op.called_graphs:
            return {t}
        roots = {t}
        for c in op.called_graphs:
            k = op.outputs.index(t)
            inner = view_root(c._outputs[k]) if k < len(c._outputs) else None
            if inner is not None and inner.producer is None:
                for x in op.inputs:  # conservative: any input may be the one aliased
                    roots |= self._roots(x)
        return roots

    @staticmethod
    def _derived(h: Graph, t: Tensor) -> Set[Tensor]:
        """``t`` and every tensor of ``h`` that may alias it (views of it, call outputs)."""
        derived = {t}
        for op in schedule(h):
            if not set(op.inputs) & derived:
                continue
            if op.opdef.view:
                derived.update(op.outputs)
            elif op.called_graphs:
                derived.update(_call_aliases(op, derived))
        return derived


def _call_aliases(op: Op, of: Set[Tensor]) -> List[Tensor]:
    """Outputs of ``op`` that may alias a tensor in ``of``: of a plain call, those its graph
    returns as (views of) the inputs given ``of``, or from an inner call; else all."""
    if op.type != "Call":
        return list(op.outputs)
    g = op.called_graphs[0]
    found = []
    for t, inner in zip(op.outputs, g._outputs):
        root = view_root(inner)
        if root in g._inputs:
            if op.inputs[g._inputs.index(root)] in of:
                found.append(t)
        elif root.producer is not None and root.producer.called_graphs:
            found.append(t)
    return found
