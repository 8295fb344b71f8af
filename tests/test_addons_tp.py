"""addons.ops.replicated_all_reduce_TP, addons.patterns and the `popart` stand-in.

The TP all-reduces run on 4 replicas with different data on each, against numpy sums over the
replica group folded in replica order (as the simulator folds), so forward values and
gradients match exactly (assert_array_equal). As in PopXL, a program holding an
identical-inputs op needs the OpToIdentity pattern before its Session; the pattern changes op
types but no value.
"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from addons.ops.replicated_all_reduce_TP import (
    replicated_all_reduce,
    replicated_all_reduce_identical_grad_inputs,
    replicated_all_reduce_identical_inputs,
)
from addons.patterns import apply_pre_alias_patterns
from popxl_core import ops, transforms

R = 4


def _group_sums(a: np.ndarray, group_size: int) -> np.ndarray:
    """Per replica, the sum over its group (groups of consecutive replicas), in replica order."""
    out = np.empty_like(a)
    for r in range(R):
        first = r - r % group_size
        acc = a[first]
        for m in range(first + 1, first + group_size):
            acc = acc + a[m]
        out[r] = acc
    return out


def _run(fn, x: np.ndarray, dy: np.ndarray, group_size: int, patterns: bool = True):
    """y = fn(x, group) and dx for cotangent dy, with per-replica x and dy; (y, dx, ir)."""
    ir = popxl.Ir(R)
    group = ir.replica_grouping(1, group_size)
    with ir.main_graph, popxl.in_sequence():
        xs = popxl.h2d_stream(x.shape[1:], popxl.float32, "x")
        gs = popxl.h2d_stream(dy.shape[1:], popxl.float32, "dy")
        graph = ir.create_graph(lambda t: fn(t, group=group), xs.spec)
        bwd = transforms.autodiff(graph)
        site = ops.call_with_info(graph, ops.host_load(xs))
        (dx,) = ops.call(bwd.graph, ops.host_load(gs), inputs_dict=bwd.inputs_dict(site))
        outs = []
        for name, t in (("y", site.outputs[0]), ("dx", dx)):
            s = popxl.d2h_stream(t.shape, t.dtype, name)
            ops.host_store(s, t)
            outs.append(s)
    if patterns:
        apply_pre_alias_patterns(ir, "default")
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run({xs: x, gs: dy})
    return res[outs[0]], res[outs[1]], ir


def _data(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, 2, 3)).astype(np.float32)
    dy = rng.standard_normal((R, 2, 3)).astype(np.float32)
    return x, dy


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_identical_inputs_is_identity_forward_and_all_reduce_backward(group_size):
    x, dy = _data(1)
    y, dx, _ = _run(replicated_all_reduce_identical_inputs, x, dy, group_size)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, _group_sums(dy, group_size))


@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_identical_grad_inputs_is_all_reduce_forward_and_identity_backward(group_size):
    x, dy = _data(2)
    y, dx, _ = _run(replicated_all_reduce_identical_grad_inputs, x, dy, group_size)
    np.testing.assert_array_equal(y, _group_sums(x, group_size))
    np.testing.assert_array_equal(dx, dy)


def test_plain_tp_all_reduce_reduces_both_ways():
    x, dy = _data(3)
    y, dx, _ = _run(replicated_all_reduce, x, dy, 2)
    np.testing.assert_array_equal(y, _group_sums(x, 2))
    np.testing.assert_array_equal(dx, _group_sums(dy, 2))


def test_tp_gradient_of_max_is_refused_with_the_op_named():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(3, np.float32))
        graph = ir.create_graph(lambda t: replicated_all_reduce(t, "max"), v.spec)
    with pytest.raises(NotImplementedError, match="ReplicatedAllReduceTP with op 'max'"):
        transforms.autodiff(graph)


def _op_types(ir) -> list:
    return sorted(op.type for g in ir._graphs.values() for op in g._ops)


@pytest.mark.parametrize("group_size", [1, 2])
def test_op_to_identity_rewrites_without_changing_values(group_size):
    def fn(t, group):
        t = ops.reshape(t, t.shape) + 1  # a same-shape reshape: an identity
        return replicated_all_reduce_identical_inputs(t, group=group)

    x, dy = _data(4)
    y1, dx1, ir1 = _run(fn, x, dy, group_size)
    np.testing.assert_array_equal(y1, x + np.float32(1))
    np.testing.assert_array_equal(dx1, _group_sums(dy, group_size))
    assert _fwd_types(ir1) == ["Identity", "Add", "Identity"]
    # the backward all-reduce is a real one: it stays unless its group is one replica
    assert _op_types(ir1).count("ReplicatedAllReduceTP") == (1 if group_size > 1 else 0)


@pytest.mark.parametrize(
    "fn", [replicated_all_reduce_identical_inputs, replicated_all_reduce_identical_grad_inputs]
)
def test_without_the_pattern_the_session_is_refused_as_in_popxl(fn):
    # popxl.addons' ReplicatedAllReduceTPOpx throws for an identical-inputs op (the forward of
    # the first, the gradient of the second)
    x, dy = _data(5)
    with pytest.raises(RuntimeError, match="You need to run the `OpToIdentityPattern` pattern"):
        _run(fn, x, dy, 2, patterns=False)
    y, dx, _ = _run(replicated_all_reduce, x, dy, 2, patterns=False)  # nothing to rewrite
    np.testing.assert_array_equal(dx, _group_sums(dy, 2))


def _fwd_types(ir) -> list:
    (g,) = [g for g in ir._graphs.values() if g.id.endswith("_subgraph(0)")]
    return [op.type for op in g._ops]


def test_patterns_levels_no_and_minimal_change_nothing_and_bad_level_is_named():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones((2, 2), np.float32))
        ops.transpose(v, (0, 1))
    assert apply_pre_alias_patterns(ir, "no") == 0
    assert apply_pre_alias_patterns(ir, "minimal") == 0
    assert "Transpose" in _op_types(ir)
    with pytest.raises(ValueError, match="'fancy'"):
        apply_pre_alias_patterns(ir, "fancy")
    assert apply_pre_alias_patterns(ir, "all") == 1
    assert "Transpose" not in _op_types(ir)


def test_popart_stand_in_offers_patterns_level_and_names_what_is_missing():
    from popxl_core import compat

    compat.install()
    try:
        import popart

        assert popart.PatternsLevel.Default.value == "default"
        with pytest.raises(AttributeError, match="popart.SessionOptions is not available"):
            popart.SessionOptions  # noqa: B018 - the attribute access is the test
        with pytest.raises(ImportError):
            import popart._internal.ir
    finally:
        compat.uninstall()


def test_batch_serial_sharded_store_and_load_round_trip():
    """An output stored with a ReplicaGrouping (a new buffer, each replica its shard over the
    group) and loaded back with ``(buffer, row, group)`` is the whole tensor again (exact),
    for a tensor identical across the group, which is what sharding over it assumes."""
    from addons.transforms.batch_serialisation import batch_serialise

    steps, shape = 3, (2, 5)  # 10 elements: shards over 4 replicas are padded
    for group_size in (2, 4):
        ir = popxl.Ir(R)
        group = ir.replica_grouping(1, group_size)
        with ir.main_graph, popxl.in_sequence():
            xs = popxl.h2d_stream(shape, popxl.float32, "x")
            ys = popxl.d2h_stream(shape, popxl.float32, "y")
            double = ir.create_graph(lambda t: t * 2.0, xs.spec)
            g = _named(double)
            y = double.outputs[0]
            first = batch_serialise(g, steps, {double.inputs[0]: xs}, {}, {y: group}, io_mode="io")
            handle = first.stored_buffers[y]
            assert handle.shard_group is group and handle.buffer.tensor_shape == (
                -(-10 // group_size),
            )
            second = batch_serialise(
                g, steps, {double.inputs[0]: (handle.buffer, 0, group)}, {y: ys}, {}
            )
            ops.call(first.graph.graph, popxl.constant(0))
            ops.call(second.graph.graph, popxl.constant(0))
        ir.num_host_transfers = steps
        x = np.random.default_rng(5).standard_normal((steps, R, *shape)).astype(np.float32)
        # sharding assumes the tensor is identical across the group (each member keeps a part)
        x = x[:, [r - r % group_size for r in range(R)]]
        with popxl.Session(ir, "ipu_hw") as sess:
            out = sess.run({xs: x})[ys]
        np.testing.assert_array_equal(out, x * 4)


def _named(graph):
    from addons.graph import GraphWithNamedArgs

    return GraphWithNamedArgs(graph)
