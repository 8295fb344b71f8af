"""`GraphWithNamedArgs` (a graph plus its named inputs) and `BoundGraph` (a graph plus the
parent tensors bound to some of its inputs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from popxl_core import Graph, Tensor, ops
from popxl_core import transforms as core_transforms
from popxl_core.ops.call import CallSiteInfo
from popxl_core.ops.call_site import flatten_one_level
from popxl_core.printing import format_schedule
from popxl_core.transforms import GradGraphInfo

from ._grad_state import check_safe_to_autodiff
from .dot_tree import DotTree
from .named_tensors import NamedTensors

if TYPE_CHECKING:  # pragma: no cover
    from .module import Module

__all__ = ["BoundGraph", "GraphWithNamedArgs", "gradient_graph"]

TensorMap = Mapping[Tensor, Tensor]


class BoundGraph:
    """A graph with parent tensors bound to (some of) its inputs; `call` supplies them."""

    def __init__(
        self,
        graph: Graph,
        args: TensorMap | None = None,
        _names: dict[Tensor, str] | None = None,
        _extra: tuple[str, ...] = (),
    ) -> None:
        self.graph = graph
        self.args: dict[Tensor, Tensor] = dict(args or {})
        # Named inputs bind() could not match, reported by name if the call leaves them unfed.
        self._unbound_names: dict[Tensor, str] = dict(_names or {})
        self._extra_keys = tuple(_extra)

    def bind(self, args: TensorMap) -> BoundGraph:
        """A new BoundGraph with ``args`` (graph input -> parent tensor) added."""
        merged = {**self.args, **dict(args)}
        names = {t: n for t, n in self._unbound_names.items() if t not in merged}
        return BoundGraph(self.graph, merged, names, self._extra_keys)

    def call(self, *targs: Any, args: TensorMap | None = None) -> tuple[Tensor, ...]:
        """Call the graph with ``targs`` positionally and the bound args (plus ``args``)."""
        return self.call_with_info(*targs, args=args).outputs

    def call_with_info(self, *targs: Any, args: TensorMap | None = None) -> CallSiteInfo:
        """Like `call`, returning the call site's `CallSiteInfo`."""
        inputs_dict = {**self.args, **dict(args or {})}
        self._check_named_inputs_fed(targs, inputs_dict)
        return ops.call_with_info(self.graph, *targs, inputs_dict=inputs_dict)

    def _check_named_inputs_fed(self, targs, inputs_dict) -> None:
        n_pos = len(flatten_one_level(targs))
        fed = set(self.graph.inputs[:n_pos]) | set(inputs_dict)
        missing = [n for t, n in self._unbound_names.items() if t not in fed]
        if not missing:
            return
        extra = (
            f" bind() was given keys that match no named input: {list(self._extra_keys)}."
            if self._extra_keys
            else ""
        )
        raise ValueError(
            f"Named inputs {missing} of graph {self.graph.id!r} are not bound and were not "
            f"passed at the call.{extra} Bind them with `graph.bind(named_tensors)` (keys must "
            "match the graph's args) or pass them with `args={graph_input: tensor}`."
        )

    def subgraph_io_map(
        self, *targs: Any, args: TensorMap | None = None, outs: Iterable[Tensor] | None = None
    ) -> dict[Tensor, Tensor]:
        """``{subgraph tensor: parent tensor}`` for the inputs of a call (and ``outs``)."""
        inputs_dict = {**self.args, **dict(args or {})}
        positional = flatten_one_level(targs)
        mapping = dict(zip(self.graph.inputs, positional))
        mapping.update(inputs_dict)
        if outs is not None:
            mapping.update(zip(self.graph.outputs, outs))
        return mapping

    def __repr__(self) -> str:
        return f"<popxl_addons.graph.BoundGraph object at {hex(id(self))}>"


