"""Batch serialisation: a graph repeated ``steps`` times in a loop that loads each step's
inputs (from host streams or remote buffers), calls the graph and stores the chosen outputs.

Remote buffers used here are matrices of ``rows`` x ``steps`` entries: entry
``(row_offset + handle_row) * steps + step``, where ``row_offset`` is the first input of the
serialised graph (so one graph can serve several identical layers, one row each).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import popxl_core
from popxl_core import DeviceToHostStream, HostToDeviceStream, Tensor

from ..graph import GraphWithNamedArgs
from ..named_tensors import NamedTensors
from ._bs_loop import LoopPlan, build_serial_graph, entry_index

__all__ = [
    "BatchSerialResult",
    "RemoteHandle",
    "batch_serial_buffer",
    "batch_serialise",
    "IO_MODES",
    "entry_index",
]

IO_MODES = ("compute", "io", "io_overlapped")


@dataclass
class RemoteHandle:
    """Where a tensor lives in a batch-serial buffer: the buffer and its row.

    ``row_offset`` is an int, or a callable ``(row_offset_tensor) -> int32 tensor`` giving the
    row from the serialised graph's row-offset input, or None: always row 0, whatever the
    row offset the serialised graph is called with.
    """

    buffer: popxl_core.RemoteBuffer
    row_offset: Union[int, None, Callable[[Tensor], Tensor]] = 0
    shard_group: Optional[popxl_core.ReplicaGrouping] = None


RemoteBufferAndOffset = Tuple[object, int]
LoadHandle = Union[HostToDeviceStream, RemoteBufferAndOffset, RemoteHandle]
StoreHandle = Union[RemoteBufferAndOffset, RemoteHandle]


@dataclass
class BatchSerialResult:
    """The serialised graph, where each stored tensor went, and the old -> new input map."""

    graph: GraphWithNamedArgs
    stored_buffers: Dict[Tensor, RemoteHandle] = field(default_factory=dict)
    _remap: Dict[Tensor, Tensor] = field(default_factory=dict)

    def remap_tensors(self, tensors: NamedTensors) -> NamedTensors:
        """``tensors`` (inputs of the original graph) as the serialised graph's inputs."""
        return tensors.remap(self._remap)


def batch_serial_buffer(
    t: Tensor,
    steps: int = 1,
    rows: int = 1,
    shard_group: Optional[popxl_core.ReplicaGrouping] = None,
):
    """A remote buffer of ``steps * rows`` entries shaped like ``t`` (one per row and step).

    With a ``shard_group`` of more than one replica, each entry holds ``t``'s replica shard.
    """
    _check_positive("steps", steps)
    _check_positive("rows", rows)
    if shard_group is not None and shard_group.group_size > 1:
        return popxl_core.replica_sharded_buffer(
            t.shape, t.dtype, entries=steps * rows, shard_over=shard_group.group_size
        )
    return popxl_core.remote_buffer(t.shape, t.dtype, steps * rows)


def batch_serialise(
    graph: GraphWithNamedArgs,
    steps: int,
    load_handles: Mapping[Tensor, LoadHandle],
    store_streams: Mapping[Tensor, DeviceToHostStream],
    store_buffers: Mapping[Tensor, StoreHandle],
    seed_input: Optional[Tensor] = None,
    rows: int = 1,
    io_mode: str = "io",
) -> BatchSerialResult:
    """Repeat ``graph`` ``steps`` times: load inputs, call, store outputs.

    Args:
        graph: the graph to serialise (its named args stay named args).
        steps: loop trip count (e.g. the gradient accumulation factor).
        load_handles: graph input -> host stream, ``(buffer, row)`` or `RemoteHandle`.
        store_streams: graph output -> device-to-host stream.
        store_buffers: graph output (or input: its loaded value) -> ``(buffer, row)`` or
            `RemoteHandle`.
        seed_input: a uint32[2] seed input that gets a fresh seed each step.
        rows: rows of the remote buffers this graph addresses (row_offset is < rows).
        io_mode: "compute" (IO on compute tiles), "io" (IO tiles) or "io_overlapped" (IO
            tiles, the next step's loads issued before this step's compute).

    Returns:
        `BatchSerialResult`; its graph's first input is the int32 row offset; graph inputs
        with no handle (and not the seed) stay inputs, in order; unstored outputs are dropped.
    """
    g = graph.graph
    loads, stores = _checked_handles(
        g, steps, rows, io_mode, load_handles, store_streams, store_buffers, seed_input
    )
    plan = _loop_plan(g, steps, loads, store_streams, stores, seed_input, io_mode)
    new_graph, remap = build_serial_graph(plan)
    args = graph.args.remap(remap)
    return BatchSerialResult(GraphWithNamedArgs(new_graph, args), dict(stores), remap)


