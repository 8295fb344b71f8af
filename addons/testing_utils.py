"""popxl_addons.testing_utils: run one Module on host data in a fresh Ir (for tests).

Unlike popxl.addons' version this needs no popart binding: op types are strings here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import popxl_core
from popxl_core import Graph, Tensor

from .module import Module
from .named_tensors import NamedTensors
from .ops.host import host_store

__all__ = ["TensorInput", "run_module", "ops_of_type"]


@dataclass
class TensorInput:
    """Host data that `run_module` turns into a variable of ``dtype`` (default: its own)."""

    data: Any
    dtype: popxl_core.dtype | None = None


Weights = Mapping[Tensor, Any] | Callable[[NamedTensors], Mapping[Tensor, Any]] | None


def _as_tensor(arg: Any, i: int) -> Any:
    if not isinstance(arg, TensorInput):
        return arg
    return popxl_core.variable(np.asarray(arg.data), arg.dtype, name=f"input_{i}")


def run_module(module: Module, *args: Any, weights: Weights = None, **kwargs: Any) -> list:
    """Build ``module`` on ``args`` in a new Ir, run it once, return its outputs as numpy.

    ``TensorInput`` arguments become variables; the module's variables are initialised by
    their factories, then overwritten by ``weights``: a ``{variable: data}`` mapping, or a
    function of the module's variables (a `NamedTensors`) returning one, such as a layer's
    ``torch_mapping`` with its torch layer bound.
    """
    ir = popxl_core.Ir()
    with ir.main_graph:
        inputs = [_as_tensor(a, i) for i, a in enumerate(args)]
        facts, graph = module.create_graph(*inputs, **kwargs)
        variables = facts.init()
        tensor_args = [t for t in inputs if isinstance(t, Tensor)]
        outputs = graph.bind(variables).call(*tensor_args)
        streams = [host_store(t) for t in outputs]
    data = weights(variables) if callable(weights) else weights
    with popxl_core.Session(ir, "ipu_hw") as session:
        if data:
            session.write_variables_data(dict(data))
        results = session.run()
    return [results[s] for s in streams]


def ops_of_type(graph: Graph, op_type: str | type) -> int:
    """How many ops of ``graph`` have type ``op_type`` (a type name such as ``"MatMul"``)."""
    name = op_type if isinstance(op_type, str) else op_type.__name__.removesuffix("Op")
    return sum(1 for op in graph.ops if op.type == name)
