"""The IR: a main graph, subgraphs, IR-global naming counters and session options."""

from __future__ import annotations

import inspect
import itertools
import sys
import typing
import warnings
from types import FrameType
from typing import Any, Callable, Dict, List, Optional, Set

from .graph import Graph
from .pb_ir import SessionOptions, _PbIr
from .planning import planning_default
from .replica_grouping import ReplicaGrouping
from .tensor import Tensor, TensorByRef, TensorSpec, graph_input

__all__ = ["Ir", "SessionOptions"]


class IrChangedWarning(UserWarning):
    """The Ir changed after a Session compiled it: that Session keeps running the program it
    compiled; a new Session runs the changed one (PopXL allows the change too)."""


# re-exported: PopXL code reaches them as popxl_core.ir.SessionOptions

_IR_IDS = itertools.count()

# How the simulator does floating point arithmetic whose result torch's CPU kernels make
# depend on the shape of the whole tensor (see `Ir.numerics`).
NUMERICS = ("ipu", "torch")


class Ir:
    """A PopXL program: the main graph plus the subgraphs it calls."""

    _dot_count: int  # dot files written (`dot_checks`), set when the first one is

    def __init__(self, replication: Any = 1) -> None:
        # "popdist": the replicas are the launcher's processes (popxl_core.distributed);
        # without a launcher the Session says how to launch
        self._from_launcher = replication == "popdist"
        if self._from_launcher:
            replication = _launcher_replication()
        if not isinstance(replication, int) or replication < 1:
            raise ValueError(f"Ir(replication=...) must be a positive int, got {replication!r}.")
        self._id = next(_IR_IDS)
        self._graph_counter = itertools.count()
        self._op_counter = itertools.count(100)
        self._dedup_counter = itertools.count()
        self._tensor_ids: Set[str] = set()
        self._graphs: Dict[str, Graph] = {}
        self._pb_ir = _PbIr(self)
        self._replication_factor = 1
        self._num_host_transfers = 1
        self._session = None
        self._warned_for = None  # the Session the last IrChangedWarning named
        self._remote_buffers: Dict[int, Any] = {}
        self._numerics = "ipu"
        self._planning = planning_default()  # fixed at creation: see `planning`
        self.main_graph = self._new_graph("")
        self.replication_factor = replication

    # properties --------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._id

    @property
    def num_host_transfers(self) -> int:
        return self._num_host_transfers

    @num_host_transfers.setter
    def num_host_transfers(self, value: int) -> None:
        self._check_unowned(f"setting num_host_transfers to {value!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"num_host_transfers must be a positive int, got {value!r}.")
        self._num_host_transfers = value

    @property
    def planning(self) -> bool:
        """Whether this Ir was created in planning mode (`popxl_core.planning`): variables
        without values, a Session that plans and reports but does not run. A project setting,
        not PopXL's."""
        return self._planning

    @property
    def replication_factor(self) -> int:
        return self._replication_factor

    @replication_factor.setter
    def replication_factor(self, value: int) -> None:
        if self._session is not None:
            raise RuntimeError("replication_factor cannot change after a Session owns the Ir.")
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"replication_factor must be a positive int, got {value!r}.")
        self._replication_factor = value
        opts = self._pb_ir.getSessionOptions()
        opts.enableReplicatedGraphs = value > 1
        opts.replicatedGraphCount = value

    @property
    def numerics(self) -> str:
        """How the simulator computes a MatMul: ``"ipu"`` (default) or ``"torch"``.

        ``"ipu"``: each output element depends only on its own row and column, never on how
        many rows the batch has, as on the IPU, whose AMP units sum along K in a fixed order.
        torch's float32 CPU matmul does not give that (MKL picks its kernel by the number of
        rows, so a row of a 12-row product can differ in the last bits from the same row of
        a 3-row one, and batch serialisation would change the numbers); the simulator runs it
        on operands padded to shapes where it does (`ops.matmul`), and the transcendental
        elementwise ops on whole SIMD blocks (`ops._positional`).
        ``"torch"``: torch's own float32 kernels, bit for bit what eager PyTorch computes
        (and torch's own float16 kernels for float16 tensors, where ``"ipu"`` computes
        float16 in float32 and rounds, as the IPU's AMP units do);
        `popxl_fx` sets it, because its reference is eager PyTorch. A project setting, not
        PopXL's; it cannot change once a Session has compiled the Ir.
        """
        return self._numerics

    @numerics.setter
    def numerics(self, value: str) -> None:
        if value not in NUMERICS:
            raise ValueError(f"Ir.numerics must be one of {NUMERICS}, got {value!r}.")
        self._check_unowned(f"setting numerics to {value!r}")
        self._numerics = value

    @property
    def conv_partials_type(self) -> str:
        """What convolutions without their own ``partials_type`` accumulate in: ``"float"``,
        ``"half"`` or ``""`` (unset: torch's kernels for the inputs' dtype). PopXL sets it as
        ``ir._pb_ir.getSessionOptions().convolutionOptions["partialsType"]``; this reads and
        writes that option (`popxl_core.ops._conv_partials`)."""
        return self._pb_ir.getSessionOptions().conv_partials_type

    @conv_partials_type.setter
    def conv_partials_type(self, value: str) -> None:
        if value not in ("float", "half", ""):
            raise ValueError(f'conv_partials_type must be "float", "half" or "", got {value!r}.')
        self._check_unowned(f"setting the convolutions' partials type to {value!r}")
        self._pb_ir.getSessionOptions().convolutionOptions["partialsType"] = value

    @property
    def instance_replication_factor(self) -> int:
        """The replicas this process runs: all of them, or its share in a torch.distributed
        job (`popxl_core.distributed`)."""
        from .distributed import local_replica_count

        return local_replica_count(self._replication_factor)

    def replica_grouping(
        self, stride: int = 1, group_size: Optional[int] = None
    ) -> ReplicaGrouping:
        return ReplicaGrouping._from_params(self._replication_factor, stride, group_size)

    def replica_grouping_from_assignments(self, assignment: List[int]) -> ReplicaGrouping:
        if len(assignment) != self._replication_factor:
            raise ValueError(
                f"{len(assignment)} assignments for {self._replication_factor} replicas."
            )
        return ReplicaGrouping._from_assignments(assignment)

    def get_all_h2d_streams(self) -> Set[Any]:
        return self._streams_used_by("HostLoad")

    def get_all_d2h_streams(self) -> Set[Any]:
        return self._streams_used_by("HostStore")

    def _streams_used_by(self, op_type: str) -> Set[Any]:
        return {
            op.attrs["stream"] for g in self._graphs.values() for op in g._ops if op.type == op_type
        }

    # graphs -------------------------------------------------------------------
    @property
    def graphs(self) -> tuple:
        """Every graph of this Ir, the main graph first, then in creation order."""
        return tuple(self._graphs.values())

    def check_editable(self, what: str, *args: Any) -> None:
        """Warn (`IrChangedWarning`, once per Session) of a change to the program once a
        Session has compiled this Ir, as PopXL allows it: that Session keeps running the
        program it compiled, and a Session built after runs the changed Ir. ``what % args``
        names the change, formatted only when it warns (every op and tensor a build makes
        passes here, nearly always with no Session)."""
        if self._session is None or self._warned_for is self._session:
            return
        self._warned_for = self._session
        what = what % args if args else what
        warnings.warn(
            IrChangedWarning(
                f"{self!r} is owned by {self._session!r}, which compiled it when it was built; "
                f"{what} (and any later change) is not part of that Session's program: it "
                "keeps running what it compiled. Build a new Session to run the changed Ir."
            ),
            stacklevel=_user_stacklevel(),
        )

    def _check_unowned(self, what: str) -> None:
        """Refuse a change of a setting the owning Session runs by (``num_host_transfers``,
        read as it runs; ``numerics``, the project's own setting)."""
        if self._session is not None:
            raise RuntimeError(
                f"{self!r} is owned by {self._session!r}, which runs by this setting; "
                f"{what} now would change that Session's program. Set it before creating "
                "the Session, or build a new Ir."
            )

    def _new_graph(self, graph_id: str) -> Graph:
        self.check_editable(f"creating graph {graph_id!r}")
        g = Graph._create(self, graph_id)
        self._graphs[graph_id] = g
        return g

    def _unique_graph_id(self, name: str) -> str:
        return f"{name}_subgraph({next(self._graph_counter)})"

    def _unique_tensor_id(self, base: str) -> str:
        self.check_editable("creating tensor %r", base)
        tid = base
        while tid in self._tensor_ids:
            tid = f"{base}__t{next(self._dedup_counter)}"
        self._tensor_ids.add(tid)
        return tid

    def _next_op_id(self) -> int:
        return next(self._op_counter)

    def create_empty_graph(self, name: Optional[str] = None) -> Graph:
        """A new graph with no inputs, ops or outputs, named ``{name}_subgraph(N)``."""
        return self._new_graph(self._unique_graph_id(name or "graph"))

    def create_graph(self, fn: Callable, *args, **kwargs) -> Graph:
        """Trace ``fn`` (or ``module.build``) into a new subgraph.

        Tensor and TensorSpec arguments become graph inputs named after the parameters;
        the returned tensors become the graph outputs, in order.
        """
        build, name = _traced_callable(fn)
        g = self._new_graph(self._unique_graph_id(name))
        with g:
            bound = _bind_inputs(build, args, kwargs)
            result = build(*bound.args, **bound.kwargs)
            for t in _flatten_outputs(result, g):
                g._add_output(t)
        return g

    # python protocol ---------------------------------------------------------------
    def __hash__(self) -> int:
        return hash(self._id)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Ir):
            raise TypeError(f"Cannot compare Ir with {type(other).__name__}.")
        return self is other

    def __repr__(self) -> str:
        return f"Ir[id={self._id}]"

    def dot_checkpoint(self, check: str, save_dir=None) -> None:
        """Write the Ir as a Graphviz file if the dot check ``check`` is enabled (see
        `popxl_core.dot_checks`). As PopXL: ``save_dir`` becomes the option ``logDir``, and
        with neither ``POPART_DOT_CHECKS`` nor ``dotChecks`` set every check is enabled."""
        import os

        from .dot_checks import dot_checkpoint

        opts = self._pb_ir.getSessionOptions()
        if save_dir is not None:
            os.makedirs(save_dir, exist_ok=True)
            opts.logDir = str(save_dir)
        if "POPART_DOT_CHECKS" not in os.environ and not opts.dotChecks:
            opts.dotChecks = {"ALL"}
        dot_checkpoint(self, check)