def _checked_handles(
    g, steps, rows, io_mode, load_handles, store_streams, store_buffers, seed_input
) -> tuple:
    """`batch_serialise`'s arguments checked; the load and store handles normalised."""
    _check_positive("steps", steps)
    _check_positive("rows", rows)
    _check_io_mode(io_mode, steps)
    loads = {t: _load_handle(g, t, h, steps, rows) for t, h in load_handles.items()}
    stores = {t: _store_handle(g, t, h, steps, rows) for t, h in store_buffers.items()}
    for t, s in store_streams.items():
        _check_output(g, t, "store_streams")
        _check_stream(t, s, DeviceToHostStream, "store_streams")
    if seed_input is not None:
        _check_seed(g, seed_input, loads)
    return loads, stores


def _loop_plan(g, steps, loads, store_streams, stores, seed_input, io_mode) -> LoopPlan:
    return LoopPlan(
        graph=g,
        steps=steps,
        loads=loads,
        store_streams=dict(store_streams),
        store_buffers=stores,
        seed_input=seed_input,
        io=io_mode != "compute",
        overlapped=io_mode == "io_overlapped",
    )


# validation -------------------------------------------------------------------------------
def _check_positive(what: str, n) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"batch_serialise: {what} must be a positive int, got {n!r}.")


def _check_io_mode(io_mode: str, steps: int) -> None:
    if io_mode not in IO_MODES:
        raise ValueError(f"batch_serialise: io_mode must be one of {IO_MODES}, got {io_mode!r}.")
    if io_mode == "io_overlapped" and steps < 2:
        raise ValueError(
            f"batch_serialise: io_mode='io_overlapped' needs steps >= 2 (got {steps}): the "
            "next step's loads overlap this step's compute."
        )


def _check_input(g, t: Tensor, what: str) -> None:
    if not isinstance(t, Tensor) or t not in g.inputs:
        raise ValueError(
            f"batch_serialise: {what} key {getattr(t, 'id', t)!r} is not an input of graph "
            f"{g.id!r}."
        )


def _check_output(g, t: Tensor, what: str) -> None:
    if not isinstance(t, Tensor) or t not in g.outputs:
        raise ValueError(
            f"batch_serialise: {what} key {getattr(t, 'id', t)!r} is not an output of graph "
            f"{g.id!r}."
        )


def _check_stream(t: Tensor, s, kind, what: str) -> None:
    if not isinstance(s, kind):
        raise TypeError(
            f"batch_serialise: {what}[{t.id!r}] must be a {kind.__name__}, got {type(s).__name__}."
        )
    if tuple(s.shape) != tuple(t.shape) or s.dtype is not t.dtype:
        raise ValueError(
            f"batch_serialise: stream {s.tensor_id!r} is {tuple(s.shape)} {s.dtype.name} but "
            f"{t.id!r} is {t.shape} {t.dtype.name}."
        )


