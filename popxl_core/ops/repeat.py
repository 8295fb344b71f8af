"""Repeat (the Loop op): call a graph n times, its N outputs fed back to its first N inputs;
the gradient walks the stashed iterations in reverse.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

import numpy as np

from ..context import gcg
from ..graph import Graph, Op
from ..tensor import Tensor
from .call_site import CallSiteInfo, _call_cost, _check_callable, _prep_inputs
from .registry import OpDef, Sample, create_op, register

__all__ = ["repeat", "repeat_with_info"]


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
    from .call import call  # call.py re-exports this module: the Call op is looked up here

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
    from .call import call_with_info

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
    assert op is not None  # an op's output has its producer
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
