"""What an `addons.Module` does with gradients: outlining a submodule (`call_module`) with its
gradient recorded, and custom gradients (`build_grad`, `create_grad_graph`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from popxl_core import Graph, Tensor
from popxl_core.transforms import GradGraphInfo

from ._grad_state import AuxStore, VarGradStore
from .dot_tree import DotTree
from .graph import GraphWithNamedArgs
from .graph_cache import tensor_inputs

if TYPE_CHECKING:  # pragma: no cover
    from .module import Module

__all__ = ["ModuleGrads", "create_grad_graph_info"]

_CALL_AUTODIFF = ("auto", "build_grad", "autodiff", "none")


def _of_graph(tensors: Any, graph: GraphWithNamedArgs) -> Any:
    """``tensors``, or what it returns for ``graph`` when it is a function of the graph."""
    return tensors(graph) if callable(tensors) else tensors


class ModuleGrads:
    """The gradient half of `addons.Module` (a mixin: it reads the Module's submodules,
    variable inputs and ``_called_graphs_grad_info``)."""

    # the Module's state and methods it uses, declared for the type checker
    _submodules: dict[str, Module]
    _called_graphs_grad_info: dict[Graph, GradGraphInfo]

    if TYPE_CHECKING:  # pragma: no cover (Module's methods)

        def _taken(self, name: str | int) -> tuple: ...

        def add_variable_inputs(
            self, name: str | int, variable_f: Any, overwrite: bool = False
        ) -> Any: ...

    def _all_called_graphs_grad_info(self) -> dict[Graph, GradGraphInfo]:
        info = dict(self._called_graphs_grad_info)
        for child in self._submodules.values():
            info.update(child._all_called_graphs_grad_info())
        return info

    def call_module(
        self,
        module: Module,
        name: str | int | None = None,
        autodiff: str = "auto",
        grads_provided: Iterable[Tensor]
        | Callable[[GraphWithNamedArgs], Iterable[Tensor]]
        | None = None,
        grads_required: Iterable[Tensor]
        | Callable[[GraphWithNamedArgs], Iterable[Tensor]]
        | None = None,
    ) -> Callable:
        """A callable that outlines ``module``: create_graph + add_variable_inputs + call.

        With ``autodiff='auto'`` a module with `build_grad` gets its custom gradient recorded
        for when this module's graph is differentiated; 'autodiff' records popxl's gradient.
        ``grads_provided`` / ``grads_required`` may be functions of the callee's graph (as
        popxl.addons takes them: the tensors exist only once the graph is built).
        """
        if autodiff not in _CALL_AUTODIFF:
            raise ValueError(f"autodiff must be one of {_CALL_AUTODIFF}, got {autodiff!r}.")

        def outlined(*args: Any, **kwargs: Any) -> tuple[Tensor, ...]:
            facts, graph = module.create_graph(*args, **kwargs)
            n_outputs = len(graph.graph.outputs)
            # Autodiff adds forward outputs, so it must run before the call site exists.
            provided, required = (_of_graph(g, graph) for g in (grads_provided, grads_required))
            self._outline_grad(graph, autodiff, provided, required)
            named = self.add_variable_inputs(self._outline_name(module, name), facts)
            outs = graph.bind(named).call(*tensor_inputs(module.build, args, kwargs))
            return tuple(outs[:n_outputs])

        return outlined

    def _outline_grad(self, graph: GraphWithNamedArgs, mode: str, provided, required) -> None:
        custom = graph.from_module is not None and graph.from_module.implements_grad_graph
        if mode == "build_grad" or (mode == "auto" and custom):
            grad = graph.autodiff(provided, required, method="build_grad")
        elif mode == "autodiff":
            grad = graph.autodiff(provided, required, method="autodiff")
        else:
            # differentiated later through this graph: keep what its own call sites recorded
            self._called_graphs_grad_info.update(graph.called_graphs_grad_info)
            return
        self._called_graphs_grad_info.update(grad.called_graphs_grad_info)
        self._called_graphs_grad_info[graph.graph] = grad.grad_graph_info

    def add_called_graphs_grad_info(self, infos: dict[Graph, GradGraphInfo]) -> None:
        """Differentiate the graphs in ``infos`` with the given grad infos wherever this
        module's graph is differentiated (a subclass that builds a called graph's gradient
        itself, e.g. popxl_fx's recomputed blocks)."""
        self._called_graphs_grad_info.update(infos)

    def has_grad_graph_info(self, graph: Graph) -> bool:
        """Whether the gradient of called graph ``graph`` is already recorded."""
        return graph in self._called_graphs_grad_info

    def _outline_name(self, module: Module, name: str | int | None) -> str:
        if name is not None:
            return str(name)
        base = module._name_scope or DotTree.sanitise(type(module).__name__.lower())
        candidate, k = base, 0
        while self._taken(candidate)[1]:
            k += 1
            candidate = f"{base}_{k}"
        return candidate

    # custom gradients -----------------------------------------------------------------
    def build_grad(self, *grads: Tensor) -> Any:
        """Override to define a custom gradient; see `create_grad_graph`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement build_grad.")

    @property
    def implements_grad_graph(self) -> bool:
        return type(self).build_grad is not ModuleGrads.build_grad

    def create_grad_graph(
        self,
        fwd_graph: GraphWithNamedArgs,
        grads_provided: Iterable[Tensor] | None = None,
        grads_required: Iterable[Tensor] | None = None,
    ) -> GraphWithNamedArgs:
        """The gradient graph of ``fwd_graph`` from `build_grad`.

        ``build_grad(*grads)`` gets one gradient per provided forward output, reads forward
        tensors stashed in `build` as ``self.aux[key]``, returns the gradients of the
        unnamed (positional) inputs in order and sets ``self.var_grad[arg name]``.
        """
        from ._custom_grad import build_custom_grad_graph

        try:
            module = cast("Module", self)  # this mixin is only ever a Module's
            return build_custom_grad_graph(module, fwd_graph, grads_provided, grads_required)
        finally:
            self.aux, self.var_grad = AuxStore(), VarGradStore()


def create_grad_graph_info(
    ir,
    fwd_graph: Graph,
    grad_graph: Graph,
    grad_input_to_fwd_output: dict[Tensor, Tensor],
    grad_output_to_fwd_input: dict[Tensor, Tensor],
    fwd_tensors: dict[Tensor, Tensor],
) -> GradGraphInfo:
    """A GradGraphInfo for a hand-built gradient graph.

    Args:
        grad_input_to_fwd_output: grad-graph input -> the forward output it is the grad of.
        grad_output_to_fwd_input: grad-graph output -> the forward input it is the grad of.
        fwd_tensors: grad-graph input -> the forward tensor (activation) it carries.
    """
    from ._custom_grad import grad_info_from_maps

    return grad_info_from_maps(
        fwd_graph, grad_graph, grad_input_to_fwd_output, grad_output_to_fwd_input, fwd_tensors
    )
