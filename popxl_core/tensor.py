"""Tensors of the IR: intermediate tensors, variables, constants; specs and factories."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple, Type, TypeVar

import numpy as np
import torch

from . import dtypes
from .arg_checks import checked_dtype, checked_shape
from .context import gcg, get_current_context
from .dtypes import dtype
from .host_data import to_numpy
from .planning import weightless
from .tensor_data import check_data, grouped_data, host_array
from .tensor_methods import TensorMethods
from .tensor_spec import TensorByRef, TensorSpec

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Graph, Op
    from .remote_variables import RemoteInfo
    from .replica_grouping import ReplicaGrouping

__all__ = [
    "Tensor",
    "Variable",
    "Constant",
    "TensorSpec",
    "TensorByRef",
    "HostTensor",
    "host_tensor_types",
    "variable",
    "constant",
    "graph_input",
    "graph_output",
    "to_numpy",
    "scalar_operand",
]

HostTensor = Any  # numpy array, torch tensor, python scalar or nested list
host_tensor_types = (np.ndarray, torch.Tensor, int, float, bool, list, tuple)
_T = TypeVar("_T", bound="Tensor")


class Tensor(TensorMethods):
    """A value in a graph. Made by ops and factories, never constructed directly; its shape
    methods and operators are `TensorMethods` (tensor_methods.py)."""

    # set by `_create` (object.__new__, no __init__): declared here for the type checker
    _id: str
    _graph: "Graph"
    _spec: TensorSpec
    _producer: Optional["Op"]
    _ipu: int
    _tile_set: str

    __array_ufunc__ = None  # numpy defers to our reflected dunders
    __iter__ = None
    __contains__ = None

    def __init__(self) -> None:
        raise RuntimeError("Tensors are created by ops or factories (popxl.variable, ...).")

    @classmethod
    def _create(
        cls: Type[_T], graph: "Graph", tensor_id: str, spec: TensorSpec, producer=None
    ) -> _T:
        t = object.__new__(cls)
        t._id = tensor_id
        t._graph = graph
        t._spec = spec
        t._producer = producer
        context = get_current_context()
        t._ipu = context.ipu_id
        t._tile_set = "io" if context.io_tile_set else "compute"
        graph._register_tensor(t)
        return t

    # identity ------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._id

    @property
    def name(self) -> str:
        scope = self._graph._scope_prefix
        return self._id[len(scope) :] if scope and self._id.startswith(scope) else self._id

    @property
    def scope(self) -> str:
        return self._graph.name

    @property
    def graph(self) -> "Graph":
        return self._graph

    @property
    def ir(self):
        return self._graph.ir

    @property
    def producer(self) -> Optional["Op"]:
        return self._producer

    # spec ------------------------------------------------------------------
    @property
    def spec(self) -> TensorSpec:
        return self._spec

    @property
    def dtype(self) -> dtype:
        return self._spec.dtype

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._spec.shape

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        return self._spec.meta_shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def nelms(self) -> int:
        return self._spec.nelms

    @property
    def ipu(self) -> int:
        return self._ipu

    @property
    def tile_set(self) -> str:
        return self._tile_set

    @property
    def location_info(self):
        return None

    @property
    def in_sync_with_ipu(self) -> bool:
        return True

    def strides(self, shape=None) -> Tuple[int, ...]:
        shape = self.shape if shape is None else tuple(shape)
        out, acc = [], self.dtype.itemsize
        for s in reversed(shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    def diag(self) -> "Tensor":
        if self.rank != 2:
            raise ValueError(f"diag() needs a 2-D tensor, {self.id!r} has shape {self.shape}.")
        n = min(self.shape)
        # element (i, i) sits at i * (cols + 1) in row-major order
        idx = np.arange(n, dtype=np.int32) * (self.shape[1] + 1)
        return _ops().gather(self.flatten(), constant(idx, dtypes.int32))

    def _ensure_tensor(self, value, dtype=None) -> "Tensor":
        if isinstance(value, Tensor):
            return value
        data = np.asarray(value)
        if data.size == 0:
            raise ValueError(f"Cannot combine {self.id!r} with an empty value {value!r}.")
        return scalar_operand(value, dtype or self.dtype, self)

    def __len__(self) -> int:
        if not self.shape:
            raise ValueError(f"len() of a scalar tensor {self.id!r}.")
        return self.shape[0]

    def __bool__(self) -> bool:
        return True

    # Equality and hashing are object identity, inherited from `object`: its C slots cost a
    # fraction of a Python `__hash__` (the compiler and planner hash tensors millions of times
    # per suite run).

    def __repr__(self) -> str:
        # The seeds (SDK 3.0 era) print every tensor kind as `Tensor[...]`.
        return f"Tensor[{self.id} {self.dtype!r} {self.shape}]"


class Variable(Tensor):
    """A main-graph tensor whose value persists across runs (weights, optimiser state)."""

    # set by the factories (`variable`, remote_variables): declared for the type checker.
    # `_remote` (remote variables) and `_shard_of` (shards) exist only on some variables:
    # remote_variables reads them with getattr(v, name, None)
    _data: np.ndarray
    _replica_grouping: Optional["ReplicaGrouping"]
    _retrieval_mode: str
    _remote: "RemoteInfo"
    _shard_of: "Variable"

    @property
    def replica_grouping(self):
        return self._replica_grouping

    @property
    def memmap_backed(self) -> bool:
        """Whether the host data is an ``np.memmap`` (kept as the host buffer, so
        ``weights_to_host`` writes the file)."""
        return isinstance(self._data, np.memmap)

    @property
    def _memmap_arr(self):
        """The ``np.memmap`` holding the host value, or None (PopXL's attribute, which
        popxl.addons reads)."""
        return self._data if isinstance(self._data, np.memmap) else None

    @property
    def retrieval_mode(self) -> str:
        return self._retrieval_mode

    @property
    def shape_on_replica(self) -> Tuple[int, ...]:
        return self.shape

    @property
    def shape_on_host(self) -> Tuple[int, ...]:
        groups = self._replica_grouping.num_groups if self._replica_grouping else 1
        return self.shape if groups == 1 else (groups, *self.shape)

    def copy_to_ipu(self, dst: int, src: Optional[int] = None) -> Tensor:
        return _ops().ipu_copy(self, dst, src)


class Constant(Tensor):
    """A tensor with a value fixed at build time."""

    _data: np.ndarray  # set by `constant` (declared for the type checker)

    def copy_to_ipu(self, dst: int, src: Optional[int] = None) -> Tensor:
        return _ops().ipu_copy(self, dst, src)


def scalar_operand(value, dt: dtype, peer: Tensor) -> "Constant":
    """``value`` as a constant of its peer tensor's dtype (PopXL's rule), naming the peer
    if the value does not fit that dtype."""
    try:
        return constant(value, dt)
    except ValueError as e:
        raise ValueError(f"Combining {peer.id!r} ({peer.dtype.name}) with {value!r}: {e}") from None


def _ops():
    from . import ops

    return ops


def variable(
    data: HostTensor,
    dtype: Optional[dtype] = None,
    name: Optional[str] = None,
    downcast: bool = True,
    replica_grouping=None,
    retrieval_mode=None,
    log2_scale=None,
    nan_on_overflow=None,
) -> Variable:
    """Create a variable in the main graph (ValueError in any other graph)."""
    g = gcg()
    if g is not g.main_graph:
        raise ValueError(
            f"popxl.variable({name or 't'!r}) was called while building subgraph {g.name!r}: "
            "variables can only be created in the main graph. Use a graph input (or an "
            "addons VariableFactory) and pass the variable at the call site."
        )
    where = f"popxl.variable({name or 't'!r})"
    data = grouped_data(data, replica_grouping, where)
    check_data(data, dtype, where)
    if g.ir.planning:  # shape and dtype only (popxl_core.planning)
        data = weightless(data)
    arr, dtype = host_array(data, dtype, downcast, log2_scale, nan_on_overflow, where)
    groups = replica_grouping.num_groups if replica_grouping is not None else 1
    shape = arr.shape[1:] if groups > 1 else arr.shape
    if groups > 1 and (not arr.shape or arr.shape[0] != groups):
        raise ValueError(
            f"Variable {name!r}: data needs leading dim {groups} (replica groups), "
            f"got shape {arr.shape}."
        )
    spec = TensorSpec(shape, dtype or dtypes.dtype.as_dtype(arr))
    v = Variable._create(g, g._create_tensor_id(name), spec)
    v._data = arr
    v._replica_grouping = replica_grouping
    v._retrieval_mode = retrieval_mode or "one_per_group"
    return v


def constant(
    data: HostTensor,
    dtype: Optional[dtype] = None,
    name: Optional[str] = None,
    downcast: bool = True,
    log2_scale=None,
    nan_on_overflow=None,
) -> Constant:
    """Create a constant in the current graph; the data is copied."""
    g = gcg()
    where = f"popxl.constant({name or 't'!r})"
    check_data(data, dtype, where)
    if isinstance(data, np.memmap):  # a constant copies its data (only variables keep one)
        data = np.array(data)
    arr, dtype = host_array(data, dtype, downcast, log2_scale, nan_on_overflow, where)
    spec = TensorSpec(arr.shape, dtype or dtypes.dtype.as_dtype(arr))
    c = Constant._create(g, g._create_tensor_id(name), spec)
    c._data = arr
    return c


def graph_input(
    shape, dtype: dtype, name: Optional[str] = None, by_ref: bool = False, meta_shape=None
) -> Tensor:
    """Add an input to the current graph."""
    g = gcg()
    if g is g.main_graph:
        raise ValueError("graph_input cannot be used in the main graph; use a stream or variable.")
    where = f"graph_input({name or 't'!r})"
    spec = TensorSpec(checked_shape(shape, where), checked_dtype(dtype, where), meta_shape)
    t = Tensor._create(g, g._create_tensor_id(name), spec)
    g._add_input(t, by_ref)
    return t


def graph_output(t: Tensor) -> None:
    """Mark ``t`` as the next output of the current graph."""
    g = gcg()
    if not isinstance(t, Tensor):
        raise TypeError(f"graph_output expects a Tensor, got {type(t).__name__}.")
    if t.graph is not g:
        raise ValueError(
            f"graph_output: tensor {t.id!r} belongs to {t.graph.name!r}, "
            f"not to the current graph {g.name!r}."
        )
    g.ir.check_editable(f"marking {t.id!r} as an output of graph {g.name!r}")
    g._outputs.append(t)
