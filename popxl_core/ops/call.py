"""Control flow: `call`, `repeat`, `conditional` and their call-site information."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..context import gcg
from ..graph import Graph, Op
from ..tensor import Tensor, constant
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = [
    "call",
    "call_with_info",
    "CallSiteInfo",
    "repeat",
    "repeat_with_info",
]


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
def _flatten_one_level(inputs: Sequence[Any]) -> List[Any]:
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
    positional = _flatten_one_level(inputs)
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
    stack, seen = [(graph, (graph,))], set()
    while stack:
        g, path = stack.pop()
        if g is target:
            return path
        if g in seen:
            continue
        seen.add(g)
        stack.extend((c, (*path, c)) for op in g._ops for c in op.called_graphs)
    return None


# Call -------------------------------------------------------------------------------
def _call_infer(ins, graph):
    return [t.spec for t in graph._outputs]


def call_args(op: Op, em) -> List[str]:
    """The argument expressions of a Call site: copies of the inputs the graph writes."""
    g = op.called_graphs[0]
    modified = em.program.modified_inputs[g]
    # by reference: TensorByRef graph inputs, and set_parent_input_modified at this call site
    by_ref = {i for i, t in enumerate(g._inputs) if t in g._by_ref_inputs} | op.by_ref_modified
    return [
        f"{em.name(t)}.clone()" if i in modified and i not in by_ref else em.name(t)
        for i, t in enumerate(op.inputs)
    ]


def _emit_call(op: Op, em) -> None:
    g = op.called_graphs[0]
    fn = em.graph_fn(g)
    args = call_args(op, em)
    outs = [em.name(t) for t in op.outputs]
    call = f"{fn}({', '.join(args)})"
    em.emit(
        f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}[:{len(outs)}]" if outs else call
    )


def _call_cost(ins, outs, attrs) -> Cost:
    return Cost(0, 0)  # the called graph's ops are costed where the planner walks into it


def _call_grad(ctx) -> List[Optional[Tensor]]:
    from ..transforms.autodiff import ExpectedConnectionType, autodiff, zeros_like_spec

    op, diff = ctx.op, ctx.differentiator
    g = op.called_graphs[0]
    info = diff.known.get(g) or autodiff(g, called_graphs_grad_info=diff.known)
    diff.known[g] = info
    sync_call_outputs(op)
    args = []
    for c in info.expected_inputs:
        if c.connection_type is ExpectedConnectionType.FwdGrad:
            idx = g._outputs.index(c.fwd_tensor)
            args.append(
                ctx.grad_output(idx)
                if idx < len(op.outputs) and ctx.grad_output(idx) is not None
                else zeros_like_spec(c.fwd_tensor)
            )
        else:
            args.append(
                ctx.input(g._inputs.index(c.fwd_tensor))
                if c.fwd_tensor in g._inputs
                else ctx.output(g._outputs.index(c.fwd_tensor))
            )
    outs = call(info.graph, *args)
    grads: List[Optional[Tensor]] = [None] * len(op.inputs)
    for c, gt in zip(info.expected_outputs, outs):
        grads[g._inputs.index(c.fwd_tensor)] = gt
    return grads


def _call_samples():
    def build(x, w):
        sub = gcg().ir.create_graph(lambda a, b: a * b + a, x, w)
        return call(sub, x, w)[0]

    rng = np.random.default_rng(0)
    data = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    return [Sample(data, build, lambda x, w: x * w + x)]


CALL = register(
    OpDef(
        "Call",
        _call_infer,
        emit=_emit_call,
        grad=_call_grad,
        cost=_call_cost,
        samples=_call_samples,
    )
)


def _make_call(graph: Graph, inputs, inputs_dict, check_inputs: bool) -> Op:
    _check_callable(graph)
    parents = _prep_inputs(graph, inputs, inputs_dict, check_inputs)
    names = [t.name for t in graph._outputs]
    outs = create_op(
        CALL, parents, {"graph": graph}, called_graphs=(graph,), out_names=names or None
    )
    op = outs[0].producer if outs else gcg()._ops[-1]
    op.by_ref_modified |= {i for i, t in enumerate(graph._inputs) if t in graph._by_ref_inputs}
    return op


def call(graph: Graph, *inputs, inputs_dict: Optional[Mapping] = None) -> Tuple[Tensor, ...]:
    """Call ``graph`` with ``inputs`` (positional, flattened one level) and ``inputs_dict``."""
    return tuple(_make_call(graph, inputs, inputs_dict, True).outputs)


def call_with_info(
    graph: Graph, *inputs, inputs_dict: Optional[Mapping] = None, check_inputs: bool = True
) -> CallSiteInfo:
    """Like `call`, returning the `CallSiteInfo` of the new call site."""
    return CallSiteInfo(_make_call(graph, inputs, inputs_dict, check_inputs))


# Repeat -----------------------------------------------------------------------------
def _repeat_infer(ins, graph, repeat_count, carried):
    return [t.spec for t in graph._outputs[:carried]]


def _emit_repeat(op: Op, em) -> None:
    g = op.called_graphs[0]
    fn, n, k = em.graph_fn(g), op.attrs["repeat_count"], op.attrs["carried"]
    modified = em.program.modified_inputs[g]
    names = [em.name(t) for t in op.inputs]
    loop = [f"c{op.id}_{i}" for i in range(k)]
    rest = [f"{nm}.clone()" if k + i in modified else nm for i, nm in enumerate(names[k:])]
    if loop:
        em.emit(f"{', '.join(loop)}, = {', '.join(names[:k])},")
    em.emit(f"for _ in range({n}):")
    call_args = ", ".join(
        [*(f"{x}.clone()" if i in modified else x for i, x in enumerate(loop)), *rest]
    )
    em.emit(f"    {', '.join(loop)}, *_r = {fn}({call_args})" if loop else f"    {fn}({call_args})")
    if op.outputs:
        em.emit(f"{', '.join(em.name(t) for t in op.outputs)}, = {', '.join(loop)},")


def _repeat_grad(ctx) -> List[Optional[Tensor]]:
    """Run the loop's iterations forward once in the grad graph, stashing each one's call site
    (its carried inputs and the activations its grad needs), then walk them in reverse.

    The body runs n times here and the body's grad n times: O(n), at the cost of keeping n
    iterations' activations alive (popxl's own loop grad stashes them the same way).
    """
    from ..transforms.autodiff import autodiff, zeros_like_spec

    op, diff = ctx.op, ctx.differentiator
    g, n, k = op.called_graphs[0], op.attrs["repeat_count"], op.attrs["carried"]
    info = diff.known.get(g) or autodiff(
        g,
        grads_provided=g._outputs[:k],
        grads_required=g._inputs,
        called_graphs_grad_info=diff.known,
    )
    diff.known[g] = info
    init = [ctx.input(i) for i in range(len(op.inputs))]
    sites = _forward_sites(g, n, k, init)
    carried_grads = [ctx.grad_output_or_zero(i) for i in range(k)]
    other_grads: List[Optional[Tensor]] = [None] * (len(op.inputs) - k)
    for site in reversed(sites):
        step = call(info.graph, *carried_grads, inputs_dict=info.inputs_dict(site))
        carried_grads = list(step[:k])
        for j, gj in enumerate(step[k:]):
            other_grads[j] = gj if other_grads[j] is None else other_grads[j] + gj
    grads = carried_grads + other_grads
    return [gr if gr is not None else zeros_like_spec(t) for gr, t in zip(grads, op.inputs)]


def _forward_sites(g: Graph, n: int, k: int, init: List[Tensor]) -> List[CallSiteInfo]:
    """One call site per iteration; iteration i+1 reads iteration i's carried outputs."""
    sites: List[CallSiteInfo] = []
    state = init[:k]
    for _ in range(n):
        site = call_with_info(g, *state, *init[k:])
        state = [site.parent_output(i) for i in range(k)]
        sites.append(site)
    return sites


