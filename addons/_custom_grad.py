"""Gradient graphs written by hand: `Module.build_grad` and `create_grad_graph_info`."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import popxl_core
from popxl_core import Graph, Tensor
from popxl_core.transforms import (
    ExpectedConnection,
    ExpectedConnectionType,
    GradGraphInfo,
    new_grad_graph_info,
)

from ._grad_state import expose_as_output, fwd_connection
from .graph import GraphWithNamedArgs

if TYPE_CHECKING:  # pragma: no cover
    from .module import Module

__all__ = ["build_custom_grad_graph", "grad_info_from_maps"]

_FWD = ExpectedConnectionType.Fwd
_FWD_GRAD = ExpectedConnectionType.FwdGrad


def _make_info(
    grad_graph: Graph,
    fwd_graph: Graph,
    expected_inputs: list[ExpectedConnection],
    expected_outputs: list[ExpectedConnection],
) -> GradGraphInfo:
    # popxl has no public constructor (addons itself goes through `_from_pb`)
    return new_grad_graph_info(grad_graph, fwd_graph, expected_inputs, expected_outputs)


def grad_info_from_maps(
    fwd_graph: Graph,
    grad_graph: Graph,
    grad_input_to_fwd_output: dict[Tensor, Tensor],
    grad_output_to_fwd_input: dict[Tensor, Tensor],
    fwd_tensors: dict[Tensor, Tensor],
) -> GradGraphInfo:
    """A GradGraphInfo whose connections follow the grad graph's input and output order."""
    inputs = []
    for t in grad_graph.inputs:
        if t in grad_input_to_fwd_output:
            inputs.append(ExpectedConnection(grad_input_to_fwd_output[t], _FWD_GRAD))
        elif t in fwd_tensors:
            inputs.append(ExpectedConnection(fwd_tensors[t], _FWD))
        else:
            raise ValueError(
                f"Grad graph input {t.id!r} is neither a gradient of a forward "
                "output nor a forward tensor."
            )
    missing = [t.id for t in grad_graph.outputs if t not in grad_output_to_fwd_input]
    if missing:
        raise ValueError(f"Grad graph outputs {missing} have no forward input.")
    outputs = [
        ExpectedConnection(grad_output_to_fwd_input[t], _FWD_GRAD) for t in grad_graph.outputs
    ]
    return _make_info(grad_graph, fwd_graph, inputs, outputs)


def _check_signature(module: Module) -> int:
    """The number of gradients ``build_grad`` takes (positional parameters only)."""
    params = inspect.signature(module.build_grad).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        raise TypeError(
            f"{type(module).__name__}.build_grad: the `build_grad` method signature "
            "must only have a fixed number of positional parameters as inputs."
        )
    return len(params)


def _provided(g: Graph, module: Module, grads_provided: Iterable[Tensor] | None) -> list[Tensor]:
    provided = list(g.outputs if grads_provided is None else grads_provided)
    for t in provided:
        if t not in g.outputs:
            raise ValueError(
                f"A Tensor specified in `grads_provided` is not a output of "
                f"`fwd_graph` {g.id!r}: {t!r}."
            )
    n = _check_signature(module)
    if len(provided) != n:
        raise ValueError(
            f"The {len(provided)} tensors in `grads_provided` do not match the "
            f"signature of {type(module).__name__}.build_grad ({n} gradients)."
        )
    return provided


def _required(g: Graph, grads_required: Iterable[Tensor] | None) -> list[Tensor]:
    required = list(g.inputs if grads_required is None else grads_required)
    for t in required:
        if t not in g.inputs:
            raise ValueError(
                f"A Tensor specified in `grads_required` is not a input of "
                f"`fwd_graph` {g.id!r}: {t!r}."
            )
    return required


