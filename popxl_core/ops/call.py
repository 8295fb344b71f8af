"""Control flow: the Call op (`call`, `call_with_info`). `CallSiteInfo` (call_site.py) and
`repeat` (repeat.py) are re-exported here; `conditional` lives in conditional.py."""

from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

import numpy as np

from ..context import gcg
from ..graph import Graph, Op
from ..tensor import Tensor
from .call_site import (
    CallSiteInfo,
    _call_cost,
    _check_callable,
    _prep_inputs,
    sync_call_outputs,
)
from .registry import OpDef, Sample, create_op, register
from .repeat import REPEAT, repeat, repeat_with_info  # noqa: F401 (sim/ reads REPEAT from here)

__all__ = [
    "call",
    "call_with_info",
    "CallSiteInfo",
    "repeat",
    "repeat_with_info",
]


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
    # a called graph may span IPUs (addons' within-replica sharded loss takes a shard from
    # each), so its inputs may too: PopXL's call checks only that they are in the graph
    outs = create_op(
        CALL,
        parents,
        {"graph": graph},
        called_graphs=(graph,),
        out_names=names or None,
        check_placement=False,
    )
    op = outs[0].producer if outs else gcg()._ops[-1]
    assert op is not None  # an op's output has its producer
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
