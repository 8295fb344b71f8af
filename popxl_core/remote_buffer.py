"""Remote buffers: arrays of ``entries`` tensors in Streaming Memory, one copy per replica."""

from __future__ import annotations

import weakref
from math import ceil, prod
from typing import Optional, Tuple

from . import dtypes
from .context import gcg

__all__ = [
    "RemoteBuffer",
    "RemoteBufferInfo",
    "TensorInfo",
    "remote_buffer",
    "replica_sharded_buffer",
]


class RemoteBuffer:
    """``entries`` slots of shape ``tensor_shape`` and dtype ``tensor_dtype`` in Streaming
    Memory. Every replica has its own copy; ops.remote_load / remote_store move one entry.

    >>> import popxl_core as popxl
    >>> ir = popxl.Ir()
    >>> with ir.main_graph:
    ...     b = popxl.remote_buffer((2, 3), popxl.float32, entries=4)
    >>> b.tensor_shape, b.entries
    ((2, 3), 4)
    """

    def __init__(self, tensor_shape, tensor_dtype: dtypes.dtype, entries: int = 1) -> None:
        ir = gcg().ir
        self._ir = weakref.ref(ir)
        self._id = len(ir._remote_buffers) + 1
        ir._remote_buffers[self._id] = self
        # PopXL's own attribute names, which code written for PopXL reads: the PopART IR
        # the buffer is registered on, and its id
        self._current_ir = ir._pb_ir
        self._remote_buffer_id = self._id
        self._meta_shape: Tuple[int, ...] = ()
        # replica sharding: the shard group size and grouping (None: not sharded)
        self._shard_over: Optional[int] = None
        self._shard_grouping = None
        self.set_remote_buffer_info(tensor_dtype, tensor_shape, entries)

    def set_remote_buffer_info(self, tensor_dtype, tensor_shape, entries: int) -> None:
        if not isinstance(tensor_dtype, dtypes.dtype):
            raise TypeError(
                f"RemoteBuffer: tensor_dtype must be a popxl dtype, got {tensor_dtype!r}."
            )
        shape = tuple(int(d) for d in tensor_shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"RemoteBuffer: tensor_shape {shape} has a negative dimension.")
        self._check_entries(entries)
        self._shape, self._dtype, self._entries = shape, tensor_dtype, int(entries)

    def _check_entries(self, entries) -> None:
        if not isinstance(entries, int) or entries < 1:
            # PopXL's exact wording (tests match on it); the value is in the traceback's line
            raise ValueError("Entries must be a non-zero, positive integer")
        ir = self._ir()
        if ir is not None and ir._session is not None:
            raise RuntimeError(
                f"Remote buffer {self._id} cannot change after a Session owns its Ir."
            )

    @property
    def remote_buffer_id(self) -> int:
        return self._id

    @property
    def remote_buffer_info(self) -> "RemoteBufferInfo":
        """What PopART records for this buffer (``ir._pb_ir.getRemoteBufferInfo(id)``)."""
        return RemoteBufferInfo(TensorInfo(self._dtype, self._shape), self._entries)

    @property
    def tensor_shape(self) -> Tuple[int, ...]:
        return self._shape

    @tensor_shape.setter
    def tensor_shape(self, _) -> None:
        _read_only("tensor_shape")

    @property
    def tensor_dtype(self) -> dtypes.dtype:
        return self._dtype

    @tensor_dtype.setter
    def tensor_dtype(self, _) -> None:
        _read_only("tensor_dtype")

    @property
    def entries(self) -> int:
        return self._entries

    @entries.setter
    def entries(self, value: int) -> None:
        self._check_entries(value)
        self._entries = value

    @property
    def meta_shape(self) -> Tuple[int, ...]:
        """The full (unsharded) shape of a replica-sharded buffer's tensors; () otherwise."""
        return self._meta_shape

    @meta_shape.setter
    def meta_shape(self, shape) -> None:
        self._meta_shape = tuple(shape)

    @property
    def nbytes(self) -> int:
        """Bytes of all entries on one replica."""
        return self._entries * prod(self._shape) * self._dtype.itemsize

    def validate_tensor_matches_buffer(self, t, num_shards: int = 1) -> None:
        """ValueError unless ``t`` fits one entry; with ``num_shards > 1``, unless ``t``'s
        shape is the buffer's ``meta_shape`` (PopXL: ``t`` is then the whole, unsharded tensor).
        """
        if num_shards > 1:
            if tuple(t.shape) != self._meta_shape or t.dtype is not self._dtype:
                raise ValueError(
                    f"Tensor {t.id} does not match buffer.\nExisting remote buffer has "
                    f"meta_shape={self._meta_shape} and dtype={self._dtype.name}.\nThe tensor "
                    f"has shape={tuple(t.shape)}, dtype={t.dtype.name}."
                )
            return
        self.check_spec(t.id, tuple(t.shape), t.dtype)

    def check_spec(
        self, name: str, shape, dtype, num_shards: int = 1, sharded: bool = False
    ) -> None:
        """ValueError unless a tensor ``name`` of ``shape``/``dtype`` fits one entry.
        ``num_shards``: a replica-sharded variable's (a flat shard per replica; with one
        shard, the flat whole fits as well as the shape, as PopXL takes either)."""
        entry = (ceil(prod(shape) / num_shards),) if num_shards > 1 else tuple(shape)
        if num_shards == 1 and sharded and self._shape == (prod(shape),):
            entry = self._shape
        if entry != self._shape or dtype is not self._dtype:
            how = f" (sharded {num_shards} ways: {entry})" if num_shards > 1 else ""
            # PopXL's first sentence (scripts match on it), then what differs
            raise ValueError(
                f"Tensor {name} does not match buffer.\nTensor {name!r} {tuple(shape)} "
                f"{dtype.name}{how} does not fit remote buffer {self._id}, which holds "
                f"{self._shape} {self._dtype.name}."
            )

    def check_offset(self, offset: int) -> None:
        """IndexError unless ``offset`` is an entry of this buffer."""
        if not 0 <= offset < self._entries:
            raise IndexError(
                f"Offset {offset} is out of range for remote buffer {self._id}, which has "
                f"{self._entries} entries."
            )

    def __hash__(self) -> int:
        return hash((id(self._ir()), self._id))

    def __eq__(self, other) -> bool:
        return self is other

    def __repr__(self) -> str:
        return (
            f"RemoteBuffer(id={self._id}, shape={self._shape}, dtype={self._dtype.name}, "
            f"entries={self._entries})"
        )


