"""PopXL / popxl.addons behaviour that Graphcore's PopXL applications rely on (issue 36): each
test failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import addons
import popxl_core as popxl
from addons.named_replica_grouping import NamedReplicaGrouping
from popxl_core import ops
from popxl_core.sim.checks import TransferCountWarning

F32 = np.float32


def _io_ir(nht: int, loads: int):
    """Load 'x' and store x + 1 to 'y' ``loads`` times a run (a repeat when more than one)."""
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        xs = popxl.h2d_stream((2,), popxl.float32, "x")
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        g = ir.create_graph(lambda: ops.host_store(ys, ops.host_load(xs) + 1.0))
        ops.repeat(g, loads)
    return ir, xs, ys


def test_fewer_transfers_than_num_host_transfers_warn_and_use_the_first_batches():
    # BERT's SQuAD inference: num_host_transfers = device iterations, one load a run
    ir, xs, ys = _io_ir(nht=3, loads=1)
    with pytest.warns(TransferCountWarning) as got:
        session = popxl.Session(ir, "ipu_hw")
    text = [str(w.message) for w in got]
    assert len(text) == 2, text  # one per stream, naming it and both counts
    assert "'x' is loaded 1 time" in text[0] and "num_host_transfers=3" in text[0]
    assert "'y' is stored 1 time" in text[1] and "rest left zero" in text[1]
    x = np.arange(6, dtype=F32).reshape(3, 2)
    with session:
        y = session.run({xs: x})[ys]
    np.testing.assert_array_equal(y, [x[0] + 1, [0, 0], [0, 0]])


def test_more_transfers_than_num_host_transfers_wrap_around():
    ir, xs, ys = _io_ir(nht=2, loads=3)
    with pytest.warns(TransferCountWarning, match="'x' is loaded 3 times.*wraps around"):
        session = popxl.Session(ir, "ipu_hw")
    x = np.arange(4, dtype=F32).reshape(2, 2)
    with session:
        y = session.run({xs: x})[ys]
    np.testing.assert_array_equal(y, x + 1)  # the third store wrote batch 0 again: x[0] + 1


@pytest.mark.parametrize("label_shape", [(6, 1), (2, 3)])
def test_nll_loss_with_softmax_grad_takes_one_label_per_row(label_shape):
    # BERT pretraining: labels (N, 1) (and (B, S) for B * S rows) against probabilities (N, C)
    rng = np.random.default_rng(0)
    logits = rng.uniform(-2, 2, (6, 5)).astype(F32)
    labels = rng.integers(0, 5, label_shape).astype(np.int32)
    ir = popxl.Ir()
    with ir.main_graph:
        probs = ops.softmax(popxl.constant(logits), -1)
        loss, dx = ops.nll_loss_with_softmax_grad(probs, popxl.constant(labels), reduction="none")
        outs = [popxl.d2h_stream(t.shape, t.dtype) for t in (loss, dx)]
        for s, t in zip(outs, (loss, dx)):
            ops.host_store(s, t)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
    x = torch.tensor(logits, requires_grad=True)
    want = F.cross_entropy(x, torch.tensor(labels.reshape(-1)).long(), reduction="none")
    (want_dx,) = torch.autograd.grad(want, x, torch.ones(6))
    assert res[outs[0]].shape == label_shape
    np.testing.assert_allclose(res[outs[0]].reshape(-1), want.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(res[outs[1]], want_dx.numpy(), atol=1e-7)


def test_nll_loss_with_softmax_grad_still_refuses_a_label_count_that_does_not_match():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="labels shape"):
        probs = popxl.constant(np.full((6, 5), 0.2, F32))
        ops.nll_loss_with_softmax_grad(probs, popxl.constant(np.zeros((4,), np.int32)))


def test_grouped_scalar_variable_is_written_per_group():
    # BLOOM's embedding test writes a scalar variable with one value per replica group
    ir = popxl.Ir(2)
    with ir.main_graph:
        rg = ir.replica_grouping(1, 1)
        v = popxl.variable(np.array([3, 5], np.int32), popxl.int32, "v", replica_grouping=rg)
        ys = popxl.d2h_stream((), popxl.int32, "y")
        ops.host_store(ys, v + 1)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.write_variables_data({v: np.array([7, 9], np.int32)})
        np.testing.assert_array_equal(sess.run()[ys], [8, 10])


def test_filter_keys_keeps_several_keys_of_one_sub_tree():
    # gpt3_175B's phased pretraining filters "head.ln_f.weight" and "head.ln_f.bias"
    tree = addons.NamedTensors.from_dict({"head.ln_f.weight": 1, "head.ln_f.bias": 2, "x": 3})
    kept = tree.filter_keys(["head.ln_f.weight", "head.ln_f.bias"])
    assert kept.to_dict() == {"head.ln_f.weight": 1, "head.ln_f.bias": 2}


def test_const_rg_of_a_grouping_without_a_constant_stride():
    ir = popxl.Ir(8)
    rg = ir.replica_grouping(2, 2)
    assert rg.const_rg is rg
    odd = popxl.ReplicaGrouping._from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
    assert odd.const_rg.assignment == [0, 0, 1, 1, 2, 2, 3, 3]
    assert not odd.is_const and odd.const_rg.is_const
    assert odd.to_device_map == [0, 1, 0, 1] and odd.to_host_map == [0, 1]


def test_remote_handle_without_a_row_reads_row_zero():
    # T5's batch-serialised decoder loads its mask with RemoteHandle(buffer, None)
    from addons.transforms.batch_serialisation import (
        RemoteHandle,
        batch_serial_buffer,
        batch_serialise,
    )

    steps = 2
    ir = popxl.Ir()
    ir.num_host_transfers = steps
    with ir.main_graph:
        graph = ir.create_graph(lambda t: t * 2.0, popxl.TensorSpec((2,), popxl.float32))
        gwa = addons.GraphWithNamedArgs(graph)
        buf = batch_serial_buffer(graph.inputs[0], steps=steps, rows=3)
        ys = popxl.d2h_stream((2,), popxl.float32, "y")
        res = batch_serialise(
            gwa,
            steps,
            {graph.inputs[0]: RemoteHandle(buf, None)},
            {graph.outputs[0]: ys},
            {},
            rows=3,
        )
        data = np.arange(2 * steps * 3, dtype=F32).reshape(steps * 3, 2)
        for i, row in enumerate(data):
            ops.remote_store(buf, i, popxl.constant(row))
        ops.call(res.graph.graph, popxl.constant(2, popxl.int32))  # row offset 2: ignored
    with popxl.Session(ir, "ipu_hw") as sess:
        y = sess.run()[ys]
    assert buf.entries >= steps
    np.testing.assert_array_equal(y, data[:steps] * 2)


def test_decompose_sum_and_use_fc_pass_paths():
    import popxl_core.compat as compat

    compat.install()
    try:
        import popxl
        from popxl_addons.transforms.use_fc_pass import disable_fc_pass

        ir = popxl.Ir()
        assert popxl.transforms.decompose_sum(ir.main_graph) is ir.main_graph
        assert disable_fc_pass is addons.disable_fc_pass
    finally:
        compat.uninstall()


def test_io_tiles_subgraph_adds_a_constant_to_its_graph_input():
    # BERT pretraining: @popxl.io_tiles() on a graph function whose input (made before the
    # function runs, on the compute tiles) meets a constant made on the IO tiles
    ir = popxl.Ir()
    with ir.main_graph:

        @popxl.io_tiles()
        def bump(i):
            return i + 1

        g = ir.create_graph(bump, popxl.constant(0))
        (out,) = ops.call(g, popxl.constant(4))
        ys = popxl.d2h_stream((), popxl.int32, "y")
        ops.host_store(ys, out)
    with popxl.Session(ir, "ipu_hw") as sess:
        assert sess.run()[ys] == 5


def test_tensors_made_by_ops_on_different_tile_sets_still_refused():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="different IPUs or tile sets"):
        a = popxl.constant(1.0) + 0.0
        with popxl.io_tiles():
            b = popxl.constant(2.0) + 0.0
        ops.add(a, b)


def test_accumulators_are_grouped_as_their_variables():
    # gpt3's phased training passes the forward factories' groupings, keyed by the arg name
    ir = popxl.Ir(4)
    with ir.main_graph:

        class Scale(addons.Module):
            def build(self, x):
                w = self.add_variable_input("w", lambda: np.ones(2, F32), x.dtype)
                return x * w

        facts, graph = Scale().create_graph(popxl.TensorSpec((2,), popxl.float32))
        rg = ir.replica_grouping(2, 2)
        groupings = NamedReplicaGrouping.from_dict({"w": rg})
        accum_facts, _ = addons.autodiff_with_accumulation(
            graph, [graph.args.w], replica_groupings=groupings
        )
    assert accum_facts.accum.w.replica_grouping == rg
    assert accum_facts.mean_accum_counter.replica_grouping != rg


def test_adam_state_of_a_replica_sharded_variable_is_sharded_the_same_way():
    # the apps' phased optimizers take replica_sharded_spec(var, group): popxl.addons' Adam
    # then makes its moments replica-sharded over that group, their factories whole
    from addons.optimizers.adam import AdamOptimizerStep
    from addons.rts import replica_sharded_spec

    ir = popxl.Ir(2)
    with ir.main_graph:
        var = popxl.variable(np.zeros((4, 2), F32), name="w")
        spec = replica_sharded_spec(var, ir.replica_grouping(1, 2))
        facts, graph = AdamOptimizerStep().create_graph(spec, spec, lr=0.1)
    first = facts.first_order
    assert first.replica_sharded and tuple(first.meta_shape) == (4, 2)
    assert graph.args.first_order.shape == (4,) and graph.args.first_order.meta_shape == (4, 2)


def test_in_place_flatten_of_uint32_positions():
    # BERT's MLM head: uint32 masked positions offset per sample, then ``flatten_()``
    rng = np.random.default_rng(4)
    pos = rng.integers(0, 8, (2, 5)).astype(np.uint32)
    x = rng.standard_normal((2, 8, 3)).astype(F32)
    ir = popxl.Ir()
    with ir.main_graph:
        m = popxl.constant(pos, popxl.uint32) + np.array([[0], [8]], np.uint32)
        y = ops.gather(popxl.constant(x).reshape((-1, 3)), m.flatten_(), axis=0)
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    with popxl.Session(ir, "ipu_hw") as sess:
        got = sess.run()[ys]
    np.testing.assert_array_equal(got, x.reshape(-1, 3)[(pos + [[0], [8]]).reshape(-1)])
