"""Reverse-mode autodiff over the IR, with popxl's contract.

`autodiff(graph)` builds a new grad graph ``{fwd}_bwd``. Forward values the gradient rules
need become grad-graph inputs of type `Fwd`; when such a value is internal to the forward
graph, it is added as a new *forward graph output* (popxl mutates the forward graph the same
way, which is why autodiff must run before the forward graph's call sites are made).
Gradient rules come from the op table (`OpDef.grad`) and are written with our own ops.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..context import module_origin
from ..graph import Graph, Op
from ..tensor import Constant, Tensor, constant, graph_input, graph_output
from .grad_info import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

__all__ = [
    "autodiff",
    "GradContext",
    "GradGraphInfo",
    "ExpectedConnection",
    "ExpectedConnectionType",
]

_FWD = ExpectedConnectionType.Fwd
_FWD_GRAD = ExpectedConnectionType.FwdGrad


def autodiff(
    graph: Graph,
    grads_provided: Optional[Iterable[Tensor]] = None,
    grads_required: Optional[Iterable[Tensor]] = None,
    called_graphs_grad_info: Optional[Mapping[Graph, GradGraphInfo]] = None,
    return_all_grad_graphs: bool = False,
):
    """Differentiate ``graph``; see the module docstring.

    Args:
        graph: the forward subgraph.
        grads_provided: forward tensors whose gradients are grad-graph inputs (default: outputs).
        grads_required: forward tensors whose gradients are grad-graph outputs (default: inputs).
        called_graphs_grad_info: grad graphs to use for graphs that ``graph`` calls.
        return_all_grad_graphs: return ``{graph: GradGraphInfo}`` for every graph differentiated.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"autodiff expects a popxl.Graph, got {type(graph).__name__}.")
    if graph is graph.main_graph:
        raise ValueError("autodiff cannot differentiate the main graph; use a subgraph.")
    provided = list(graph.outputs if grads_provided is None else grads_provided)
    required = list(graph.inputs if grads_required is None else grads_required)
    _check_membership(graph, provided, "grads_provided")
    _check_membership(graph, required, "grads_required")
    known: Dict[Graph, GradGraphInfo] = dict(called_graphs_grad_info or {})
    info = _Differentiator(graph, provided, required, known).run()
    known[graph] = info
    return known if return_all_grad_graphs else info


def _check_membership(graph: Graph, tensors: Sequence[Tensor], arg: str) -> None:
    for t in tensors:
        if not isinstance(t, Tensor) or t.graph is not graph:
            where = t.graph.name if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"autodiff {arg}: {t!r} is not a tensor of graph {graph.name!r} "
                f"(it belongs to {where!r})."
            )


def _grad_graph_id(fwd: Graph) -> str:
    base, k = f"{fwd.id}_bwd", 0
    taken = fwd.ir._graphs
    candidate = base
    while candidate in taken:
        candidate, k = f"{base}_{k}", k + 1
    return candidate


class GradContext:
    """What a gradient rule sees: the forward op, forward values and output gradients."""

    def __init__(self, diff: "_Differentiator", op: Op, grads_out: List[Optional[Tensor]]):
        self._diff = diff
        self.op = op
        self.attrs = op.attrs
        self._grads_out = grads_out

    def input(self, i: int) -> Tensor:
        """The forward value of input ``i``, as a tensor of the grad graph."""
        return self._diff.fwd_value(self.op.inputs[i], self.op)

    def output(self, i: int) -> Tensor:
        """The forward value of output ``i``, as a tensor of the grad graph."""
        return self._diff.fwd_value(self.op.outputs[i], None)

    def grad_output(self, i: int) -> Optional[Tensor]:
        return self._grads_out[i]

    def grad_output_or_zero(self, i: int) -> Tensor:
        g = self._grads_out[i]
        return g if g is not None else zeros_like_spec(self.op.outputs[i])

    def requires_grad(self, i: int) -> bool:
        return self._diff.reads[self.op][i] in self._diff.needs_grad

    @property
    def differentiator(self) -> "_Differentiator":
        return self._diff


def zeros_like_spec(t: Tensor) -> Tensor:
    from .. import ops

    return ops.init(t.shape, t.dtype, "zeros", "zero")