def _repeat_samples():
    def build(x, w):
        body = gcg().ir.create_graph(lambda a, b: a * b + 0.5 * a, x, w)
        return repeat(body, 3, x, w)[0]

    def ref(x, w):
        for _ in range(3):
            x = x * w + 0.5 * x
        return x

    rng = np.random.default_rng(1)
    data = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    return [Sample(data, build, ref)]


REPEAT = register(
    OpDef(
        "Loop",
        _repeat_infer,
        emit=_emit_repeat,
        grad=_repeat_grad,
        cost=_call_cost,
        samples=_repeat_samples,
    )
)


def _make_repeat(graph: Graph, repeat_count: int, inputs, inputs_dict, check_inputs) -> Op:
    _check_callable(graph)
    if not isinstance(repeat_count, int) or repeat_count < 0:
        raise ValueError(f"repeat_count must be a non-negative int, got {repeat_count!r}.")
    parents = _prep_inputs(graph, inputs, inputs_dict, check_inputs)
    carried = len(graph._outputs)
    if carried > len(graph._inputs):
        raise ValueError(
            f"repeat: graph {graph.id!r} has {carried} outputs but only "
            f"{len(graph._inputs)} inputs; outputs are fed back to the first inputs."
        )
    for o, i in zip(graph._outputs, graph._inputs):
        if o.shape != i.shape or o.dtype is not i.dtype:
            raise ValueError(
                f"repeat: output {o.name!r} {o.shape} {o.dtype.name} of {graph.id!r} "
                f"cannot feed input {i.name!r} {i.shape} {i.dtype.name}."
            )
    names = [t.name for t in graph._outputs]
    attrs = {"graph": graph, "repeat_count": repeat_count, "carried": carried}
    # a loop body may span IPUs (each op has its own; a pipeline's main phase, a repeated
    # multi-IPU main graph), so its inputs may too, as in PopART
    outs = create_op(
        REPEAT,
        parents,
        attrs,
        called_graphs=(graph,),
        out_names=names or None,
        check_placement=False,
    )
    op = outs[0].producer if outs else gcg()._ops[-1]
    op.by_ref_modified |= {i for i, t in enumerate(graph._inputs) if t in graph._by_ref_inputs}
    return op


def repeat(
    graph: Graph, repeat_count: int, *inputs, inputs_dict: Optional[Mapping] = None
) -> Tuple[Tensor, ...]:
    """Call ``graph`` ``repeat_count`` times; its N outputs feed its first N inputs."""
    return tuple(_make_repeat(graph, repeat_count, inputs, inputs_dict, True).outputs)


def repeat_with_info(
    graph: Graph, repeat_count: int, *inputs, inputs_dict=None, check_inputs: bool = True
) -> CallSiteInfo:
    return CallSiteInfo(_make_repeat(graph, repeat_count, inputs, inputs_dict, check_inputs))