def _as_handle(t: Tensor, h, what: str, steps: int = 1, rows: int = 1) -> RemoteHandle:
    """A `RemoteHandle` from ``(buffer, row[, shard_group])``; a bare ReplicaGrouping (stores
    only) asks for a new buffer holding ``t`` sharded over that group."""
    if isinstance(h, RemoteHandle):
        return h
    if isinstance(h, popxl_core.ReplicaGrouping) and what == "store_buffers":
        return RemoteHandle(batch_serial_buffer(t, steps, rows, shard_group=h), 0, h)
    if isinstance(h, (tuple, list)) and len(h) in (2, 3):
        return RemoteHandle(*h)
    raise TypeError(
        f"batch_serialise: {what}[{t.id!r}] must be a (RemoteBuffer, row[, shard_group]) tuple"
        f"{', a ReplicaGrouping' if what == 'store_buffers' else ''} or a RemoteHandle, "
        f"got {h!r}."
    )


def _check_buffer(t: Tensor, h: RemoteHandle, steps: int, rows: int) -> None:
    buf = h.buffer
    shape = tuple(getattr(buf, "meta_shape", None) or buf.tensor_shape)
    if (shape != tuple(t.shape) and tuple(buf.tensor_shape) != tuple(t.shape)) or (
        buf.tensor_dtype is not t.dtype
    ):
        raise ValueError(
            f"batch_serialise: remote buffer {buf.remote_buffer_id} holds "
            f"{tuple(buf.tensor_shape)} {buf.tensor_dtype.name} entries, but {t.id!r} is "
            f"{t.shape} {t.dtype.name}."
        )
    if isinstance(h.row_offset, int):
        if h.row_offset < 0:
            raise ValueError(
                f"batch_serialise: {t.id!r} has a negative row {h.row_offset} in remote "
                f"buffer {buf.remote_buffer_id}."
            )
        # popxl.addons grows the buffer to the rows it is addressed with
        buf.entries = max(buf.entries, (h.row_offset + rows) * steps)
    elif h.row_offset is None:
        buf.entries = max(buf.entries, steps)


def _load_handle(g, t: Tensor, h, steps: int, rows: int):
    _check_input(g, t, "load_handles")
    if isinstance(h, HostToDeviceStream):
        _check_stream(t, h, HostToDeviceStream, "load_handles")
        return h
    handle = _as_handle(t, h, "load_handles", steps, rows)
    _check_buffer(t, handle, steps, rows)
    return handle


def _store_handle(g, t: Tensor, h, steps: int, rows: int) -> RemoteHandle:
    if t not in g.inputs:  # an input can be stored too: its value as loaded
        _check_output(g, t, "store_buffers")
    handle = _as_handle(t, h, "store_buffers", steps, rows)
    _check_buffer(t, handle, steps, rows)
    return handle


def _check_seed(g, seed: Tensor, loads) -> None:
    _check_input(g, seed, "seed_input")
    if seed in loads:
        raise ValueError(f"batch_serialise: seed_input {seed.id!r} also has a load handle.")
    if seed.shape != (2,) or seed.dtype.name != "uint32":
        raise ValueError(
            f"batch_serialise: seed_input {seed.id!r} must be uint32 (2,), got "
            f"{seed.shape} {seed.dtype.name}."
        )


