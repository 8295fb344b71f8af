"""`recompute_graph`: a gradient graph that recomputes its forward activations itself."""

from __future__ import annotations

import re

import popxl_core
from popxl_core import Tensor, ops
from popxl_core.transforms import (
    ExpectedConnection,
    ExpectedConnectionType,
    new_grad_graph_info,
)

from ..graph import GraphWithNamedArgs

__all__ = ["recompute_graph", "suffix_graph_name"]

_FWD_GRAD = ExpectedConnectionType.FwdGrad
_FWD = ExpectedConnectionType.Fwd


def suffix_graph_name(name: str, suffix: str) -> str:
    """``name`` without its ``_subgraph(N)`` part, plus ``_suffix``."""
    return re.sub(r"_subgraph\(\d+\)", "", name) + f"_{suffix}"


def _input_like(t: Tensor, by_ref: bool = False) -> Tensor:
    return popxl_core.graph_input(
        t.shape, t.dtype, t.name, by_ref=by_ref, meta_shape=t.meta_shape or None
    )


def recompute_graph(grad_graph: GraphWithNamedArgs) -> GraphWithNamedArgs:
    """A graph that calls the forward graph (recomputing activations), then the grad graph.

    Its inputs are the grad graph's gradient inputs, then the forward graph's inputs, then
    the grad graph's other (named) inputs. Its `grad_graph_info` marks the forward inputs as
    `Fwd` connections, so ``inputs_dict(fwd_call_info)`` still gives everything it needs.
    """
    info = grad_graph.grad_graph_info
    fwd, bwd = info.forward_graph, grad_graph.graph
    n_expected = len(info.expected_inputs)
    graph = fwd.ir.create_empty_graph(suffix_graph_name(bwd.name, "recomp"))
    feeds, expected = {}, []
    with graph:
        for c, t in zip(info.expected_inputs, bwd.inputs):
            if c.connection_type is _FWD_GRAD:
                feeds[t] = _input_like(t)
                expected.append(c)
        fwd_inputs = [_input_like(t) for t in fwd.inputs]
        expected += [ExpectedConnection(t, _FWD) for t in fwd.inputs]
        # named inputs such as gradient accumulators must stay by reference
        extra = {t: _input_like(t, t in bwd.by_ref_inputs) for t in bwd.inputs[n_expected:]}
        site = ops.call_with_info(fwd, *fwd_inputs)
        for c, t in zip(info.expected_inputs, bwd.inputs):
            if c.connection_type is _FWD:
                feeds[t] = site.graph_to_parent(c.fwd_tensor)
        for out in ops.call(bwd, inputs_dict={**feeds, **extra}):
            popxl_core.graph_output(out)
    new_info = new_grad_graph_info(graph, fwd, expected, info.expected_outputs)
    args = grad_graph.args.remap(extra)
    return GraphWithNamedArgs(
        graph, args, new_info, called_graphs_grad_info=grad_graph.called_graphs_grad_info
    )