class GraphWithNamedArgs:
    """A popxl graph and its named inputs (``args``), as made by `Module.create_graph`.

    Args:
        graph: the graph.
        args: NamedTensors of graph inputs (the variables' placeholders).
        grad_graph_info: set when this is a gradient graph.
        from_module: the Module that built it (for custom gradients).
        aux: forward tensors a custom `build_grad` needs.
        called_graphs_grad_info: grad infos of graphs called inside, for autodiff.
    """

    def __init__(
        self,
        graph: Graph,
        args: NamedTensors | None = None,
        grad_graph_info: GradGraphInfo | None = None,
        from_module: Module | None = None,
        aux: Mapping | None = None,
        called_graphs_grad_info: Mapping[Graph, GradGraphInfo] | None = None,
    ) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(
                f"GraphWithNamedArgs expects a popxl Graph, got {type(graph).__name__}."
            )
        self.graph = graph
        self.args: NamedTensors = args if args is not None else NamedTensors()
        self._grad_graph_info = grad_graph_info
        self.from_module = from_module
        self.aux: dict[str, Any] = dict(aux or {})
        self.called_graphs_grad_info: dict[Graph, GradGraphInfo] = dict(
            called_graphs_grad_info or {}
        )
        self.autodiff_applied = False

    @classmethod
    def from_grad_graph(
        cls, grad_graph_info: GradGraphInfo, args: NamedTensors | None = None
    ) -> GraphWithNamedArgs:
        """Wrap the graph of ``grad_graph_info``, keeping the info."""
        return cls(grad_graph_info.graph, args, grad_graph_info=grad_graph_info)

    @property
    def grad_graph_info(self) -> GradGraphInfo:
        if self._grad_graph_info is None:
            raise AttributeError(
                f"Graph {self.graph.id!r} is not a gradient graph: it has no "
                "grad_graph_info. Make one with addons.autodiff(graph)."
            )
        return self._grad_graph_info

    @grad_graph_info.setter
    def grad_graph_info(self, info: GradGraphInfo) -> None:
        self._grad_graph_info = info

    # binding and calling --------------------------------------------------------------
    def bind(self, args: NamedTensors | Mapping[str, Tensor] | None = None) -> BoundGraph:
        """Bind named inputs to parent tensors by **name** (keys of ``args``)."""
        if args is None:
            args = NamedTensors()
        elif not isinstance(args, DotTree):
            if not isinstance(args, Mapping):
                raise TypeError(
                    f"bind expects NamedTensors (or a mapping of names to "
                    f"tensors), got {type(args).__name__}."
                )
            args = NamedTensors.from_dict(args)
        mapping = self.args.to_mapping(args)
        mine, theirs = self.args.to_dict(), args.to_dict()
        unbound = {t: k for k, t in mine.items() if k not in theirs}
        extra = tuple(k for k in theirs if k not in mine)
        return BoundGraph(self.graph, mapping, unbound, extra)

    def call(self, *targs: Any, args: TensorMap | None = None) -> tuple[Tensor, ...]:
        """Call the graph without bound named inputs (pass them in ``targs``/``args``)."""
        return self.bind().call(*targs, args=args)

    def call_with_info(self, *targs: Any, args: TensorMap | None = None) -> CallSiteInfo:
        return self.bind().call_with_info(*targs, args=args)

    # transforms -------------------------------------------------------------------------
    def autodiff(
        self,
        grads_provided: Iterable[Tensor] | None = None,
        grads_required: Iterable[Tensor] | None = None,
        called_graphs_grad_info: Mapping[Graph, GradGraphInfo] | None = None,
        method: str = "auto",
        force: bool = False,
    ) -> GraphWithNamedArgs:
        """The gradient graph of this graph (custom `build_grad` if the module has one).

        Autodiff adds forward outputs to this graph, so applying it twice is an error unless
        ``force=True``.
        """
        if method not in ("auto", "build_grad", "autodiff"):
            raise ValueError(f"method must be 'auto', 'build_grad' or 'autodiff', got {method!r}.")
        if self.autodiff_applied and not force:
            raise RuntimeError(
                f"Autodiff has already been applied to graph {self.graph.id!r}. Applying it "
                "again adds more forward outputs; reuse the first gradient graph, or pass "
                "force=True."
            )
        module = self.from_module
        custom = module is not None and module.implements_grad_graph
        if method == "build_grad":
            _check_build_grad(self.graph.id, module, custom)
        if custom and method != "autodiff":
            assert module is not None  # `custom` says so
            grad = module.create_grad_graph(self, grads_provided, grads_required)
        else:
            known = {**self.called_graphs_grad_info, **(called_graphs_grad_info or {})}
            grad = gradient_graph(self.graph, grads_provided, grads_required, known)
        self.autodiff_applied = True
        return grad

    def copy(self) -> GraphWithNamedArgs:
        """A shallow copy with its own ``args`` tree (the graph is shared)."""
        new = GraphWithNamedArgs(
            self.graph,
            self.args.copy(),
            self._grad_graph_info,
            self.from_module,
            self.aux,
            self.called_graphs_grad_info,
        )
        new.autodiff_applied = self.autodiff_applied
        return new

    def print_schedule(self) -> str:
        """The graph's schedule as text; named inputs are labelled with their keys."""
        names, tensors = self.args.unpack()
        return format_schedule(self.graph, dict(zip(tensors, names)))

    def __repr__(self) -> str:
        return f"<popxl_addons.graph.GraphWithNamedArgs object at {hex(id(self))}>"


def gradient_graph(
    fwd: Graph,
    grads_provided: Iterable[Tensor] | None,
    grads_required: Iterable[Tensor] | None,
    called_graphs_grad_info: Mapping[Graph, GradGraphInfo],
) -> GraphWithNamedArgs:
    """popxl autodiff of ``fwd`` as a GraphWithNamedArgs with `grad_graph_info` and the grad
    infos of the graphs it calls (those in ``called_graphs_grad_info`` are reused).

    Here, below `addons.transforms.autodiff` (which wraps it), so that
    `GraphWithNamedArgs.autodiff` does not import the transforms package back.
    """
    known = dict(called_graphs_grad_info)
    check_safe_to_autodiff(fwd, known)
    infos = core_transforms.autodiff(
        fwd, grads_provided, grads_required, known, return_all_grad_graphs=True
    )
    result = GraphWithNamedArgs.from_grad_graph(infos[fwd])
    result.called_graphs_grad_info = {g: i for g, i in infos.items() if g is not fwd}
    return result


def _check_build_grad(graph_id: str, module: Module | None, custom: bool) -> None:
    """``method='build_grad'`` needs the module that built the graph, with a build_grad."""
    if module is None:
        raise ValueError(
            f"method='build_grad' needs the module that built "
            f"{graph_id!r}: it works only if `from_module` is specified "
            "(create the graph with Module.create_graph)."
        )
    if not custom:
        raise ValueError(
            f"method='build_grad' but the module that built {graph_id!r} "
            "does not implement build_grad."
        )
