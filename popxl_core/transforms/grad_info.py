"""`GradGraphInfo` and `ExpectedConnection`: how a grad graph connects to its forward graph."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Dict, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from ..graph import Graph
    from ..ops.call import CallSiteInfo
    from ..tensor import Tensor

__all__ = ["ExpectedConnectionType", "ExpectedConnection", "GradGraphInfo", "new_grad_graph_info"]


class ExpectedConnectionType(enum.Enum):
    Fwd = "Fwd"
    FwdGrad = "FwdGrad"

    def __repr__(self) -> str:
        return f"ExpectedConnectionType.{self.name}"

    __str__ = __repr__


class ExpectedConnection:
    """A grad-graph input or output: a forward tensor (`Fwd`) or the gradient of one (`FwdGrad`)."""

    def __init__(self, fwd_tensor: "Tensor", connection_type: ExpectedConnectionType) -> None:
        self._fwd_tensor = fwd_tensor
        self._type = connection_type

    @property
    def fwd_tensor(self) -> "Tensor":
        return self._fwd_tensor

    @property
    def connection_type(self) -> ExpectedConnectionType:
        return self._type

    def __repr__(self) -> str:
        return f"({self._type}, {self._fwd_tensor})"


class GradGraphInfo:
    """The result of `autodiff`: the grad graph and what its inputs and outputs mean."""

    # set by `_create` (object.__new__, no __init__): declared here for the type checker
    _graph: "Graph"
    _forward_graph: "Graph"
    _expected_inputs: Tuple[ExpectedConnection, ...]
    _expected_outputs: Tuple[ExpectedConnection, ...]

    def __init__(self) -> None:
        raise TypeError("GradGraphInfo is created by popxl.transforms.autodiff.")

    @classmethod
    def _create(
        cls,
        graph: "Graph",
        forward_graph: "Graph",
        expected_inputs: Sequence[ExpectedConnection],
        expected_outputs: Sequence[ExpectedConnection],
    ) -> "GradGraphInfo":
        info = object.__new__(cls)
        info._graph = graph
        info._forward_graph = forward_graph
        info._expected_inputs = tuple(expected_inputs)
        info._expected_outputs = tuple(expected_outputs)
        return info

    @property
    def graph(self) -> "Graph":
        return self._graph

    @property
    def forward_graph(self) -> "Graph":
        return self._forward_graph

    @property
    def expected_inputs(self) -> Tuple[ExpectedConnection, ...]:
        return self._expected_inputs

    @property
    def expected_outputs(self) -> Tuple[ExpectedConnection, ...]:
        return self._expected_outputs

    @property
    def inputs(self) -> Tuple["Tensor", ...]:
        return tuple(c.fwd_tensor for c in self._expected_inputs)

    @property
    def outputs(self) -> Tuple["Tensor", ...]:
        return tuple(c.fwd_tensor for c in self._expected_outputs)

    def inputs_dict(self, fwd_call_info: "CallSiteInfo") -> Dict["Tensor", "Tensor"]:
        """Grad-graph inputs of type `Fwd` (activations) mapped to the forward call's tensors."""
        if fwd_call_info.called_graph != self._forward_graph:
            raise TypeError(
                f"inputs_dict: the call site calls {fwd_call_info.called_graph.id!r}, but this "
                f"grad graph was made from {self._forward_graph.id!r}."
            )
        grad_inputs = self._graph.inputs
        return {
            grad_inputs[i]: fwd_call_info.graph_to_parent(c.fwd_tensor)
            for i, c in enumerate(self._expected_inputs)
            if c.connection_type is ExpectedConnectionType.Fwd
        }

    def fwd_graph_ins_to_grad_parent_outs(
        self, grad_call_info: "CallSiteInfo"
    ) -> Dict["Tensor", "Tensor"]:
        """Forward-graph inputs mapped to the grad call's output tensors (their gradients)."""
        return {
            c.fwd_tensor: grad_call_info.parent_output(i)
            for i, c in enumerate(self._expected_outputs)
        }

    def fwd_parent_ins_to_grad_parent_outs(
        self, fwd_call_info: "CallSiteInfo", grad_call_info: "CallSiteInfo"
    ) -> Dict["Tensor", "Tensor"]:
        """The forward call's input tensors mapped to the grad call's outputs (their gradients)."""
        return {
            fwd_call_info.graph_to_parent(fwd_in): grad_out
            for fwd_in, grad_out in self.fwd_graph_ins_to_grad_parent_outs(grad_call_info).items()
        }

    def __repr__(self) -> str:
        def block(conns) -> str:
            return "".join(f"    {c!r}\n" for c in conns)

        return (
            f"GradGraphInfo[\n  graph={self._graph.id}\n  expected_inputs=[\n"
            f"{block(self._expected_inputs)}  ]\n  expected_outputs=[\n"
            f"{block(self._expected_outputs)}  ]\n]"
        )


def new_grad_graph_info(
    graph: "Graph",
    forward_graph: "Graph",
    expected_inputs: Sequence[ExpectedConnection],
    expected_outputs: Sequence[ExpectedConnection],
) -> GradGraphInfo:
    """A `GradGraphInfo` for a gradient graph built without `autodiff` (a hand-written
    ``build_grad``, a recompute graph, an autodiff result with outputs removed).

    PopXL has no public constructor (popxl.addons builds one through PopART's
    ``BwdGraphInfo``); this is the one public way here, for the packages above.
    """
    return GradGraphInfo._create(graph, forward_graph, expected_inputs, expected_outputs)