class _Differentiator:
    def __init__(
        self,
        fwd: Graph,
        provided: List[Tensor],
        required: List[Tensor],
        known: Dict[Graph, GradGraphInfo],
    ) -> None:
        self.fwd = fwd
        self.provided = provided
        self.required = required
        self.known = known
        self.grad_graph = fwd.ir._new_graph(_grad_graph_id(fwd))
        self.expected_inputs: List[ExpectedConnection] = []
        self.fwd_values: Dict[Tensor, Tensor] = {}
        self.grads: Dict[Tensor, Tensor] = {}
        # Positions of the forward ops as they are now; saved-value copies are spliced in
        # once, at the end of `run` (`_place_copies`), so positions never need renumbering.
        self.position = {op: i for i, op in enumerate(fwd._ops)}
        self.reads = _read_versions(fwd)
        self.needs_grad = _forward_reach(fwd, required, self.reads)
        self._last_write = _LastWrites(fwd)
        self._io = set(fwd._inputs) | set(fwd._outputs)
        self._copies: Dict[Tuple[Tensor, int], Tensor] = {}

    # forward values --------------------------------------------------------------------
    def fwd_value(self, t: Tensor, reader: Optional[Op]) -> Tensor:
        """The grad-graph tensor carrying forward value ``t`` (as ``reader`` saw it)."""
        if isinstance(t, Constant):
            return self._constant_copy(t)
        source = self._unclobbered(t, reader)
        if source not in self.fwd_values:
            self.fwd_values[source] = self._fwd_input(source)
        return self.fwd_values[source]

    def _constant_copy(self, c: Constant) -> Tensor:
        if c not in self.fwd_values:
            with self.grad_graph:
                self.fwd_values[c] = constant(c._data, c.dtype, c.name)
        return self.fwd_values[c]

    def _fwd_input(self, t: Tensor) -> Tensor:
        if t not in self._io:
            self.fwd._add_output(t)  # popxl semantics: autodiff adds forward outputs
            self._io.add(t)
        with self.grad_graph:
            g_in = graph_input(t.shape, t.dtype, t.name, meta_shape=t.meta_shape)
        self.expected_inputs.append(ExpectedConnection(t, _FWD))
        return g_in

    def _unclobbered(self, t: Tensor, reader: Optional[Op]) -> Tensor:
        """``t`` itself, or a copy of the value ``reader`` saw, if ``t`` is overwritten later.

        Ops mutate tensors in creation order (like torch), so the value a gradient rule needs
        is the one at the reading op; the grad graph reads forward values only after the
        whole forward graph ran.
        """
        if reader is not None:
            at = self.position[reader]
        else:
            at = self.position[t.producer] + 1 if t.producer in self.position else 0
        if not self._last_write.modified_from(t, at, self.position):
            return t
        if (t, at) not in self._copies:
            from .. import ops

            with self.fwd:
                self._copies[(t, at)] = ops.identity(t, f"{t.name}_saved")
        return self._copies[(t, at)]

    def _place_copies(self) -> None:
        """Move each saved-value copy (made at the end of the forward graph) to just before
        the op position it saves the value at, in one pass over the forward ops."""
        if not self._copies:
            return
        at: Dict[int, List[Op]] = {}
        for (_, index), copy in self._copies.items():
            assert copy.producer is not None  # an identity's output
            at.setdefault(index, []).append(copy.producer)
        copies = {op for ops_ in at.values() for op in ops_}
        graph = self.fwd
        ordered: List[Op] = []
        originals = sorted(self.position, key=self.position.__getitem__)
        for i, op in enumerate(originals):
            ordered.extend(reversed(at.get(i, ())))
            ordered.append(op)
        ordered.extend(reversed(at.get(len(originals), ())))
        known = copies | set(originals)
        ordered.extend(op for op in graph._ops if op not in known)
        graph._ops[:] = ordered
        # in_sequence may have ordered the copies after the last forward op: drop that
        graph._topocons = [c for c in graph._topocons if c[0] not in copies and c[1] not in copies]
        for (t, index), copy in self._copies.items():
            assert copy.producer is not None  # made by a copy op in `_place_copies`
            self._order_copy(t, index, copy.producer, originals)

    def _order_copy(self, t: Tensor, index: int, copy: Op, originals: List[Op]) -> None:
        """Order a saved-value copy after the writes of its storage before ``index`` and
        before those from ``index`` on, so that it reads that version under any schedule
        (and PopXL's inplacing ambiguity check accepts it)."""
        root = self._last_write.sets.find(t)
        for i, op in enumerate(originals):
            if any(self._last_write.sets.find(op.inputs[k]) == root for k in op.modified_inputs()):
                self.fwd._add_topocon(*((op, copy) if i < index else (copy, op)))

    # main loop ----------------------------------------------------------------------------
    def run(self) -> GradGraphInfo:
        with self.grad_graph:
            for t in self.provided:
                self._add_grad(
                    t,
                    graph_input(t.shape, t.dtype, f"Gradient___{t.name}", meta_shape=t.meta_shape),
                )
        grad_inputs = [ExpectedConnection(t, _FWD_GRAD) for t in self.provided]
        contributing = _backward_reach(self.fwd, self.provided, self.reads)
        for op in reversed(list(self.fwd._ops)):
            if op in contributing and any(t in self.needs_grad for t in self.reads[op]):
                self._backprop(op)
        self._place_copies()
        with self.grad_graph:
            for t in self.required:
                graph_output(self.grads[t] if t in self.grads else zeros_like_spec(t))
        outputs = [ExpectedConnection(t, _FWD_GRAD) for t in self.required]
        return GradGraphInfo._create(
            self.grad_graph, self.fwd, grad_inputs + self.expected_inputs, outputs
        )

    def _backprop(self, op: Op) -> None:
        grads_out = [self.grads.get(t) for t in op.outputs]
        if all(g is None for g in grads_out):
            return
        if op.opdef.grad is None:
            raise ValueError(
                f"autodiff: op {op.type}.{op.id} in graph {self.fwd.name!r} has no "
                "gradient rule, but a required gradient flows through it."
            )
        # the gradient ops name the module of the op they differentiate (reports, OOM
        # messages); the sums of gradient contributions too
        origin = module_origin(op.module_path) if op.module_path else contextlib.nullcontext()
        with origin:
            with self.grad_graph:
                grads_in = op.opdef.grad(GradContext(self, op, grads_out))
            for t, g in zip(self.reads[op], grads_in):
                if g is not None and t in self.needs_grad:
                    self._add_grad(t, g)

    def _add_grad(self, t: Tensor, g: Tensor) -> None:
        from .. import ops

        if g.shape != t.shape:
            raise ValueError(
                f"autodiff: gradient of {t.id!r} has shape {g.shape}, expected {t.shape}."
            )
        if t in self.grads:
            with self.grad_graph:
                g = ops.add(self.grads[t], g)
        self.grads[t] = g


