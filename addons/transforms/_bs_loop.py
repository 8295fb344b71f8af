"""The loop that `batch_serialise` builds: per step, load inputs, call the graph, store
outputs; with ``overlapped`` the next step's loads are issued before this step's compute."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import popxl_core
from popxl_core import Graph, HostToDeviceStream, Tensor, ops
from popxl_core.dtypes import int32

__all__ = ["LoopPlan", "build_serial_graph", "entry_index"]


@dataclass
class LoopPlan:
    """What to serialise (already validated by `batch_serialise`)."""

    graph: Graph
    steps: int
    loads: Dict[Tensor, Any]  # graph input -> HostToDeviceStream | RemoteHandle
    store_streams: Dict[Tensor, Any]  # graph output -> DeviceToHostStream
    store_buffers: Dict[Tensor, Any]  # graph output -> RemoteHandle
    seed_input: Optional[Tensor]
    io: bool
    overlapped: bool

    @property
    def passthrough(self) -> List[Tensor]:
        """Graph inputs that stay inputs of the serialised graph."""
        return [t for t in self.graph.inputs if t not in self.loads and t is not self.seed_input]


def entry_index(h, row: Tensor, step: Tensor, steps: int) -> Tensor:
    """The flat entry of handle ``h`` at ``step``: ``(row_offset + handle_row) * steps + step``;
    a handle whose row is None reads row 0 whatever the row offset (popxl.addons' rule)."""
    if h.row_offset is None:
        return step
    base = h.row_offset(row) if callable(h.row_offset) else row + h.row_offset
    return base * steps + step


def build_serial_graph(plan: LoopPlan) -> Tuple[Graph, Dict[Tensor, Tensor]]:
    """The serialised graph (inputs: row offset, [seed], passthrough inputs) and the map from
    the original graph's passthrough inputs to its inputs."""
    g = plan.graph
    outer = g.ir.create_empty_graph(f"{g.name}_batch_serial")
    with outer:
        row = popxl_core.graph_input((), int32, "row_offset")
        seed = _mirror(g, plan.seed_input) if plan.seed_input is not None else None
        ins = {t: _mirror(g, t) for t in plan.passthrough}
        with popxl_core.in_sequence(True):
            (_overlapped_loop if plan.overlapped else _simple_loop)(plan, row, seed, ins)
    remap = dict(ins)
    if seed is not None and plan.seed_input is not None:
        remap[plan.seed_input] = seed
    return outer, remap


def _mirror(g: Graph, t: Tensor) -> Tensor:
    """A new input of the current graph like ``t`` (by reference if ``t`` is)."""
    by_ref = t in g.by_ref_inputs
    return popxl_core.graph_input(t.shape, t.dtype, t.name, by_ref=by_ref, meta_shape=t.meta_shape)


def _simple_loop(plan: LoopPlan, row: Tensor, seed: Optional[Tensor], ins: Dict) -> None:
    g = plan.graph
    body = g.ir.create_empty_graph(f"{g.name}_batch_serial_loop")
    with body, popxl_core.in_sequence(True):
        step = popxl_core.graph_input((), int32, "step")
        seed_b = _mirror(g, plan.seed_input) if plan.seed_input is not None else None
        row_b = popxl_core.graph_input((), int32, "row_offset")
        ins_b = {t: _mirror(g, t) for t in ins}
        feeds = {**ins_b, **_emit_loads(plan, row_b, step)}
        seed_next = _feed_seed(plan, feeds, seed_b)
        _emit_step(plan, row_b, step, feeds)
        popxl_core.graph_output(step + 1)
        if seed_next is not None:
            popxl_core.graph_output(seed_next)
    carried = [popxl_core.constant(0, int32, "step_init")] + ([seed] if seed is not None else [])
    ops.repeat(body, plan.steps, *carried, row, *ins.values())


def _overlapped_loop(plan: LoopPlan, row: Tensor, seed: Optional[Tensor], ins: Dict) -> None:
    """Prologue loads step 0; the loop loads step i+1, then computes and stores step i; the
    epilogue computes and stores the last step (whose inputs the loop prefetched)."""
    g = plan.graph
    pre = _emit_loads(plan, row, popxl_core.constant(0, int32, "step_init"))
    body = g.ir.create_empty_graph(f"{g.name}_batch_serial_loop")
    with body, popxl_core.in_sequence(True):
        step = popxl_core.graph_input((), int32, "step")
        pre_b = {
            t: popxl_core.graph_input(v.shape, v.dtype, f"{t.name}_prefetched")
            for t, v in pre.items()
        }
        seed_b = _mirror(g, plan.seed_input) if plan.seed_input is not None else None
        row_b = popxl_core.graph_input((), int32, "row_offset")
        ins_b = {t: _mirror(g, t) for t in ins}
        nxt = _emit_loads(plan, row_b, step + 1)
        feeds = {**ins_b, **pre_b}
        seed_next = _feed_seed(plan, feeds, seed_b)
        _emit_step(plan, row_b, step, feeds)
        for t in [step + 1, *nxt.values()] + ([seed_next] if seed_next is not None else []):
            popxl_core.graph_output(t)
    carried = [popxl_core.constant(0, int32, "step_init"), *pre.values()]
    carried += [seed] if seed is not None else []
    outs = ops.repeat(body, plan.steps - 1, *carried, row, *ins.values())
    last, fetched = outs[0], dict(zip(pre, outs[1 : 1 + len(pre)]))
    feeds = {**ins, **fetched}
    _feed_seed(plan, feeds, outs[-1] if seed is not None else None)
    _emit_step(plan, row, last, feeds)


def _feed_seed(plan: LoopPlan, feeds: Dict, seed: Optional[Tensor]) -> Optional[Tensor]:
    """Give this step a fresh seed; returns the seed carried to the next step."""
    if seed is None:
        return None
    now, nxt = ops.split_random_seed(seed)
    feeds[plan.seed_input] = now
    return nxt


def _emit_loads(plan: LoopPlan, row: Tensor, step: Tensor) -> Dict[Tensor, Tensor]:
    out = {}
    for t, h in plan.loads.items():
        if isinstance(h, HostToDeviceStream):
            out[t] = _io_in(plan.io, partial(ops.host_load, h, t.name))
        else:
            idx = _index(plan, h, row, step)
            x = _io_in(plan.io, partial(ops.remote_load, h.buffer, idx, t.name))
            out[t] = _gather_shards(x, t, h.shard_group) if _sharded(h) else x
    return out


def _sharded(h) -> bool:
    return h.shard_group is not None and h.shard_group.group_size > 1


def _gather_shards(shard: Tensor, t: Tensor, group) -> Tensor:
    """The whole of ``t`` from this replica's shard: all-gather over ``group``, drop the
    padding, restore the shape."""
    flat = ops.collectives.replicated_all_gather(shard, group=group, output_shape="concat")
    return ops.reshape(flat[: t.nelms], t.shape)


def _emit_step(plan: LoopPlan, row: Tensor, step: Tensor, feeds: Mapping[Tensor, Tensor]) -> None:
    g = plan.graph
    stored_inputs = {t: h for t, h in plan.store_buffers.items() if t in g.inputs}
    _emit_stores(plan, row, step, stored_inputs, feeds)  # as loaded, before the call
    outs = ops.call(g, inputs_dict=dict(feeds))
    values = dict(zip(g.outputs, outs))
    for t, s in plan.store_streams.items():
        _io_out(plan.io, values[t], partial(ops.host_store, s))
    stored_outputs = {t: h for t, h in plan.store_buffers.items() if t not in stored_inputs}
    _emit_stores(plan, row, step, stored_outputs, values)


def _emit_stores(plan: LoopPlan, row: Tensor, step: Tensor, handles: Dict, values) -> None:
    for t, h in handles.items():
        idx = _index(plan, h, row, step)
        v = values[t]
        if _sharded(h):  # each replica stores its own shard
            v = ops.collectives.replica_sharded_slice(v, group=h.shard_group)
        _io_out(plan.io, v, partial(ops.remote_store, h.buffer, idx))


def _index(plan: LoopPlan, h, row: Tensor, step: Tensor) -> Tensor:
    idx = entry_index(h, row, step, plan.steps)
    return ops.io_tile_copy(idx) if plan.io else idx


def _io_in(io: bool, load: Callable[[], Tensor]) -> Tensor:
    """Load on the IO tiles and copy to the compute tiles (io modes), or load in place."""
    if not io:
        return load()
    with popxl_core.io_tiles():
        t = load()
    return ops.io_tile_copy(t)


def _io_out(io: bool, t: Tensor, store: Callable[[Tensor], None]) -> None:
    if not io:
        store(t)
        return
    t_io = ops.io_tile_copy(t)
    with popxl_core.io_tiles():
        store(t_io)