def _aux_fetcher(fwd: GraphWithNamedArgs, expected: list[ExpectedConnection]):
    """Reading a forward tensor from ``aux`` in build_grad: a grad-graph input fed by it."""
    g = fwd.graph

    def fetch(t: Tensor) -> Tensor:
        if t.graph is not g:
            raise ValueError(f"aux tensor {t.id!r} is not a tensor of the forward graph {g.id!r}.")
        expected.append(fwd_connection(t))  # exposed as a forward output once all is valid
        return popxl_core.graph_input(t.shape, t.dtype, t.name, meta_shape=t.meta_shape or None)

    return fetch


def _returned(returned: Any) -> tuple:
    if returned is None:
        return ()
    return (returned,) if isinstance(returned, Tensor) else tuple(returned)


def _grads_for(
    module: Module, fwd: GraphWithNamedArgs, required: list[Tensor], returned: tuple
) -> dict[Tensor, Tensor]:
    """Map what build_grad produced onto ``required``: the returned tensors onto the required
    non-variable inputs in order, ``var_grad`` onto the required named inputs."""
    name_of = {t: k for k, t in fwd.args.to_dict().items()}
    positional = [t for t in required if t not in name_of]
    if len(returned) > len(positional):
        raise ValueError(
            f"Too many outputs in the grad graph: {type(module).__name__}."
            f"build_grad returned {len(returned)} tensors for {len(positional)} "
            "required non-variable inputs."
        )
    if len(returned) < len(positional):
        raise ValueError(
            f"Not all forward graph inputs have been specified: "
            f"{type(module).__name__}.build_grad returned {len(returned)} tensors "
            f"for {len(positional)} required inputs."
        )
    for i, (t, d) in enumerate(zip(positional, returned)):
        if not isinstance(d, Tensor) or d.shape != t.shape or d.meta_shape != t.meta_shape:
            raise ValueError(
                f"Shape or meta-shape of output Tensor at position {i} does not "
                f"match the forward input {t.name!r} {t.shape}: got {d!r}."
            )
    var_grads = module.var_grad.grads()
    missing = [name_of[t] for t in required if t in name_of and name_of[t] not in var_grads]
    if missing:
        raise ValueError(
            f"Not all variable gradients have been specified: set "
            f"self.var_grad[key] in build_grad for {missing}."
        )
    grads = dict(zip(positional, returned))
    grads.update({t: var_grads[name_of[t]] for t in required if t in name_of})
    return grads


def build_custom_grad_graph(
    module: Module,
    fwd: GraphWithNamedArgs,
    grads_provided: Iterable[Tensor] | None,
    grads_required: Iterable[Tensor] | None,
) -> GraphWithNamedArgs:
    """Trace ``module.build_grad`` into a new grad graph for ``fwd``."""
    g = fwd.graph
    provided = _provided(g, module, grads_provided)
    required = _required(g, grads_required)
    grad_graph = g.ir.create_empty_graph(f"{type(module).__name__}_grad")
    with grad_graph:
        grads_in = [
            popxl_core.graph_input(
                t.shape, t.dtype, f"Gradient___{t.name}", meta_shape=t.meta_shape or None
            )
            for t in provided
        ]
        expected = [ExpectedConnection(t, _FWD_GRAD) for t in provided]
        module.aux.open_for_grad(fwd.aux, _aux_fetcher(fwd, expected))
        module.var_grad.open_for_grad(fwd.args.to_dict())
        grads = _grads_for(module, fwd, required, _returned(module.build_grad(*grads_in)))
        for t in required:
            if grads[t].graph is not grad_graph:
                raise ValueError(
                    f"The gradient of {t.name!r} must be a tensor of the grad "
                    f"graph, got {grads[t]!r}."
                )
            popxl_core.graph_output(grads[t])
    # Only now change the forward graph, so a failed build_grad leaves it as it was.
    for c in expected[len(provided) :]:
        expose_as_output(g, c.fwd_tensor)
    outputs = [ExpectedConnection(t, _FWD_GRAD) for t in required]
    return GraphWithNamedArgs.from_grad_graph(_make_info(grad_graph, g, expected, outputs))