def _launcher_replication() -> int:
    from .distributed import LaunchError, popdist_replication

    try:
        return popdist_replication()
    except LaunchError:
        return 1  # Session(ir) raises the LaunchError: the Ir alone may still be inspected


def _traced_callable(fn):
    from .module import Module

    if isinstance(fn, Module):
        return fn.build, type(fn).__qualname__.replace(".<locals>", "")
    if not callable(fn):
        raise TypeError(
            f"create_graph expects a function or popxl.Module, got {type(fn).__name__}."
        )
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", "graph"))
    return fn, qualname.replace(".<locals>", "")


def _is_by_ref(annotation) -> bool:
    if annotation is TensorByRef or annotation in ("TensorByRef", "popxl.TensorByRef"):
        return True
    inner = typing.get_args(annotation)
    return any(a is TensorByRef for a in inner)


def _bind_inputs(build: Callable, args, kwargs) -> inspect.BoundArguments:
    sig = inspect.signature(build)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise ValueError(
            f"create_graph: arguments do not match {build.__qualname__}{sig}: {e}"
        ) from e
    for pname, value in list(bound.arguments.items()):
        param = sig.parameters[pname]
        by_ref = _is_by_ref(param.annotation)
        bound.arguments[pname] = _to_inputs(pname, value, param.kind, by_ref)
    return bound


