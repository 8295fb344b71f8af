"""Gradient graphs written by hand: `Module.build_grad` and `create_grad_graph_info`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import popxl_core
from popxl_core import Graph, Tensor, ops
from popxl_core.transforms import ExpectedConnection, ExpectedConnectionType, GradGraphInfo

from .graph import GraphWithNamedArgs

if TYPE_CHECKING:  # pragma: no cover
    from .module import Module

__all__ = ["build_custom_grad_graph", "grad_info_from_maps"]

_FWD = ExpectedConnectionType.Fwd
_FWD_GRAD = ExpectedConnectionType.FwdGrad


def _make_info(grad_graph: Graph, fwd_graph: Graph, expected_inputs: list[ExpectedConnection],
               expected_outputs: list[ExpectedConnection]) -> GradGraphInfo:
    # popxl has no public constructor (addons itself goes through `_from_pb`); the core's
    # `_create` is the one private hook addons needs for hand-built grad graphs.
    return GradGraphInfo._create(grad_graph, fwd_graph, expected_inputs, expected_outputs)


def grad_info_from_maps(fwd_graph: Graph, grad_graph: Graph,
                        grad_input_to_fwd_output: dict[Tensor, Tensor],
                        grad_output_to_fwd_input: dict[Tensor, Tensor],
                        fwd_tensors: dict[Tensor, Tensor]) -> GradGraphInfo:
    """A GradGraphInfo whose connections follow the grad graph's input and output order."""
    inputs = []
    for t in grad_graph.inputs:
        if t in grad_input_to_fwd_output:
            inputs.append(ExpectedConnection(grad_input_to_fwd_output[t], _FWD_GRAD))
        elif t in fwd_tensors:
            inputs.append(ExpectedConnection(fwd_tensors[t], _FWD))
        else:
            raise ValueError(f"Grad graph input {t.id!r} is neither a gradient of a forward "
                             "output nor a forward tensor.")
    missing = [t.id for t in grad_graph.outputs if t not in grad_output_to_fwd_input]
    if missing:
        raise ValueError(f"Grad graph outputs {missing} have no forward input.")
    outputs = [ExpectedConnection(grad_output_to_fwd_input[t], _FWD_GRAD)
               for t in grad_graph.outputs]
    return _make_info(grad_graph, fwd_graph, inputs, outputs)


def _aux_inputs(fwd: GraphWithNamedArgs, expected: list[ExpectedConnection]) -> dict[str, Tensor]:
    """A grad-graph input per tensor stashed in ``aux``; internal ones become fwd outputs."""
    g = fwd.graph
    aux = {}
    for key, t in fwd.aux.items():
        if not isinstance(t, Tensor) or t.graph is not g:
            raise ValueError(f"aux[{key!r}] must be a tensor of the forward graph {g.id!r}.")
        if t not in g.inputs and t not in g.outputs:
            with g:
                popxl_core.graph_output(t)
        aux[key] = popxl_core.graph_input(t.shape, t.dtype, t.name,
                                          meta_shape=t.meta_shape or None)
        expected.append(ExpectedConnection(t, _FWD))
    return aux


def _grads_by_input(module: Module, fwd: GraphWithNamedArgs, returned) -> dict[Tensor, Tensor]:
    if returned is None:
        returned = ()
    elif isinstance(returned, Tensor):
        returned = (returned,)
    named = fwd.args.to_dict()
    named_set = set(named.values())
    positional = [t for t in fwd.graph.inputs if t not in named_set]
    returned = tuple(returned)
    if len(returned) > len(positional):
        raise ValueError(f"{type(module).__name__}.build_grad returned {len(returned)} "
                         f"gradients for {len(positional)} unnamed inputs.")
    grads = {t: g for t, g in zip(positional, returned) if g is not None}
    for key, g in module.var_grad.items():
        if key not in named:
            raise KeyError(f"var_grad[{key!r}]: no named input {key!r} (named inputs: "
                           f"{list(named)}).")
        grads[named[key]] = g
    return grads


def build_custom_grad_graph(module: Module, fwd: GraphWithNamedArgs,
                            grads_provided: Iterable[Tensor] | None,
                            grads_required: Iterable[Tensor] | None) -> GraphWithNamedArgs:
    """Trace ``module.build_grad`` into a new grad graph for ``fwd``."""
    g = fwd.graph
    provided = list(g.outputs if grads_provided is None else grads_provided)
    grad_graph = g.ir.create_empty_graph(f"{type(module).__name__}_grad")
    with grad_graph:
        grads_in = [popxl_core.graph_input(t.shape, t.dtype, f"Gradient___{t.name}",
                                           meta_shape=t.meta_shape or None) for t in provided]
        expected = [ExpectedConnection(t, _FWD_GRAD) for t in provided]
        module.aux = _aux_inputs(fwd, expected)
        module.var_grad = {}
        grads = _grads_by_input(module, fwd, module.build_grad(*grads_in))
        required = (list(grads_required) if grads_required is not None
                    else [t for t in g.inputs if t in grads])
        for t in required:
            out = grads.get(t)
            if out is None:
                out = ops.init(t.shape, t.dtype, f"zero_grad_{t.name}", "zero")
            if out.graph is not grad_graph or out.shape != t.shape:
                raise ValueError(f"Gradient for {t.name!r} must be a {t.shape} tensor of the "
                                 f"grad graph, got {out!r}.")
            popxl_core.graph_output(out)
    outputs = [ExpectedConnection(t, _FWD_GRAD) for t in required]
    return GraphWithNamedArgs.from_grad_graph(_make_info(grad_graph, g, expected, outputs))
