"""merge_exchange / io_tile_exchange (same results, fewer syncs) and the Streaming Memory plan
(remote variables off chip, RTS shards of ceil(n / R) elements on chip)."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.ops import collectives as coll


def _program(merge, io=False):
    ir = popxl.Ir()
    ir._pb_ir.getSessionOptions().numIOTiles = 32 if io else 0
    with ir.main_graph, popxl.in_sequence():
        bufs = [popxl.remote_buffer((4,), popxl.float32, entries=2) for _ in range(3)]
        for i, b in enumerate(bufs):
            ops.remote_store(b, 0, popxl.constant(np.full(4, i + 1.0, np.float32)))
        ctx = transforms.io_tile_exchange() if io else transforms.merge_exchange()
        with ctx if merge else popxl.in_sequence(True):
            loaded = [ops.remote_load(b, 0) for b in bufs]
            for b, t in zip(bufs, loaded):
                ops.remote_store(b, 1, t)
        if io:
            loaded = [ops.io_tile_copy(t) for t in loaded]
        total = ops.remote_load(bufs[0], 1) + loaded[1] + loaded[2]
        s = popxl.d2h_stream(total.shape, total.dtype, "total")
        ops.host_store(s, total)
    sess = popxl.Session(ir, "ipu_hw")
    with sess:
        return sess.run()[s], sess.plan, loaded


@pytest.mark.parametrize("io", [False, True])
def test_merged_exchange_same_result_fewer_syncs(io):
    plain, plain_plan, _ = _program(False)
    merged, merged_plan, loaded = _program(True, io)
    np.testing.assert_array_equal(merged, plain)
    np.testing.assert_array_equal(plain, np.full(4, 6.0))
    assert merged_plan.work.cycles.sync < plain_plan.work.cycles.sync
    if io:
        assert all(t.producer.inputs[0].tile_set == "io" for t in loaded)


def test_io_tile_exchange_verifies_overlap():
    ir = popxl.Ir()
    with ir.main_graph:
        b = popxl.remote_buffer((2,), popxl.float32)
        with pytest.raises(RuntimeError, match="only host and remote transfers"):
            with transforms.io_tile_exchange():
                ops.remote_load(b, 0) + 1.0
        with transforms.io_tile_exchange(verify_overlap=False):
            ops.remote_load(b, 0) + 1.0


def test_load_and_store_of_one_entry_in_one_exchange_is_an_error():
    ir = popxl.Ir()
    with ir.main_graph:
        b = popxl.remote_buffer((2,), popxl.float32, entries=2)
        with pytest.raises(ValueError, match="buffer 1 entry 1 is both loaded"):
            with transforms.merge_exchange():
                x = ops.remote_load(b, 1)
                ops.remote_store(b, 1, x)


def test_streaming_memory_plan_and_rts_shards_on_chip():
    ir = popxl.Ir(4)
    with ir.main_graph, popxl.in_sequence():
        big = popxl.remote_buffer((100, 10), popxl.float32, entries=3)
        popxl.remote_variable(np.ones((100, 10), np.float32), big, 1, name="remote")
        x = ops.remote_load(big, 1)
        _, shard = popxl.replica_sharded_variable(np.ones(1001, np.float32), name="rts")
        on_chip = popxl.variable(np.ones(10, np.float32), name="on_chip")
        y = coll.replicated_all_gather(shard)
        s = popxl.d2h_stream((), popxl.float32, "s")
        ops.host_store(s, ops.sum(x) + ops.sum(y) + ops.sum(on_chip))
    sess = popxl.Session(ir, "ipu_hw")
    plan = sess.plan
    rts_bytes = 251 * 4  # ceil(1001 / 4) elements per replica
    assert plan.streaming_memory_bytes == 3 * 1000 * 4 + rts_bytes
    assert [(b.shape, b.entries) for b in plan.remote_buffers] == [((100, 10), 3), ((251,), 1)]
    # on chip: the shard and the plain variable, not the remote variable
    assert plan.memory[0].variables == rts_bytes + 40
    with sess:
        out = sess.run()[s]
    np.testing.assert_array_equal(out, np.full(4, 1000.0 + 1001.0 + 10.0))


def test_local_slice_costs_no_link_traffic():
    ir = popxl.Ir(4)
    with ir.main_graph:
        x = popxl.variable(np.ones(1024, np.float32), name="x")
        coll.replica_sharded_slice(x)
        coll.replicated_reduce_scatter(x, "add")
    sess = popxl.Session(ir, "ipu_hw")
    work = [sess.plan.model.op_work(op) for op in ir.main_graph.ops]
    links = [w.link_bytes for w in work]
    assert links == [0, 3 * 1024]  # the ring sends (R-1)/R of the tensor; a local slice none


def test_ring_traffic_counts_the_group_only():
    ir = popxl.Ir(4)
    with ir.main_graph:
        x = popxl.variable(np.ones(1024, np.float32), name="x")
        coll.replicated_all_reduce(x, "add")
        coll.replicated_all_reduce(x, "add", ir.replica_grouping(1, 2))
    sess = popxl.Session(ir, "ipu_hw")
    links = [sess.plan.model.op_work(op).link_bytes for op in ir.main_graph.ops]
    assert links == [2 * 3 * 1024, 2 * 2048]  # 2 x (n-1)/n x 4096 bytes, n = 4 then 2
