"""Variable factories: recipes for main-graph variables whose placeholders live in subgraphs.

PopXL variables can only be created in the main graph, so a Module's `build` records a
`VariableFactory` per named input; `NamedVariableFactories.init()` later creates the
variables in the main graph.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import numpy as np

import popxl_core
from popxl_core import Tensor, dtype, float32, gcg, int32, uint32
from popxl_core.arg_checks import check_conversion, checked_dtype
from popxl_core.planning import planning_default

from .dot_tree import DotTree
from .named_tensors import NamedTensors
from .shape_only import known_shape

__all__ = [
    "NamedVariableFactories",
    "VariableFactory",
    "add_replica_sharded_variable_input",
    "add_variable_input",
]

HostData = Any  # numpy array, torch tensor, python scalar or nested list
DataIter = Callable[[], HostData] | Iterable[HostData]

# popxl.variable downcasts 64-bit host data unless a dtype is given; factories follow it.
_DOWNCAST = {np.dtype(np.float64): float32, np.dtype(np.int64): int32, np.dtype(np.uint64): uint32}


def _default_dtype(arr: np.ndarray) -> dtype:
    return _DOWNCAST.get(arr.dtype) or dtype.as_dtype(arr)


def _call_forever(fn: Callable[[], HostData]) -> Iterator[HostData]:
    while True:
        yield fn()


class VariableFactory:
    """How to make one variable: a data source, dtype, replica grouping and sharding.

    A callable ``data_iter`` is called once straight away as a test, then once more for the
    first value (so ``partial(np.random.normal, ...)`` consumes the RNG twice here, exactly
    like popxl.addons). An iterable is consumed one value per variable.

    Args:
        data_iter: a callable returning host data, or an iterable of host data.
        dtype: the variable dtype (default: from the first value, 64-bit downcast).
        name: the base name used by `create_input`.
        by_ref: graph inputs made from this factory are passed by reference.
        replica_grouping: default ``ir.replica_grouping()`` (needs a graph context).
        shard_over: > 1 makes a replica-sharded input of shape ``(ceil(nelms / shard_over),)``.
    """

    def __init__(
        self,
        data_iter: DataIter,
        dtype: dtype | None = None,
        name: str | None = None,
        by_ref: bool = False,
        replica_grouping=None,
        shard_over: int = 1,
    ) -> None:
        checked_dtype(dtype, f"VariableFactory({name!r})", optional=True)
        self.name = name
        self.by_ref = by_ref
        self.data_iter = data_iter
        planning = _planning_now()
        self._source = self._make_source(data_iter, name, test=not planning)
        self._peeked: list = []
        first = self._first_value(planning, dtype)
        self.dtype = dtype if dtype is not None else _default_dtype(first)
        self.replica_grouping = replica_grouping or _current_ir(name).replica_grouping()
        self.shard_over = int(shard_over or 1)
        self.shape, self.meta_shape = self._shapes(first.shape)
        if planning:  # the shape and dtype are known; no value is kept or drawn again
            self._peeked = []

    def _first_value(self, planning: bool, dtype: dtype | None) -> np.ndarray:
        """The first value, kept for the first variable; in planning mode a known sampler's
        shape is read from its size argument (`shape_only`) instead of drawn."""
        shape = known_shape(self.data_iter) if planning and dtype is not None else None
        if shape is not None and dtype is not None:
            return np.broadcast_to(np.zeros((), dtype.as_numpy()), shape)
        self._peeked = [self._draw()]
        return np.asarray(self._peeked[0])

    @staticmethod
    def _make_source(data_iter: DataIter, name: str | None, test: bool) -> Iterator[HostData]:
        if callable(data_iter):
            try:
                if test:  # planning mode skips it: its values would never be used
                    data_iter()
            except Exception as e:
                raise ValueError(
                    f"Passed callable via `data_iter` throws error. Variable "
                    f"{name!r}: {type(e).__name__}: {e}"
                ) from e
            return _call_forever(data_iter)
        try:
            return iter(data_iter)
        except TypeError:
            raise TypeError(
                f"Variable {name!r}: data_iter must be a callable or an iterable, "
                f"got {type(data_iter).__name__}."
            ) from None

    def _shapes(self, full: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.shard_over <= 1:
            return tuple(full), ()
        # shards are padded: each replica holds ceil(nelms / shard_over) elements, like popxl
        nelms = int(np.prod(full, dtype=np.int64))
        return (-(-nelms // self.shard_over),), tuple(full)

    def _draw(self) -> HostData:
        try:
            return next(self._source)
        except StopIteration:
            raise ValueError(f"Variable {self.name!r}: data_iter is exhausted.") from None

    @property
    def replica_sharded(self) -> bool:
        return self.shard_over > 1

    @property
    def data_shape(self) -> tuple[int, ...]:
        """The shape of one host value (the full shape when sharded)."""
        return self.meta_shape or self.shape

    # data ---------------------------------------------------------------------------
    def next_data(self, empty: bool = False) -> np.ndarray:
        """The next host value (``num_groups`` values stacked on axis 0 if grouped)."""
        groups = self.replica_grouping.num_groups
        if _planning_now():  # shape and dtype only (popxl_core.planning)
            return self._no_values()
        draws = [self._one(empty) for _ in range(groups)]
        return draws[0] if groups == 1 else np.stack(draws)

    def _no_values(self) -> np.ndarray:
        """The next value's shape and dtype in planning mode: a broadcast zero, nothing drawn."""
        groups = self.replica_grouping.num_groups
        shape = self.data_shape if groups == 1 else (groups, *self.data_shape)
        return np.broadcast_to(np.zeros((), self.dtype.as_numpy()), shape)

    def _one(self, empty: bool) -> np.ndarray:
        np_dtype = self.dtype.as_numpy()
        if empty:
            # 'undefined' data: zeros keep the simulator deterministic
            return np.zeros(self.data_shape, np_dtype)
        data = self._peeked.pop() if self._peeked else self._draw()
        arr = np.asarray(data)
        if arr.shape != self.data_shape:
            raise ValueError(
                f"Variable {self.name!r}: data_iter gave shape {arr.shape}, "
                f"expected {self.data_shape} (the shape of its first value)."
            )
        with np.errstate(all="ignore"):  # check_conversion names a value that changes
            out = arr.astype(np_dtype, copy=False)
        check_conversion(arr, out, f"Variable {self.name!r}")
        return out

    def next_memmap(
        self, memmap_dir: str, name: str, empty: bool = False, read_only_if_exists: bool = False
    ) -> np.ndarray:
        """The variable's host data as an ``np.memmap`` of ``memmap_dir/name.npy``.

        As popxl.addons: the file holds the raw values (no .npy header; ``num_groups`` values
        stacked on axis 0 when grouped); an existing file is used as it is, mode "r+" (or "r"
        with ``read_only_if_exists``), so a model restarts from its files; a new one is filled
        with the next value (left zero when ``empty``).
        """
        if _current_ir(name).planning:  # no files: shape and dtype only (popxl_core.planning)
            return self._no_values()
        os.makedirs(memmap_dir, exist_ok=True)
        path = os.path.join(memmap_dir, f"{name}.npy")
        groups = self.replica_grouping.num_groups
        shape = self.data_shape if groups == 1 else (groups, *self.data_shape)
        np_dtype = self.dtype.as_numpy()
        if not os.path.exists(path):
            mm = np.memmap(path, dtype=np_dtype, shape=shape, mode="w+")
            if not empty:
                np.copyto(mm, self.next_data())
            return mm
        want = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if os.path.getsize(path) != want:
            raise ValueError(
                f"Variable {name!r}: {path} holds {os.path.getsize(path)} bytes, not the "
                f"{want} of {shape} {self.dtype.name}; remove it or point memmap_dir elsewhere."
            )
        mode: Literal["r", "r+"] = "r" if read_only_if_exists else "r+"
        return np.memmap(path, dtype=np_dtype, shape=shape, mode=mode)

    # tensors ------------------------------------------------------------------------
    def create_input(self, prefix: str | None = None) -> Tensor:
        """A graph input of the current graph, named ``prefix.name`` (or ``name``)."""
        name = f"{prefix}.{self.name}" if prefix and self.name else (prefix or self.name)
        return self.input_named(name)

    def input_named(self, name: str | None) -> Tensor:
        """A graph input of the current graph for this factory, named exactly ``name``."""
        return popxl_core.graph_input(
            self.shape, self.dtype, name, by_ref=self.by_ref, meta_shape=self.meta_shape or None
        )

    def create_tensor(
        self,
        name: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> Tensor:
        """A main-graph variable initialised with the next value.

        A replica-sharded factory returns the on-chip shard of a replica-sharded variable.
        """
        name = name or self.name
        data: np.ndarray
        if memmap_dir is not None:
            data = self.next_memmap(memmap_dir, name or "variable", empty, read_only_if_exists)
        else:
            data = self.next_data(empty)
        if self.replica_sharded:
            _var, shard = popxl_core.replica_sharded_variable(
                data,
                self.dtype,
                name,
                replica_grouping=self.replica_grouping,
                shard_over=self.shard_over,
            )
            return shard
        return popxl_core.variable(data, self.dtype, name, replica_grouping=self._grouping())

    def create_remote_tensor(
        self,
        buffer,
        entry: int,
        name: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> Tensor:
        """A remote variable stored in ``buffer[entry]`` (replica-sharded if the buffer is);
        with ``memmap_dir`` its host value lives in a file there, as for `create_tensor`."""
        if memmap_dir is not None:
            key = name or self.name or "variable"
            data: np.ndarray = self.next_memmap(memmap_dir, key, empty, read_only_if_exists)
        else:
            data = self.next_data(empty)
        make = (
            popxl_core.remote_replica_sharded_variable
            if buffer.meta_shape
            else popxl_core.remote_variable
        )
        return make(
            data, buffer, entry, self.dtype, name or self.name, replica_grouping=self._grouping()
        )

    def _grouping(self):
        # A single group is the default grouping: leave it implicit, like popxl.
        return self.replica_grouping if self.replica_grouping.num_groups > 1 else None

    def __repr__(self) -> str:
        # The seeds print factories with popxl.addons' default object repr.
        return f"<popxl_addons.variable_factory.VariableFactory object at {hex(id(self))}>"


def _current_ir(name: str | None):
    try:
        return gcg().ir
    except RuntimeError:
        raise RuntimeError(
            f"VariableFactory {name!r} needs an active graph context (its "
            "default replica grouping comes from the current Ir): create it "
            "inside `with ir.main_graph:` or while building a graph."
        ) from None


def _planning_now() -> bool:
    """Whether the factory is made for a planning-mode Ir (`popxl_core.planning`): the current
    graph's Ir, or outside any graph, whether a new Ir would be one."""
    try:
        return gcg().ir.planning
    except RuntimeError:
        return planning_default()


class NamedVariableFactories(DotTree[VariableFactory]):
    """Factories addressed by dotted names; `init` turns them into main-graph variables."""

    def init(
        self,
        prefix: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> NamedTensors:
        """Create a variable per factory in **sorted key order**, named ``prefix.key``."""
        out = {}
        for key, f in sorted(self.to_dict().items(), key=lambda kv: kv[0]):
            name = f"{prefix}.{key}" if prefix else key
            out[key] = f.create_tensor(name, empty, memmap_dir, read_only_if_exists)
        return NamedTensors.from_dict(out)

    def init_remote(
        self,
        buffers: DotTree,
        entry: int = 0,
        prefix: str | None = None,
        empty: bool = False,
        memmap_dir: str | None = None,
        read_only_if_exists: bool = False,
    ) -> NamedTensors:
        """Remote variables, each in the buffer with the same key, in sorted key order (host
        data in ``memmap_dir`` files when given, as `init`)."""
        bufs = buffers.to_dict()
        out = {}
        for key, f in sorted(self.to_dict().items(), key=lambda kv: kv[0]):
            if key not in bufs:
                raise KeyError(
                    f"init_remote: no remote buffer for {key!r} (buffers: {list(bufs)})."
                )
            name = f"{prefix}.{key}" if prefix else key
            out[key] = f.create_remote_tensor(
                bufs[key], entry, name, empty, memmap_dir, read_only_if_exists
            )
        return NamedTensors.from_dict(out)

    def init_zero(self) -> NamedTensors:
        """Zero tensors (``ops.init``) in the **current** graph, in insertion order."""
        return self._init_op("zero")

    def init_undef(self) -> NamedTensors:
        """Undefined tensors (``ops.init``) in the current graph, in insertion order."""
        return self._init_op("undef")

    def _init_op(self, init_type: str) -> NamedTensors:
        from popxl_core import ops

        return NamedTensors.from_dict(
            {
                key: ops.init(f.shape, f.dtype, key, init_type, meta_shape=f.meta_shape or None)
                for key, f in self.to_dict().items()
            }
        )

    @property
    def replica_groupings(self) -> DotTree:
        """The replica grouping of every factory, as a DotTree of the same keys."""
        return DotTree.from_dict({k: f.replica_grouping for k, f in self.to_dict().items()})


def add_variable_input(
    name: str,
    data_iter: DataIter,
    dtype: dtype | None = None,
    by_ref: bool = False,
    replica_grouping=None,
) -> tuple[Tensor, VariableFactory]:
    """A graph input of the current graph named ``name`` and the factory for its variable."""
    factory = VariableFactory(data_iter, dtype, name, by_ref, replica_grouping)
    return factory.create_input(), factory


def add_replica_sharded_variable_input(
    name: str,
    data_iter: DataIter,
    dtype: dtype | None = None,
    by_ref: bool = False,
    replica_grouping=None,
    shard_over: int | None = None,
) -> tuple[Tensor, VariableFactory]:
    """Like `add_variable_input`, but the input is the flat shard ``(ceil(nelms / shard_over),)``.

    ``shard_over`` defaults to the replica grouping's group size.
    """
    rg = replica_grouping or _current_ir(name).replica_grouping()
    factory = VariableFactory(
        data_iter, dtype, name, by_ref, rg, shard_over if shard_over is not None else rg.group_size
    )
    return factory.create_input(), factory