class TensorInfo:
    """PopART's ``TensorInfo`` as PopXL code reads it off a remote buffer."""

    def __init__(self, dtype: dtypes.dtype, shape: Tuple[int, ...]) -> None:
        self._dtype, self._shape = dtype, tuple(shape)

    def shape(self) -> list:
        return list(self._shape)

    def rank(self) -> int:
        return len(self._shape)

    def nelms(self) -> int:
        return prod(self._shape)

    def nbytes(self) -> int:
        return self.nelms() * self._dtype.itemsize

    def data_type_lcase(self) -> str:
        return self._dtype.name

    def __eq__(self, other) -> bool:
        return isinstance(other, TensorInfo) and (other._dtype, other._shape) == (
            self._dtype,
            self._shape,
        )

    def __repr__(self) -> str:
        return f"TensorInfo({self._dtype.name}, {list(self._shape)})"


class RemoteBufferInfo:
    """PopART's ``RemoteBufferInfo``: the tensor info of one entry and the entry count
    (``repeats``), as ``ir._pb_ir.getRemoteBufferInfo(buffer.remote_buffer_id)`` returns it."""

    def __init__(self, info: TensorInfo, repeats: int) -> None:
        self.TensorInfo = info  # PopART's attribute name
        self.repeats = repeats

    def __repr__(self) -> str:
        return f"RemoteBufferInfo({self.TensorInfo!r}, repeats={self.repeats})"


def _read_only(name: str) -> None:
    # PopXL's properties have no setter: Python's AttributeError, in its 3.10 wording that
    # PopXL's tests match; set_remote_buffer_info changes a buffer
    raise AttributeError(f"can't set attribute '{name}'")


def remote_buffer(tensor_shape, tensor_dtype: dtypes.dtype, entries: int = 1) -> RemoteBuffer:
    """A new `RemoteBuffer` in the current graph's Ir."""
    return RemoteBuffer(tensor_shape, tensor_dtype, entries)


def replica_sharded_buffer(
    shape,
    dtype: dtypes.dtype,
    replica_grouping=None,
    shard_over: Optional[int] = None,
    entries: int = 1,
) -> RemoteBuffer:
    """A buffer of replica-sharded tensors: each replica holds ``ceil(nelms / shard_over)``
    elements of a tensor of full shape ``shape`` (the buffer's ``meta_shape``).

    ``shard_over`` defaults to the group size of ``replica_grouping`` (all replicas when None)
    and must divide it.
    """
    ir = gcg().ir
    group = ir.replication_factor if replica_grouping is None else replica_grouping.group_size
    shard_over = group if shard_over is None else int(shard_over)
    if shard_over < 1 or group % shard_over:
        raise ValueError(
            f"replica_sharded_buffer: shard_over={shard_over} must be a positive divisor of the "
            f"replica group size {group}."
        )
    nelms = prod(tuple(shape))
    buf = RemoteBuffer((ceil(nelms / shard_over),), dtype, entries)
    buf.meta_shape = tuple(shape)
    buf._shard_over = shard_over
    buf._shard_grouping = replica_grouping
    return buf
