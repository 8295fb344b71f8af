"""Call sites: CallSiteInfo, and the checks, input preparation and cost that every calling op
(call, repeat, conditional) shares.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..context import gcg
from ..graph import Graph, Op
from ..tensor import Tensor, constant
from .registry import Cost

__all__ = ["CallSiteInfo", "flatten_one_level", "sync_call_outputs"]


class CallSiteInfo:
    """Where a graph is called: maps between the called graph's tensors and the parent's."""

    def __init__(self, op: Op) -> None:
        self._op = op
        self._index: Tuple[Any, ...] = ()

    def _positions(self) -> Tuple[Dict[Tensor, int], Dict[Tensor, int]]:
        """{tensor: first index} of the called graph's inputs and outputs, rebuilt when
        the graph gains inputs/outputs (autodiff adds outputs): one lookup per mapping
        instead of a list scan, so mapping every tensor of a call is linear."""
        g = self.called_graph
        key = (len(g._inputs), len(g._outputs))
        if not self._index or self._index[0] != key:
            ins: Dict[Tensor, int] = {}
            outs: Dict[Tensor, int] = {}
            for k, t in enumerate(g._inputs):
                ins.setdefault(t, k)
            for k, t in enumerate(g._outputs):
                outs.setdefault(t, k)
            self._index = (key, ins, outs)
        return self._index[1], self._index[2]

    @property
    def called_graph(self) -> Graph:
        return self._op.called_graphs[0]

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        return tuple(self._op.inputs)

    @property
    def outputs(self) -> Tuple[Tensor, ...]:
        sync_call_outputs(self._op)
        return tuple(self._op.outputs)

    def parent_input(self, index: int) -> Tensor:
        return self._op.inputs[index]

    def parent_output(self, index: int) -> Tensor:
        sync_call_outputs(self._op)
        return self._op.outputs[index]

    def graph_to_parent(self, graph_tensor: Tensor) -> Tensor:
        g = self.called_graph
        ins, outs = self._positions()
        if graph_tensor in ins:
            return self._op.inputs[ins[graph_tensor]]
        if graph_tensor in outs:
            return self.parent_output(outs[graph_tensor])
        raise ValueError(f"{graph_tensor.id!r} is neither an input nor an output of {g.id!r}.")

    def parent_to_graph(self, parent_tensor: Tensor) -> Tensor:
        g = self.called_graph
        if parent_tensor in self._op.inputs:
            return g._inputs[self._op.inputs.index(parent_tensor)]
        if parent_tensor in self.outputs:
            return g._outputs[self._op.outputs.index(parent_tensor)]
        raise ValueError(
            f"{parent_tensor.id!r} is not an input or output of this call of {g.id!r}."
        )

    def graph_to_parent_input_index(self, idx: int) -> int:
        return idx

    def parent_to_graph_input_index(self, idx: int) -> int:
        return idx

    def graph_to_parent_output_index(self, idx: int) -> int:
        return idx

    def parent_to_graph_output_index(self, idx: int) -> int:
        return idx

    def set_parent_input_modified(
        self, parent_tensor: Tensor, infer_modified_regions: bool = False
    ) -> None:
        """Declare that the called graph writes ``parent_tensor`` (it is passed by reference)."""
        self._op.by_ref_modified.add(self._op.inputs.index(parent_tensor))


def sync_call_outputs(op: Op) -> None:
    """Give a call op an output for every output its graph gained since (autodiff adds some)."""
    g = op.called_graphs[0]
    if op.type != "Call" or len(op.outputs) >= len(g._outputs):
        return
    for t in g._outputs[len(op.outputs) :]:
        op.outputs.append(Tensor._create(op.graph, op.graph._create_tensor_id(t.name), t.spec, op))


# input preparation ------------------------------------------------------------------
def flatten_one_level(inputs: Sequence[Any]) -> List[Any]:
    """A call's positional inputs with lists and tuples spread one level, as popxl's
    ``call(graph, *inputs)`` takes them (addons' bound graphs take them the same way)."""
    out: List[Any] = []
    for x in inputs:
        out.extend(x) if isinstance(x, (list, tuple)) else out.append(x)
    return out


def _prep_inputs(
    graph: Graph,
    inputs: Sequence[Any],
    inputs_dict: Optional[Mapping],
    check_inputs: bool,
    offset: int = 0,
) -> List[Tensor]:
    """Parent tensors for every input of ``graph``, in graph-input order."""
    positional = flatten_one_level(inputs)
    ins = graph._inputs[offset:]
    if len(positional) > len(ins):
        raise ValueError(
            f"Too many inputs for graph {graph.id!r}: {len(positional)} given, "
            f"it has {len(ins)} inputs ({', '.join(t.name for t in ins)})."
        )
    chosen: Dict[Tensor, Any] = dict(zip(ins, positional))
    known = set(ins)
    for sub, parent in (inputs_dict or {}).items():
        if sub not in known:
            raise ValueError(
                f"inputs_dict key {getattr(sub, 'id', sub)!r} is not an input of {graph.id!r}."
            )
        if sub in chosen:
            raise ValueError(
                f"Input {sub.name!r} of {graph.id!r} is given both positionally and in inputs_dict."
            )
        chosen[sub] = parent
    missing = [t for t in ins if t not in chosen]
    if missing and check_inputs:
        rows = "\n".join(f"  {t.name:<24} {str(t.shape):<16} {t.dtype.name}" for t in missing)
        raise ValueError(
            f"Not enough inputs have been provided for the called graph {graph.id!r}. "
            f"Missing inputs:\n{rows}"
        )
    return [_coerce(sub, chosen[sub]) for sub in ins if sub in chosen]


def _coerce(sub: Tensor, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        if value.shape != sub.shape or value.dtype is not sub.dtype:
            raise ValueError(
                f"Input {sub.name!r} of {sub.graph.id!r} expects {sub.shape} "
                f"{sub.dtype.name}, got {value.id!r} {value.shape} {value.dtype.name}."
            )
        return value
    try:
        return constant(np.broadcast_to(np.asarray(value), sub.shape), sub.dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"Cannot convert {value!r} to a constant for input {sub.name!r}: {e}"
        ) from None


def _check_callable(graph: Graph) -> None:
    if not isinstance(graph, Graph):
        raise TypeError(f"Expected a popxl.Graph to call, got {type(graph).__name__}.")
    if graph is graph.main_graph:
        raise ValueError("The main graph cannot be called.")
    caller = gcg()
    if graph.ir is not caller.ir:
        raise ValueError(
            f"Graph {graph.id!r} belongs to {graph.ir!r}, but it is called from graph "
            f"{caller.name or 'main'!r} of {caller.ir!r}."
        )
    path = _call_path(graph, caller)
    if path is not None:
        raise ValueError(
            f"Graph {caller.name!r} cannot call {graph.id!r}: "
            f"{' -> '.join(repr(g.id) for g in (caller, *path))} would be a recursive call, "
            "and graphs cannot call themselves. Use ops.repeat for a loop."
        )


def _call_path(graph: Graph, target: Graph):
    """The chain of graphs from ``graph`` to ``target`` through call sites, or None."""
    stack: List[Tuple[Graph, Tuple[Graph, ...]]] = [(graph, (graph,))]
    seen = set()
    while stack:
        g, path = stack.pop()
        if g is target:
            return path
        if g in seen:
            continue
        seen.add(g)
        stack.extend((c, (*path, c)) for op in g._ops for c in op.called_graphs)
    return None


def _call_cost(ins, outs, attrs) -> Cost:
    return Cost(0, 0)  # the called graph's ops are costed where the planner walks into it
