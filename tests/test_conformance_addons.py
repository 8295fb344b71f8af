"""popxl.addons behaviours Graphcore's addons tests rely on (issue 9)."""

from __future__ import annotations

import numpy as np

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
        f = lambda t: t * 2.0  # noqa: E731
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
