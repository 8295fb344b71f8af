"""popxl.addons behaviours Graphcore's addons tests rely on (issue 9)."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from addons import GraphCache, Module


class _Scaled(Module):
    """A module whose instances are interchangeable when their configs match."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def build(self, x: popxl.Tensor) -> popxl.Tensor:
        return x * self.factor

    def __hash__(self) -> int:
        return hash(self.factor)


def test_graph_cache_keys_modules_on_their_hash():
    ir = popxl.Ir()
    cache = GraphCache()
    with ir.main_graph:
        x = popxl.variable(np.ones(3, np.float32))
        g = cache.create_graph(_Scaled(2.0), x)
        assert cache.create_graph(_Scaled(2.0), x) is g  # another instance, same hash
        assert cache.create_graph(_Scaled(3.0), x) is not g
        # plain functions still match by identity
        f = lambda t: t * 2.0
        assert cache.create_graph(f, x) is cache.create_graph(f, x) is not g


def test_input_and_output_streams_by_name_position_and_iteration():
    from addons import InputStreams, OutputStreams

    ir = popxl.Ir()
    with ir.main_graph:
        ins = InputStreams(x=((2, 3), popxl.float32), n=((4,), popxl.int32))
        outs = OutputStreams(y=((5,), popxl.float16))
    assert [type(s) for s in ins] == [popxl.HostToDeviceStream] * 2
    assert ins[0] is ins.x and ins[1] is ins.n and ins.n.shape == (4,)
    assert ins.x.dtype == popxl.float32 and ins.x.tensor_id.endswith("x")
    assert isinstance(outs.y, popxl.DeviceToHostStream) and list(outs) == [outs.y]


def test_is_subgraph_follows_nested_calls_only_downwards():
    from addons import is_subgraph

    ir = popxl.Ir()
    a, b, c = (ir.create_empty_graph(n) for n in "abc")
    with a:
        popxl.ops.call(b)
    with ir.main_graph:
        popxl.ops.call(a)
        popxl.ops.call(c)
    assert is_subgraph(ir.main_graph, b) and is_subgraph(a, b)
    assert not is_subgraph(b, a) and not is_subgraph(a, c) and not is_subgraph(c, c)


def test_seed_variable_one_seed_per_replica_group():
    from addons import seed_variable

    ir = popxl.Ir(4)
    with ir.main_graph:
        seed_v, seed = seed_variable(7, ir.replica_grouping(group_size=2))
        s = popxl.d2h_stream(seed.shape, seed.dtype)
        popxl.ops.host_store(s, seed)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run()[s]
    want = popxl.create_seeds(7, replicas=2).reshape(2, 2)
    np.testing.assert_array_equal(out, want[[0, 0, 1, 1]])  # replicas 0,1 | 2,3 share a seed
    np.testing.assert_array_equal(session.get_tensor_data(seed_v), want)


def test_run_module_with_torch_mapping_and_string_padding():
    import torch

    from addons.layers import Conv2D, LayerNorm
    from addons.testing_utils import TensorInput, ops_of_type, run_module

    torch.manual_seed(0)
    x = np.random.default_rng(0).random((2, 3, 6, 6), dtype=np.float32)
    conv = torch.nn.Conv2d(3, 4, 3, padding="same")
    (y,) = run_module(
        Conv2D(4, 3, paddings="same_upper"),  # a pad type given as the paddings
        TensorInput(x),
        weights=lambda v: Conv2D.torch_mapping(v, conv),
    )
    ref = conv(torch.from_numpy(x)).detach().numpy()
    # 27-term float32 dot products, bias added after (torch fuses it): a few ulps of |y| <= ~2
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-6)

    norm = torch.nn.LayerNorm([6, 6])  # weights (6, 6) map onto the flattened (36,) variables
    torch.nn.init.normal_(norm.weight)
    flat = x.reshape(6, 36)
    (z,) = run_module(
        LayerNorm(), TensorInput(flat), weights=lambda v: LayerNorm.torch_mapping(v, norm)
    )
    ref = norm(torch.from_numpy(x.reshape(6, 6, 6))).detach().numpy().reshape(6, 36)
    np.testing.assert_allclose(z, ref, rtol=1e-5, atol=2e-6)

    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32))
        _ = (a + a) * a + a
    assert ops_of_type(ir.main_graph, "Add") == 2 and ops_of_type(ir.main_graph, "Mul") == 1


def test_route_tensor_into_graph_through_calls_and_repeat_runs():
    from addons import route_tensor_into_graph

    ir = popxl.Ir()
    main = ir.main_graph
    inner, outer, body = (ir.create_empty_graph(n) for n in ("inner", "outer", "body"))
    with main:
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        w2 = popxl.variable(np.zeros(2, np.float32), name="w2")
        x = popxl.variable(np.array([3.0, 4.0], np.float32), name="x")
    with inner:  # inner(t) = 2 t
        t = popxl.graph_input((2,), popxl.float32, "t")
        popxl.graph_output(t * 2.0)
    with outer:  # outer(u) = inner(inner(u)): two call sites of inner
        u = popxl.graph_input((2,), popxl.float32, "u")
        (v,) = popxl.ops.call(inner, u)
        (v,) = popxl.ops.call(inner, v)
        popxl.graph_output(v)
    with body:  # c -> c + 1, repeated 3 times
        c = popxl.graph_input((2,), popxl.float32, "c")
        popxl.graph_output(c + 1.0)
    with main:
        (y,) = popxl.ops.call(outer, x)
        (z,) = popxl.ops.repeat(body, 3, x)
    # after the call sites exist: inner adds its input to w, body its carried value to w2
    with inner:
        popxl.ops.var_updates.accumulate_(route_tensor_into_graph(w, modified=True), t)
    with body:
        popxl.ops.var_updates.accumulate_(route_tensor_into_graph(w2, modified=True), c)
    # one routed input per graph, shared by all call sites
    assert len(inner.inputs) == 2 and len(outer.inputs) == 2 and len(body.inputs) == 2
    assert route_tensor_into_graph(w, inner, modified=True) is inner.inputs[1]
    with main:
        streams = [popxl.d2h_stream((2,), popxl.float32, n) for n in "yz"]
        for s, r in zip(streams, (y, z)):
            popxl.ops.host_store(s, r)
    with popxl.Session(ir, "ipu_model") as session:
        out = session.run()
        wv, w2v = session.get_tensor_data(w), session.get_tensor_data(w2)
    np.testing.assert_array_equal(out[streams[0]], [12.0, 16.0])  # 4 x, exact
    np.testing.assert_array_equal(out[streams[1]], [6.0, 7.0])  # x + 3
    np.testing.assert_array_equal(wv, [10.0, 14.0])  # w + x + 2 x
    np.testing.assert_array_equal(w2v, [12.0, 15.0])  # x + (x + 1) + (x + 2)


def test_route_tensor_into_graph_needs_a_call_path():
    from addons import route_tensor_into_graph

    ir = popxl.Ir()
    sg = ir.create_empty_graph("lonely")
    with ir.main_graph:
        a = popxl.variable(1.0, name="a")
    with pytest.raises(
        ValueError, match="is not in the graph 'lonely.*not in a known parent graph"
    ):
        route_tensor_into_graph(a, sg)
