"""addons.remote and addons.rts on the simulator's Streaming Memory and collectives."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.remote import load_remote_graph, named_variable_buffers, store_remote_graph
from addons.rts import (
    all_gather_replica_sharded_graph,
    reduce_replica_sharded_graph,
    replica_sharded_spec,
)
from popxl_core import ops


class AddTo(addons.Module):
    """w += x, in place (w is a by-ref variable input)."""

    def build(self, x: popxl.Tensor) -> None:
        w = self.add_variable_input(
            "w", partial(np.random.normal, 0, 1, x.shape), x.dtype, by_ref=True
        )
        ops.scaled_add_(w, x)


def test_load_compute_store_per_entry():
    """Two layers share one graph and one buffer (entries 0 and 1); each is loaded, updated
    and stored back; the variables read back are the old values plus the input."""
    np.random.seed(0)
    x = np.arange(5, dtype=np.float32)
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        x_t = popxl.constant(x, name="x")
        facts, graph = AddTo().create_graph(x_t)
        buffers = named_variable_buffers(facts, 2)
        load, names = load_remote_graph(buffers)
        store = store_remote_graph(buffers)
        layers = [facts.init_remote(buffers, i, f"layer{i}") for i in range(2)]
        for i in range(2):
            loaded = addons.NamedTensors.pack(names, load.call(i))
            graph.bind(loaded).call(x_t)
            store.bind(loaded).call(i)
    assert names == ["w"] and load.graph.inputs[0].name == "load_index"
    session = popxl.Session(ir, "ipu_hw")
    before = {v: d.copy() for v, d in session.get_tensors_data([t.w for t in layers]).items()}
    with session:
        session.run()
    after = session.get_tensors_data([t.w for t in layers])
    for v in before:
        np.testing.assert_array_equal(after[v], before[v] + x)  # one float32 add: exact


def test_replica_sharded_spec_pads_to_ceil():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        t = popxl.variable(np.zeros((5,), np.float32))
        small = popxl.variable(np.zeros((3,), np.float32))
        spec = replica_sharded_spec(t)
        assert spec.shape == (3,) and spec.meta_shape == (5,)
        assert replica_sharded_spec(small, threshold=4).shape == (3,)  # below: not sharded
        single = replica_sharded_spec(t, shard_over=ir.replica_grouping(group_size=1))
        assert single.shape == (5,) and not single.meta_shape


def test_rts_reduce_update_gather_equals_the_unsharded_update():
    """Sharded over 2 replicas (5 elements: shards of 3, one padded): reduce-scatter the
    replicas' gradients (mean), update each shard, all-gather; every replica ends with
    w - lr * mean(g), as the unsharded update computes it."""
    replicas, lr = 2, 0.5
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(5).astype(np.float32)
    g = rng.standard_normal((replicas, 5)).astype(np.float32)
    ir = popxl.Ir(replication=replicas)
    with ir.main_graph, popxl.in_sequence(True):
        g_stream = popxl.h2d_stream((5,), popxl.float32, "g")
        grads = addons.NamedTensors(w=ops.host_load(g_stream))
        reduce_g, names = reduce_replica_sharded_graph(grads, "mean")
        (g_shard,) = reduce_g.bind(grads).call()
        _, w_shard = popxl.replica_sharded_variable(w0, popxl.float32, "w")
        ops.scaled_add_(w_shard, g_shard, b=-lr)
        gather, _ = all_gather_replica_sharded_graph(addons.NamedTensors(w=w_shard))
        (w_full,) = gather.bind(addons.NamedTensors(w=w_shard)).call()
        out = popxl.d2h_stream(w_full.shape, w_full.dtype, "w_full")
        ops.host_store(out, w_full)
    assert names == ["w"] and g_shard.shape == (3,) and w_full.shape == (5,)
    with popxl.Session(ir, "ipu_hw") as session:
        got = session.run({g_stream: g})[out]
    want = w0 - lr * g.mean(axis=0)
    for r in range(replicas):  # float32 mean of 2 and one multiply-add: within 1 ulp
        np.testing.assert_allclose(got[r], want, rtol=1.2e-7, atol=0)


def test_named_variable_buffers_shard_by_threshold_and_by_mapping():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        facts = addons.NamedVariableFactories(
            big=addons.VariableFactory(partial(np.zeros, (4, 3)), popxl.float32),
            small=addons.VariableFactory(partial(np.zeros, (3,)), popxl.float32),
        )
        by_threshold = named_variable_buffers(facts, 2, sharded_threshold=10)
        by_map = named_variable_buffers(facts, shard_over_dict={"small": 2})
    assert by_threshold.big.tensor_shape == (6,) and by_threshold.big.meta_shape == (4, 3)
    assert by_threshold.small.tensor_shape == (3,) and by_threshold.big.entries == 2
    assert by_map.small.tensor_shape == (2,) and by_map.big.tensor_shape == (4, 3)
    with pytest.raises(TypeError, match="shard_over_dict must be"):
        with ir.main_graph:
            named_variable_buffers(facts, shard_over_dict="all")


STEPS, MICRO = 3, 2


def _fwd_bwd_graphs(x_spec):
    facts, fwd = addons.layers.Linear(4).create_graph(x_spec)
    grad_facts, bwd = addons.autodiff_with_accumulation(
        fwd, fwd.args.tensors, grads_required=fwd.graph.inputs[:1]
    )
    return facts, fwd, grad_facts, bwd


def _plain_fwd_bwd(xs, dys):
    """The Linear forward and backward called once per micro-batch, in a Python loop."""
    np.random.seed(2)
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        x_stream = popxl.h2d_stream(xs.shape[1:], popxl.float32, "x")
        dx_stream = popxl.d2h_stream(xs.shape[1:], popxl.float32, "dx")
        facts, fwd, grad_facts, bwd = _fwd_bwd_graphs(x_stream.spec)
        variables, accum = facts.init(), grad_facts.init()
        for dy in dys:
            info = fwd.bind(variables).call_with_info(ops.host_load(x_stream))
            args = bwd.grad_graph_info.inputs_dict(info)
            (dx,) = bwd.bind(accum).call(popxl.constant(dy), args=args)
            ops.host_store(dx_stream, dx)
    ir.num_host_transfers = STEPS
    return _run(ir, x_stream, xs, dx_stream, accum)


def _serial_fwd_bwd(xs, dys, io_mode):
    """The same, batch-serialised: dy read from a remote buffer, the backward's activations
    stored and loaded by the transform."""
    np.random.seed(2)
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        x_stream = popxl.h2d_stream(xs.shape[1:], popxl.float32, "x")
        dx_stream = popxl.d2h_stream(xs.shape[1:], popxl.float32, "dx")
        facts, fwd, grad_facts, bwd = _fwd_bwd_graphs(x_stream.spec)
        dy_in = bwd.graph.inputs[0]
        dy_buffer = addons.batch_serial_buffer(dy_in, steps=STEPS)
        fwd_bs, bwd_bs = addons.batch_serialise_fwd_and_grad(
            fwd,
            bwd,
            fwd.args,
            STEPS,
            load_handles={fwd.graph.inputs[0]: x_stream, dy_in: (dy_buffer, 0)},
            store_streams={bwd.graph.outputs[0]: dx_stream},
            store_buffers={},
            io_mode=io_mode,
        )
        for i, dy in enumerate(dys):
            ops.remote_store(dy_buffer, i, popxl.constant(dy))
        variables, accum = facts.init(), grad_facts.init()
        fwd_bs.graph.bind(variables).call(0)
        both = accum.copy()
        both.update(variables.copy())
        bwd_bs.graph.bind(both).call(0)
    assert fwd.graph.inputs[0] in fwd_bs.stored_buffers  # x: stored for the backward
    ir.num_host_transfers = STEPS
    return _run(ir, x_stream, xs, dx_stream, accum)


def _run(ir, x_stream, xs, dx_stream, accum):
    with popxl.Session(ir, "ipu_hw") as session:
        dx = session.run({x_stream: xs})[dx_stream]
    data = session.get_tensors_data(accum.tensors)
    return dx, [data[t] for t in accum.tensors]


@pytest.mark.parametrize("io_mode", ["compute", "io", "io_overlapped"])
def test_serialised_forward_and_backward_equal_the_graphs_called_step_by_step(io_mode):
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((STEPS, MICRO, 3)).astype(np.float32)
    dys = rng.standard_normal((STEPS, MICRO, 4)).astype(np.float32)
    dx_plain, acc_plain = _plain_fwd_bwd(xs, dys)
    dx_bs, acc_bs = _serial_fwd_bwd(xs, dys, io_mode)
    # the same kernels on the same values in the same order: bitwise equal
    np.testing.assert_array_equal(dx_bs, dx_plain)
    for a, b in zip(acc_bs, acc_plain):
        np.testing.assert_array_equal(a, b)
    assert np.abs(acc_plain[1]).max() > 0.1  # accum.weight really accumulated


def test_remote_handle_rows_and_entry_growth():
    """(buffer, row) handles address entry (row_offset + row) * steps + step; a buffer too
    small for the rows used grows, as popxl.addons does."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence(True):
        x_stream = popxl.h2d_stream((2,), popxl.float32, "x")
        out = popxl.d2h_stream((2,), popxl.float32, "out")
        g = addons.GraphWithNamedArgs(ir.create_graph(lambda a: a * 3.0, x_stream.spec))
        buf = addons.batch_serial_buffer(g.graph.outputs[0], steps=STEPS)  # one row
        bs = addons.batch_serialise(
            g, STEPS, {g.graph.inputs[0]: x_stream}, {}, {g.graph.outputs[0]: (buf, 1)}, rows=1
        )
        assert buf.entries == 2 * STEPS
        bs.graph.call(0)
        for i in range(STEPS):  # row 1: entries STEPS .. 2 * STEPS - 1
            ops.host_store(out, ops.remote_load(buf, STEPS + i))
    ir.num_host_transfers = STEPS
    xs = np.arange(STEPS * 2, dtype=np.float32).reshape(STEPS, 2)
    with popxl.Session(ir, "ipu_hw") as session:
        got = session.run({x_stream: xs})[out]
    np.testing.assert_array_equal(got, xs * 3.0)
