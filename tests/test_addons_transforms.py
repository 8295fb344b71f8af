"""addons.autodiff_with_accumulation and recompute_graph, checked in the simulator."""

import numpy as np

import addons
import popxl_core as popxl
from popxl_core import ops

from .test_addons_models import Linear


def _data(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_accumulation_names_outputs_and_factories():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.zeros((2, 4), np.float32), name="x")
        _, fwd = Linear(3).create_graph(x)
        facts, bwd = addons.autodiff_with_accumulation(
            fwd, fwd.args.tensors, grads_required=[fwd.graph.inputs[0]]
        )
        accum = facts.init()
    assert sorted(facts.keys_flat()) == ["accum.bias", "accum.weight", "mean_accum_counter"]
    assert sorted(bwd.args.keys_flat()) == sorted(facts.keys_flat())
    assert facts.mean_accum_counter.shape == () and facts.mean_accum_counter.by_ref
    assert facts.accum.weight.shape == (4, 3) and facts.accum.weight.by_ref
    # only the gradient of x is still an output
    assert len(bwd.graph.outputs) == 1
    assert [c.fwd_tensor for c in bwd.grad_graph_info.expected_outputs] == [fwd.graph.inputs[0]]
    # tutorials drop the counter with `.tensors[:-1]`: accum.* sort before it
    assert [t.name for t in accum.tensors] == ["accum.bias", "accum.weight", "mean_accum_counter"]
    types = [op.type for op in bwd.graph.ops]
    assert types[-3:] == ["Accumulate", "Accumulate", "Accumulate"]


def test_accumulation_takes_the_running_mean_and_counts():
    x1, x2, dy1, dy2 = _data(0, (2, 4), (2, 4), (2, 3), (2, 3))
    ir = popxl.Ir()
    with ir.main_graph:
        xs = [popxl.variable(x1, name="x1"), popxl.variable(x2, name="x2")]
        dys = [popxl.variable(dy1, name="dy1"), popxl.variable(dy2, name="dy2")]
        facts, fwd = Linear(3).create_graph(xs[0])
        bfacts, bwd = addons.autodiff_with_accumulation(
            fwd, fwd.args.tensors, grads_required=[fwd.graph.inputs[0]]
        )
        variables, accum = facts.init(), bfacts.init()
        dx_streams = []
        for x, dy in zip(xs, dys):
            info = fwd.bind(variables).call_with_info(x)
            (dx,) = bwd.bind(accum).call(dy, args=bwd.grad_graph_info.inputs_dict(info))
            dx_streams.append(popxl.d2h_stream(dx.shape, dx.dtype, "dx"))
            ops.host_store(dx_streams[-1], dx)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        out = session.run()
    w = session.get_tensor_data(variables.weight)
    data = session.get_tensors_data(accum.tensors)
    np.testing.assert_allclose(
        data[accum.accum.weight], (x1.T @ dy1 + x2.T @ dy2) / 2, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        data[accum.accum.bias], (dy1.sum(0) + dy2.sum(0)) / 2, rtol=1e-5, atol=1e-6
    )
    assert float(data[accum.mean_accum_counter]) == 2.0
    np.testing.assert_allclose(out[dx_streams[1]], dy2 @ w.T, rtol=1e-5, atol=1e-6)


def test_recompute_graph_gives_the_same_gradients():
    x_data, dy_data = _data(1, (2, 4), (2, 3))
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(x_data, name="x")
        dy = popxl.variable(dy_data, name="dy")
        facts, fwd = Linear(3).create_graph(x)
        bwd = addons.autodiff(fwd)
        recomp = addons.recompute_graph(bwd)
        variables = facts.init()
        info = fwd.bind(variables).call_with_info(x)
        outs = {}
        for name, g in (("plain", bwd), ("recomp", recomp)):
            site = g.call_with_info(dy, args=g.grad_graph_info.inputs_dict(info))
            grads = g.grad_graph_info.fwd_parent_ins_to_grad_parent_outs(info, site)
            outs[name] = popxl.d2h_stream((4, 3), popxl.float32, name)
            ops.host_store(outs[name], grads[variables.weight])
    assert recomp.graph.name == "Linear_bwd_recomp_subgraph(1)"
    assert len(ir._pb_ir.getAllGraphs()) == 4  # main, fwd, bwd, recomp
    assert [op.type for op in recomp.graph.ops] == ["Call", "Call"]
    session = popxl.Session(ir, "ipu_hw")
    with session:
        result = session.run()
    np.testing.assert_allclose(result[outs["recomp"]], x_data.T @ dy_data, rtol=1e-5)
    np.testing.assert_array_equal(result[outs["recomp"]], result[outs["plain"]])


def test_recompute_of_accumulating_graph_keeps_named_by_ref_inputs():
    x_data, dy_data = _data(2, (2, 4), (2, 3))
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(x_data, name="x")
        dy = popxl.variable(dy_data, name="dy")
        facts, fwd = Linear(3).create_graph(x)
        bfacts, bwd = addons.autodiff_with_accumulation(fwd, fwd.args.tensors)
        recomp = addons.recompute_graph(bwd)
        variables, accum = facts.init(), bfacts.init()
        info = fwd.bind(variables).call_with_info(x)
        recomp.bind(accum).call(dy, args=recomp.grad_graph_info.inputs_dict(info))
    assert sorted(recomp.args.keys_flat()) == sorted(bwd.args.keys_flat())
    session = popxl.Session(ir, "ipu_hw")
    with session:
        session.run()
    np.testing.assert_allclose(
        session.get_tensor_data(accum.accum.weight), x_data.T @ dy_data, rtol=1e-5, atol=1e-6
    )
    assert float(session.get_tensor_data(accum.mean_accum_counter)) == 1.0
