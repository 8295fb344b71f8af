"""Streaming Memory IO: remote_load, remote_load_ and remote_store of one remote buffer entry.

As in PopXL there is no data dependency between a store and a later load of the same entry:
order them with ``popxl.in_sequence()``. Offsets are python ints (checked against the buffer's
entry count when the op is built) or integer scalar tensors (checked when the op runs).
"""

from __future__ import annotations

from typing import Optional, Union

from .. import dtypes
from ..context import in_sequence
from ..remote_buffer import RemoteBuffer, remote_buffer
from ..tensor import Tensor, TensorSpec, constant
from ._utils import rand
from .registry import Cost, OpDef, Sample, create_op, register

__all__ = ["remote_load", "remote_load_", "remote_store"]

Offset = Union[int, Tensor]


def _cost(ins, outs, attrs) -> Cost:
    return Cost(0, sum(s.nbytes for s in (*ins, *outs)))


def _load_infer(ins, buffer):
    return [TensorSpec(buffer.tensor_shape, buffer.tensor_dtype, buffer.meta_shape)]


def _emit_load(op, em) -> None:
    b = em.bind_global("rb", op.attrs["buffer"])
    # the entry itself where no one can tell (sim/remote_views.py), else a copy of it
    fn = "remote_entry" if op in getattr(em.program, "view_loads", ()) else "remote_load"
    em.emit(f"{em.name(op.outputs[0])} = RT.{fn}({b}, {em.name(op.inputs[0])})")


def _emit_load_inplace(op, em) -> None:
    b = em.bind_global("rb", op.attrs["buffer"])
    t, off = em.name(op.inputs[0]), em.name(op.inputs[1])
    em.emit(f"{em.name(op.outputs[0])} = {t}.copy_(RT.remote_entry({b}, {off}))")


def _emit_store(op, em) -> None:
    b = em.bind_global("rb", op.attrs["buffer"])
    t, off = em.name(op.inputs[0]), em.name(op.inputs[1])
    em.emit(f"RT.remote_store({b}, {off}, {t})")


def _round_trip(x: Tensor, inplace: bool) -> Tensor:
    """Store ``x`` in a new two-entry buffer and load it back (op-table sample)."""
    buf = remote_buffer(x.shape, x.dtype, entries=2)
    with in_sequence(True):
        remote_store(buf, 1, x)
        if inplace:
            return remote_load_(buf, constant(1, dtypes.int32), x * 0)
        return remote_load(buf, 1)


def _samples(inplace: bool):
    return lambda: [
        Sample([rand(2, 3)], lambda x: _round_trip(x, inplace), lambda x: x * 1, grad=False)
    ]


REMOTE_LOAD = register(
    OpDef(
        "RemoteLoad",
        _load_infer,
        emit=_emit_load,
        cost=_cost,
        out_name="remoteload",
        samples=_samples(False),
    )
)
REMOTE_LOAD_INPLACE = register(
    OpDef(
        "RemoteLoadInplace",
        lambda ins, buffer: [ins[0]],
        emit=_emit_load_inplace,
        cost=_cost,
        inplace=(0,),
        out_name="remoteload",
        samples=_samples(True),
    )
)
REMOTE_STORE = register(
    OpDef(
        "RemoteStore",
        lambda ins, buffer: [],
        emit=_emit_store,
        cost=_cost,
        side_effect=True,
        samples=_samples(False),
    )
)


def _offset(buffer: RemoteBuffer, offset: Offset, who: str) -> Tensor:
    if not isinstance(buffer, RemoteBuffer):
        raise TypeError(f"{who}: expected a popxl.RemoteBuffer, got {type(buffer).__name__}.")
    if isinstance(offset, Tensor):
        if offset.dtype.is_floating_point or offset.nelms != 1:
            raise TypeError(
                f"{who}: offset {offset.id!r} must be an integer scalar tensor, got "
                f"{offset.shape} {offset.dtype.name}."
            )
        return offset
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"{who}: offset must be an int or a Tensor, got {offset!r}.")
    buffer.check_offset(offset)
    return constant(offset, dtypes.int32, "offset")


def remote_load(remote_buffer: RemoteBuffer, offset: Offset, name: Optional[str] = None) -> Tensor:
    """Load entry ``offset`` of ``remote_buffer`` (this replica's copy) into a new tensor."""
    off = _offset(remote_buffer, offset, "remote_load")
    names = [name] if name else None
    attrs = {"buffer": remote_buffer}
    return create_op(REMOTE_LOAD, [off], attrs, out_names=names, check_placement=False)[0]


def remote_load_(remote_buffer: RemoteBuffer, offset: Offset, t: Tensor) -> Tensor:
    """Load entry ``offset`` of ``remote_buffer`` into ``t`` in place; returns ``t``."""
    off = _offset(remote_buffer, offset, "remote_load_")
    remote_buffer.validate_tensor_matches_buffer(t)
    attrs = {"buffer": remote_buffer}
    return create_op(REMOTE_LOAD_INPLACE, [t, off], attrs, check_placement=False)[0]


def remote_store(remote_buffer: RemoteBuffer, offset: Offset, t: Tensor) -> None:
    """Store ``t`` in entry ``offset`` of ``remote_buffer`` (this replica's copy)."""
    off = _offset(remote_buffer, offset, "remote_store")
    remote_buffer.validate_tensor_matches_buffer(t)
    create_op(REMOTE_STORE, [t, off], {"buffer": remote_buffer}, check_placement=False)