def _to_inputs(pname: str, value, kind, by_ref: bool):
    if _is_tensor_like(value):
        return _make_input(pname, value, by_ref)
    if kind is inspect.Parameter.VAR_KEYWORD and isinstance(value, dict):
        return {k: _to_inputs(k, v, None, by_ref) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and any(_is_tensor_like(v) for v in value):
        if not all(_is_tensor_like(v) for v in value):
            raise TypeError(f"create_graph: argument {pname!r} mixes tensors and non-tensors.")
        made = [_make_input(f"{pname}_{i}", v, by_ref) for i, v in enumerate(value)]
        return type(value)(made) if isinstance(value, list) else tuple(made)
    return value


def _is_tensor_like(v) -> bool:
    return isinstance(v, (Tensor, TensorSpec))


def _make_input(name: str, v, by_ref: bool) -> Tensor:
    spec = v.spec if isinstance(v, Tensor) else v
    return graph_input(spec.shape, spec.dtype, name, by_ref=by_ref, meta_shape=spec.meta_shape)


def _flatten_outputs(result, g: Graph) -> List[Tensor]:
    if result is None:
        return []
    items = [result] if isinstance(result, Tensor) or not _iterable(result) else list(result)
    for t in items:
        if not isinstance(t, Tensor):
            raise ValueError(  # PopXL's class for a graph's bad output
                f"Graph {g.name!r} returned {type(t).__name__}; a traced function "
                "must return None, a Tensor or an iterable of Tensors."
            )
        if t.graph is not g:
            raise ValueError(
                f"Graph {g.name!r} returned {t.id!r}, which belongs to graph "
                f"{t.graph.name!r}. Pass it in as an argument instead."
            )
    return items


def _iterable(x) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return True


def _user_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel of the first caller outside popxl_core and addons."""
    f: Optional[FrameType] = sys._getframe(1)
    level = 1
    while f is not None and f.f_globals.get("__name__", "").split(".")[0] in _OURS:
        f, level = f.f_back, level + 1
    return level


_OURS = ("popxl_core", "addons")
