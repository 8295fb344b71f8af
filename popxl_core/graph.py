"""Graphs and the ops in them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

from . import debug_info
from .context import get_current_context

if TYPE_CHECKING:  # pragma: no cover
    from .ir import Ir
    from .ops.registry import OpDef
    from .tensor import Tensor, Variable

__all__ = ["Graph", "Op"]


class Op:
    """One op instance: a row of the op table applied to tensors of one graph."""

    __slots__ = (
        "id",
        "opdef",
        "graph",
        "inputs",
        "outputs",
        "attrs",
        "called_graphs",
        "ipu",
        "tile_set",
        "name",
        "by_ref_modified",
        "module_path",
        "settings",
        "concurrency_group",
        "exchange_group",
        "__weakref__",
    )

    def __init__(
        self,
        opid: int,
        opdef: "OpDef",
        graph: "Graph",
        inputs: List["Tensor"],
        attrs: Dict[str, Any],
        called_graphs: Tuple["Graph", ...],
        name: str,
    ) -> None:
        self.id = opid
        self.opdef = opdef
        self.graph = graph
        self.inputs = list(inputs)
        self.outputs: List["Tensor"] = []
        self.attrs = attrs
        self.called_graphs = called_graphs
        ctx = get_current_context()
        self.ipu = ctx.ipu_id
        self.tile_set = "io" if ctx.io_tile_set else "compute"
        self.name = name
        self.by_ref_modified: Set[int] = set()  # input indexes a by-ref call modifies
        # the torch module that this op was lowered from (set by popxl_fx; used in OOM errors)
        self.module_path: Optional[str] = ctx.module_path
        # PopART op settings that do not change the numbers (e.g. the matmul's fully
        # connected pass, set by popxl.addons' enable_fc_pass / disable_fc_pass)
        self.settings: Dict[str, Any] = {}
        # schedule facts that change the cost estimate, never the numbers: the concurrent
        # multi-IPU step the op runs in (`transforms.ipu_concurrency`), and the merged
        # exchange it is part of, with whether it is that exchange's first op
        # (`transforms.merge_exchange`)
        self.concurrency_group: Optional[int] = None
        self.exchange_group: Optional[Tuple[int, bool]] = None

    @property
    def type(self) -> str:
        """The op table's name of this op (the simulator's key); the PopXL op type, except
        for the few rows PopXL shares with another (see `OpDef.popxl_type`)."""
        return self.opdef.name

    def opType(self) -> str:  # popart spelling used by user code
        """The PopXL op type, as `print_schedule` shows it (``MatMul`` for a pow2-scaled
        matmul too)."""
        return self.opdef.popxl_type or self.opdef.name

    def kernel_attrs(self) -> Dict[str, Any]:
        """The keyword arguments of the op's kernel: its attributes, and the session options
        the op reads (`OpDef.session_options`) as they are now: a Session reads them once,
        when it compiles, as PopART reads them when it lowers the op."""
        opts = self.opdef.session_options
        if not opts:
            return self.attrs
        session = self.graph.ir._pb_ir.getSessionOptions()
        return {**self.attrs, **{kw: getattr(session, name) for kw, name in opts.items()}}

    def modified_inputs(self) -> Set[int]:
        """Indexes of inputs this op writes to (in-place ops and by-ref call inputs)."""
        return set(self.opdef.inplace) | self.by_ref_modified

    def aliased_input(self) -> "Optional[Tensor]":
        """The input whose storage output 0 shares (an in-place op's written input, a view's
        source), or None when the output is storage of its own."""
        if self.opdef.inplace:
            return self.inputs[self.opdef.inplace[0]]
        if self.opdef.view and self.inputs:
            return self.inputs[0]
        return None

    def __repr__(self) -> str:
        return f"Op[{self.opType()}.{self.id} in {self.graph.name!r}]"


class Graph:
    """A PopXL graph. Created only by `Ir` (main graph, `create_graph`, `create_empty_graph`)."""

    # set by `_create` (object.__new__, no __init__): declared here for the type checker
    _ir: "Ir"
    _id: str
    _ops: List[Op]
    _tensors: Dict[str, "Tensor"]
    _inputs: List["Tensor"]
    _outputs: List["Tensor"]
    _by_ref_inputs: Set["Tensor"]
    _topocons: List[Tuple[Op, Op]]
    _hooks: Dict[int, Callable]
    _consumers: Dict[str, List[Op]]
    # (fingerprint, schedule) set by `schedule.schedule` when first asked (no value before)
    _schedule_cache: Tuple[Any, Tuple[Op, ...]]

    def __init__(self) -> None:
        raise TypeError("popxl.Graph cannot be constructed directly; use ir.create_graph.")

    @classmethod
    def _create(cls, ir: "Ir", graph_id: str) -> "Graph":
        g = object.__new__(cls)
        g._ir = ir
        g._id = graph_id
        g._ops = []
        g._tensors = {}
        g._inputs = []
        g._outputs = []
        g._by_ref_inputs = set()
        g._topocons = []
        g._hooks = {}
        g._consumers = {}
        return g

    # identity --------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        return self._id

    @property
    def ir(self) -> "Ir":
        return self._ir

    @property
    def main_graph(self) -> "Graph":
        return self._ir.main_graph

    @property
    def _scope_prefix(self) -> str:
        return f"{self._id}/" if self._id else ""

    def __eq__(self, other) -> bool:
        return isinstance(other, Graph) and other._id == self._id and other._ir is self._ir

    def __hash__(self) -> int:
        return hash((self._id, id(self._ir)))

    def __repr__(self) -> str:
        return f"Graph[id={self._id} name={self.name}]"

    # contents ---------------------------------------------------------------
    @property
    def inputs(self) -> Tuple["Tensor", ...]:
        return tuple(self._inputs)

    @property
    def inputs_by_name(self) -> Dict[str, "Tensor"]:
        return {t.name: t for t in self._inputs}

    @property
    def outputs(self) -> Tuple["Tensor", ...]:
        return tuple(self._outputs)

    @property
    def tensors(self) -> Tuple["Tensor", ...]:
        return tuple(self._tensors.values())

    @property
    def variables(self) -> Tuple["Variable", ...]:
        from .tensor import Variable

        return tuple(t for t in self._tensors.values() if isinstance(t, Variable))

    @property
    def constants(self) -> Tuple["Tensor", ...]:
        from .tensor import Constant

        return tuple(t for t in self._tensors.values() if isinstance(t, Constant))

    @property
    def ops(self) -> Tuple[Op, ...]:
        return tuple(self._ops)

    @property
    def by_ref_inputs(self) -> frozenset:
        """The inputs made with ``graph_input(..., by_ref=True)`` (popxl keeps them as the
        private ``_by_ref_inputs``): every call site marks their parent tensors modified."""
        return frozenset(self._by_ref_inputs)

    @property
    def called_graphs(self) -> Tuple["Graph", ...]:
        seen: Dict[str, Graph] = {}
        for op in self._ops:
            for g in op.called_graphs:
                seen.setdefault(g.id, g)
        return tuple(seen.values())

    def get_tensor(self, tensor_id: str) -> "Tensor":
        try:
            return self._tensors[tensor_id]
        except KeyError:
            raise KeyError(f"No tensor {tensor_id!r} in graph {self.name!r}.") from None

    def consumers(self, t: "Tensor") -> List[Op]:
        return list(self._consumers.get(t.id, ()))

    def __contains__(self, t) -> bool:
        from .tensor import Tensor

        if isinstance(t, str):  # a tensor id, as PopART's graph (ir._pb_ir.getMainGraph()) takes
            return t in self._tensors
        if not isinstance(t, Tensor):
            raise TypeError(
                f"Graph.__contains__ expects a Tensor or a tensor id, got {type(t).__name__}."
            )
        return self._tensors.get(t.id) is t

    def __enter__(self) -> "Graph":
        get_current_context().push_graph(self)
        return self

    def __exit__(self, *exc) -> None:
        get_current_context().pop_graph(self)

    # hooks ------------------------------------------------------------------
    def register_op_created_hook(self, fn: Callable[[Op], Any]) -> int:
        def graph_hook(op: Op) -> None:
            if op.graph is self:
                fn(op)

        return get_current_context().register_op_created_hook(graph_hook)

    def remove_op_created_hook(self, handle: int) -> None:
        get_current_context().remove_op_created_hook(handle)

    # construction (used by factories and the op builder) ------------------
    def _create_tensor_id(self, name: Optional[str] = None) -> str:
        scopes = get_current_context().name_scopes
        base = "/".join((*scopes, name or "t")) if scopes else name or "t"
        return self._ir._unique_tensor_id(self._scope_prefix + base)

    def _register_tensor(self, t: "Tensor") -> None:
        self._tensors[t.id] = t
        debug_info.tensor_created(t)  # popart.initializePoplarDebugInfo's file, when open

    def _add_input(self, t: "Tensor", by_ref: bool) -> None:
        self._inputs.append(t)
        if by_ref:
            self._by_ref_inputs.add(t)

    def _add_op(self, op: Op) -> None:
        self._ops.append(op)
        for t in op.inputs:
            self._consumers.setdefault(t.id, []).append(op)

    def _add_topocon(self, before: Op, after: Op) -> None:
        if before is not after:
            self._topocons.append((before, after))

    def _add_output(self, t: "Tensor") -> None:
        self._outputs.append(t)