def _read_versions(graph: Graph) -> Dict[Op, List[Tensor]]:
    """For each op, the tensor *version* each input reads.

    Ops mutate in creation order, like torch: after ``add_(a, x)``, a later op that names
    ``a`` reads the in-place op's output. Gradients must flow along these versions. Every
    tensor an in-place op's target was, or became, reads the op's output from then on: one
    set of a union-find, which keeps its latest version (linear in the graph size).
    """
    sets = _UnionFind()
    latest: Dict[Tensor, Tensor] = {}  # set representative -> latest version
    reads: Dict[Op, List[Tensor]] = {}
    for op in graph._ops:
        reads[op] = [latest.get(sets.find(t), t) for t in op.inputs]
        if op.opdef.inplace and op.outputs:
            target = op.inputs[op.opdef.inplace[0]]
            latest[sets.union(target, op.outputs[0])] = op.outputs[0]
    return reads


class _UnionFind:
    """Disjoint sets of tensors (path halving); a tensor never added is its own set."""

    def __init__(self) -> None:
        self.parent: Dict[Tensor, Tensor] = {}

    def find(self, t: Tensor) -> Tensor:
        parent = self.parent
        while t in parent and parent[t] is not t:
            parent[t] = parent.get(parent[t], parent[t])
            t = parent[t]
        return t

    def union(self, a: Tensor, b: Tensor) -> Tensor:
        ra, rb = self.find(a), self.find(b)
        self.parent.setdefault(ra, ra)
        self.parent[rb] = ra
        return ra


class _LastWrites:
    """For each set of tensors sharing storage through in-place ops, the last op that
    writes one of them (in-place ops and by-ref call inputs)."""

    def __init__(self, graph: Graph) -> None:
        self.sets = _UnionFind()
        for op in graph._ops:
            if op.opdef.inplace and op.outputs:
                self.sets.union(op.inputs[op.opdef.inplace[0]], op.outputs[0])
        self.last: Dict[Tensor, Op] = {}
        for op in graph._ops:
            for i in op.modified_inputs():
                self.last[self.sets.find(op.inputs[i])] = op

    def modified_from(self, t: Tensor, start: int, position: Dict[Op, int]) -> bool:
        """Whether an op at ``position`` >= ``start`` writes ``t`` or a tensor sharing it."""
        op = self.last.get(self.sets.find(t))
        return op is not None and position[op] >= start


def _forward_reach(graph: Graph, start: Iterable[Tensor], reads) -> Set[Tensor]:
    reach = set(start)
    for op in graph._ops:
        # a detached value needs no gradient: rules may then skip it (GradContext.requires_grad)
        if any(t in reach for t in reads[op]) and not op.opdef.stops_gradient:
            reach.update(op.outputs)
    return reach


def _backward_reach(graph: Graph, ends: Iterable[Tensor], reads) -> Set[Op]:
    wanted, ops = set(ends), set()
    for op in reversed(graph._ops):
        if any(t in wanted for t in op.outputs):
            ops.add(op)
            wanted.update(reads[op])
    return ops
