"""Reverse-mode autodiff over the IR, with popxl's contract.

`autodiff(graph)` builds a new grad graph ``{fwd}_bwd``. Forward values the gradient rules
need become grad-graph inputs of type `Fwd`; when such a value is internal to the forward
graph, it is added as a new *forward graph output* (popxl mutates the forward graph the same
way, which is why autodiff must run before the forward graph's call sites are made).
Gradient rules come from the op table (`OpDef.grad`) and are written with our own ops.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

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
        self.position = {op: i for i, op in enumerate(fwd._ops)}
        self.reads = _read_versions(fwd)
        self.needs_grad = _forward_reach(fwd, required, self.reads)
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
        if t not in self.fwd.inputs and t not in self.fwd.outputs:
            self.fwd._add_output(t)  # popxl semantics: autodiff adds forward outputs
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
        if not _modified_from(self.fwd, t, at):
            return t
        if (t, at) not in self._copies:
            self._copies[(t, at)] = _insert_copy_at(self.fwd, t, at, self.position)
        return self._copies[(t, at)]

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
    ``a`` reads the in-place op's output. Gradients must flow along these versions.
    """
    latest: Dict[Tensor, Tensor] = {}
    reads: Dict[Op, List[Tensor]] = {}
    for op in graph._ops:
        reads[op] = [latest.get(t, t) for t in op.inputs]
        if op.opdef.inplace and op.outputs:
            target = op.inputs[op.opdef.inplace[0]]
            group = {t for t, v in latest.items() if v is latest.get(target, target)}
            for t in group | {target, reads[op][op.opdef.inplace[0]], op.outputs[0]}:
                latest[t] = op.outputs[0]
    return reads


def _forward_reach(graph: Graph, start: Iterable[Tensor], reads) -> Set[Tensor]:
    reach = set(start)
    for op in graph._ops:
        if any(t in reach for t in reads[op]):
            reach.update(op.outputs)
    return reach


def _backward_reach(graph: Graph, ends: Iterable[Tensor], reads) -> Set[Op]:
    wanted, ops = set(ends), set()
    for op in reversed(graph._ops):
        if any(t in wanted for t in op.outputs):
            ops.add(op)
            wanted.update(reads[op])
    return ops


def _alias_group(graph: Graph, t: Tensor) -> Set[Tensor]:
    """Tensors sharing storage with ``t`` through in-place ops."""
    group, changed = {t}, True
    while changed:
        changed = False
        for op in graph._ops:
            if op.opdef.inplace and op.outputs:
                pair = {op.inputs[op.opdef.inplace[0]], op.outputs[0]}
                if group & pair and not pair <= group:
                    group |= pair
                    changed = True
    return group


def _modified_from(graph: Graph, t: Tensor, start: int) -> bool:
    group = _alias_group(graph, t)
    return any(op.inputs[i] in group for op in graph._ops[start:] for i in op.modified_inputs())


def _insert_copy_at(graph: Graph, t: Tensor, index: int, position: Dict[Op, int]) -> Tensor:
    from .. import ops

    with graph:
        copy = ops.identity(t, f"{t.name}_saved")
    op = copy.producer
    graph._ops.remove(op)
    graph._ops.insert(index, op)
    graph._topocons = [(a, b) for a, b in graph._topocons if op not in (a, b)]
    position.clear()
    position.update({o: i for i, o in enumerate(graph._ops)})
    return copy
