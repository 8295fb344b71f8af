"""Run one addons Module on the simulator with host inputs: the quickest check of a layer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

import popxl_core
from popxl_core import Graph, ops

from .module import Module
from .named_tensors import NamedTensors

__all__ = ["TensorInput", "run_module", "ops_of_type"]


@dataclass
class TensorInput:
    """Host data for a module input; it becomes a main-graph variable of ``dtype``."""

    data: Any
    dtype: Optional[popxl_core.dtype] = None


WeightsFn = Callable[[NamedTensors], Mapping[popxl_core.Variable, np.ndarray]]


def run_module(
    module: Module, *args: Any, weights: Optional[WeightsFn] = None, **kwargs: Any
) -> list[np.ndarray]:
    """Build ``module`` on ``args`` (TensorInputs become variables), initialise its variables,
    overwrite them with ``weights(variables)`` if given, call it, and return its outputs.

    A by-ref input (``popxl.TensorByRef``) modifies its variable, as on the IPU.
    """
    ir = popxl_core.Ir()
    with ir.main_graph:
        ins = [_to_tensor(a, f"input_{i}") for i, a in enumerate(args)]
        kw = {k: _to_tensor(v, k) for k, v in kwargs.items()}
        facts, graph = module.create_graph(*ins, **kw)
        variables = facts.init()
        outs = graph.bind(variables).call(*ins, *kw.values())
        streams = []
        for t in outs:
            streams.append(popxl_core.d2h_stream(t.shape, t.dtype, f"{t.name}_out"))
            ops.host_store(streams[-1], t)
    session = popxl_core.Session(ir, "ipu_hw")
    if weights is not None:
        session.write_variables_data(dict(weights(variables)))
    with session:
        results = session.run()
    return [results[s] for s in streams]


def _to_tensor(value: Any, name: str) -> Any:
    if isinstance(value, TensorInput):
        return popxl_core.variable(value.data, value.dtype, name)
    return value


def ops_of_type(graph: Graph, op_type: str) -> int:
    """How many ops of PopXL type ``op_type`` (e.g. ``"MatMul"``) ``graph`` has."""
    return sum(1 for op in graph.ops if op.opType() == op_type)
