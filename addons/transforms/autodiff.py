"""Gradient transforms on GraphWithNamedArgs: `autodiff` and `autodiff_with_accumulation`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial

import numpy as np

import popxl_core
from popxl_core import Graph, Tensor, float32, ops
from popxl_core.graph_edit import remove_outputs
from popxl_core.transforms import ExpectedConnection, GradGraphInfo, new_grad_graph_info

from ..dot_tree import DotTree
from ..graph import GraphWithNamedArgs, gradient_graph
from ..named_tensors import NamedTensors
from ..variable_factory import NamedVariableFactories, add_variable_input

__all__ = ["autodiff", "autodiff_with_accumulation"]

AnyGraph = GraphWithNamedArgs | Graph


def _split_graph(graph: AnyGraph) -> tuple[Graph, dict[Graph, GradGraphInfo]]:
    if isinstance(graph, GraphWithNamedArgs):
        return graph.graph, dict(graph.called_graphs_grad_info)
    if isinstance(graph, Graph):
        return graph, {}
    raise TypeError(
        f"autodiff expects a GraphWithNamedArgs or popxl Graph, got {type(graph).__name__}."
    )


def autodiff(
    graph: AnyGraph,
    grads_provided: Iterable[Tensor] | None = None,
    grads_required: Iterable[Tensor] | None = None,
    called_graphs_grad_info: Mapping[Graph, GradGraphInfo] | None = None,
) -> GraphWithNamedArgs:
    """popxl autodiff of ``graph``, returned as a GraphWithNamedArgs with `grad_graph_info`.

    Like popxl's autodiff it adds forward outputs, so build the forward call sites after it.
    Grad infos of called graphs (from ``graph`` and ``called_graphs_grad_info``) are reused.
    The result has no named args: pass activations with
    ``call(..., args=grad.grad_graph_info.inputs_dict(fwd_call_info))``.
    """
    fwd, known = _split_graph(graph)
    known.update(called_graphs_grad_info or {})
    result = gradient_graph(fwd, grads_provided, grads_required, known)
    if isinstance(graph, GraphWithNamedArgs):
        graph.autodiff_applied = True
    return result


def _arg_names(graph: AnyGraph) -> dict[Tensor, str]:
    if isinstance(graph, GraphWithNamedArgs):
        return {t: k for k, t in graph.args.to_dict().items()}
    return {}


def _accum_name(t: Tensor, names: dict[Tensor, str]) -> str:
    return names.get(t) or DotTree.sanitise(t.name)


def _lookup_grouping(replica_groupings, key: str):
    if replica_groupings is None:
        return None
    try:
        return replica_groupings.get(key) if key in replica_groupings else None
    except (TypeError, ValueError):
        return None


def autodiff_with_accumulation(
    graph: GraphWithNamedArgs,
    tensors_to_accumulate_grads: Iterable[Tensor],
    grads_provided: Iterable[Tensor] | None = None,
    grads_required: Iterable[Tensor] | None = None,
    called_graphs_grad_info: Mapping[Graph, GradGraphInfo] | None = None,
    replica_groupings=None,
) -> tuple[NamedVariableFactories, GraphWithNamedArgs]:
    """Autodiff that accumulates some gradients into by-ref inputs instead of outputting them.

    Each gradient of ``tensors_to_accumulate_grads`` is mean-accumulated in place into a new
    named input ``accum.<arg name>`` (``accumulate_mean_(accum, grad, counter)``); a by-ref
    float32 input ``mean_accum_counter`` is then incremented by one. The remaining outputs
    are the gradients of ``grads_required`` that are not accumulated, in that order.
    Reset the counter with ``ops.var_updates.accumulator_scale_(counter, 0.0)``.

    Returns:
        zero-initialised factories for the new named inputs, and the gradient graph.
    """
    _split_graph(graph)  # type check before any work
    accumulate = list(tensors_to_accumulate_grads)
    remaining = [t for t in (grads_required or []) if t not in accumulate]
    grad = autodiff(graph, grads_provided, remaining + accumulate, called_graphs_grad_info)
    info = grad.grad_graph_info
    grad_outputs = list(grad.graph.outputs)
    accumulated = grad_outputs[len(remaining) :]
    inputs, factories = _add_accumulators(
        grad.graph, accumulate, accumulated, _arg_names(graph), replica_groupings
    )
    # the grad graph was made just above, so no call site sees its outputs change
    remove_outputs(grad.graph, accumulated)
    new_info = _with_outputs(info, info.expected_outputs[: len(remaining)])
    result = GraphWithNamedArgs(
        grad.graph,
        NamedTensors.from_dict(inputs),
        new_info,
        called_graphs_grad_info=grad.called_graphs_grad_info,
    )
    facts = NamedVariableFactories.from_dict({k: factories[k] for k in inputs})  # same order
    return facts, result


def _add_accumulators(
    grad_graph: Graph, accumulate: list, grads: list, names: dict, replica_groupings
) -> tuple[dict[str, Tensor], dict[str, object]]:
    """In ``grad_graph``: each gradient mean-accumulated into a new by-ref input
    ``accum.<name>``, then the counter incremented; the inputs and their factories."""
    factories: dict[str, object] = {}
    inputs: dict[str, Tensor] = {}
    with grad_graph, popxl_core.in_sequence(True):
        counter, factories["mean_accum_counter"] = _zero_input(
            "mean_accum_counter", (), float32, None
        )
        with popxl_core.in_sequence(False):
            for t, g in zip(accumulate, grads):
                name = _accum_name(t, names)
                key = f"accum.{name}"
                # grouped as the variable: ``replica_groupings`` is keyed by the arg's name
                grouping = _lookup_grouping(replica_groupings, name)
                accum, factories[key] = _zero_input(key, t.shape, t.dtype, grouping)
                ops.var_updates.accumulate_mean_(accum, g, counter)
                inputs[key] = accum
        ops.var_updates.accumulate_(counter, popxl_core.constant(1.0, float32))
    inputs["mean_accum_counter"] = counter
    return inputs, factories


def _zero_input(key: str, shape, dtype, grouping) -> tuple:
    """A zero-initialised by-ref input of the current graph, and its factory."""
    return add_variable_input(
        key, partial(np.zeros, shape), dtype, by_ref=True, replica_grouping=grouping
    )


def _with_outputs(info: GradGraphInfo, outputs: tuple[ExpectedConnection, ...]) -> GradGraphInfo:
    return new_grad_graph_info(info.graph, info.forward_graph, info.expected_inputs, outputs)