def batch_serialise_fwd_and_grad(
    forward_graph: GraphWithNamedArgs,
    gradient_graph: GraphWithNamedArgs,
    named_inputs_for_grad_graph: NamedTensors,
    steps: int,
    load_handles: Mapping[Tensor, LoadHandle],
    store_streams: Mapping[Tensor, DeviceToHostStream],
    store_buffers: Mapping[Tensor, StoreHandle],
    seed_input: Optional[Tensor] = None,
    rows: int = 1,
    io_mode: str = "io",
) -> Tuple[BatchSerialResult, BatchSerialResult]:
    """Serialise a forward graph and its gradient graph together.

    Each forward value the gradient graph needs is found, in order: in ``store_buffers`` (the
    backward loads it from there); among the remote ``load_handles`` (loaded again); in
    ``named_inputs_for_grad_graph`` (it becomes a named input of the serialised gradient graph,
    with the same key: bind the forward variables to it); otherwise the forward stores it in a
    new `batch_serial_buffer` for the backward to load. Handles and streams are split between
    the two graphs by which graph the tensor belongs to.
    """
    fwd, bwd = forward_graph.graph, gradient_graph.graph
    info = gradient_graph.grad_graph_info
    _check_grad_of(info, fwd, bwd)
    f_loads, b_loads = _split(load_handles, fwd, bwd, "load_handles")
    # a new buffer asked for by a ReplicaGrouping is made once, for both graphs
    f_stores, b_stores = _split(store_buffers, fwd, bwd, "store_buffers")
    f_stores = {t: _new_buffer_if_grouping(t, h, steps, rows) for t, h in f_stores.items()}
    named = {t: k for k, t in named_inputs_for_grad_graph.to_dict().items()}
    b_named = _route_forward_values(info, bwd, f_loads, f_stores, b_loads, named, steps, rows)
    f_streams = {t: s for t, s in store_streams.items() if t.graph is fwd}
    b_streams = {t: s for t, s in store_streams.items() if t.graph is bwd}
    f_res = batch_serialise(
        forward_graph, steps, f_loads, f_streams, f_stores, seed_input, rows, io_mode
    )
    b_args = NamedTensors.from_dict({**gradient_graph.args.to_dict(), **b_named})
    b_graph = GraphWithNamedArgs(bwd, b_args, info)
    b_res = batch_serialise(b_graph, steps, b_loads, b_streams, b_stores, None, rows, io_mode)
    return f_res, b_res


def _split(handles: Mapping, fwd, bwd, what: str) -> Tuple[dict, dict]:
    """``handles`` split into the forward graph's and the backward graph's (every key in
    one of them, checked)."""
    f = {t: h for t, h in handles.items() if t.graph is fwd}
    b = {t: h for t, h in handles.items() if t.graph is bwd}
    _check_split(handles, f, b, fwd, bwd, what)
    return f, b


def _route_forward_values(
    info, bwd, f_loads, f_stores, b_loads, named, steps: int, rows: int
) -> Dict[str, Tensor]:
    """Give each forward value the backward needs a way in (see `batch_serialise_fwd_and_grad`):
    fills ``b_loads`` (and ``f_stores`` with new buffers); returns the backward inputs that
    become named args, by key."""
    b_named: Dict[str, Tensor] = {}
    for i, c in enumerate(info.expected_inputs):
        if c.connection_type.name != "Fwd":
            continue
        b_in, t = bwd.inputs[i], c.fwd_tensor
        if t in f_stores:
            b_loads[b_in] = f_stores[t]
        elif t in f_loads and not isinstance(f_loads[t], HostToDeviceStream):
            b_loads[b_in] = f_loads[t]
        elif t in named:
            b_named[named[t]] = b_in
        else:
            handle = RemoteHandle(batch_serial_buffer(t, steps, rows), 0)
            f_stores[t] = handle
            b_loads[b_in] = handle
    return b_named


def _new_buffer_if_grouping(t: Tensor, h, steps: int, rows: int):
    """A store handle given as a ReplicaGrouping becomes a new buffer sharded over it."""
    if isinstance(h, popxl_core.ReplicaGrouping):
        return _as_handle(t, h, "store_buffers", steps, rows)
    return h


def _check_grad_of(info, fwd, bwd) -> None:
    if info.forward_graph is not fwd or info.graph is not bwd:
        raise ValueError(
            f"batch_serialise_fwd_and_grad: {bwd.id!r} is not the gradient graph of "
            f"{fwd.id!r} (its grad_graph_info is for {info.forward_graph.id!r})."
        )


def _check_split(given, f, b, fwd, bwd, what: str) -> None:
    stray = [t for t in given if t not in f and t not in b]
    if stray:
        raise ValueError(
            f"batch_serialise_fwd_and_grad: {what} key {stray[0].id!r} belongs to neither "
            f"{fwd.id!r} nor {bwd.id!r}."
        )
