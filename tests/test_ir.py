"""The IR's naming, ordering and error rules (popxl_api.md §1, §7)."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.printing import format_schedule
from popxl_core.schedule import schedule, verify


def _spec(*shape):
    return popxl.TensorSpec(shape, popxl.float32)


def test_graph_ids_count_across_the_ir():
    ir = popxl.Ir()
    with ir.main_graph:

        def adder(x, y):
            return x + y

        g0 = ir.create_graph(adder, _spec(2), _spec(2))
        g1 = ir.create_graph(adder, _spec(2), _spec(2))
        e = ir.create_empty_graph("load_remote")
    assert [g0.id, g1.id, e.id] == [
        "test_graph_ids_count_across_the_ir.adder_subgraph(0)",
        "test_graph_ids_count_across_the_ir.adder_subgraph(1)",
        "load_remote_subgraph(2)",
    ]
    assert repr(e) == "Graph[id=load_remote_subgraph(2) name=load_remote_subgraph(2)]"


def test_tensor_ids_dedup_with_an_ir_global_counter():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(2, np.float32), name="w")
        b = popxl.variable(np.zeros(2, np.float32), name="w")
        c = popxl.variable(np.zeros(2, np.float32), name="b")
        d = popxl.variable(np.zeros(2, np.float32), name="b")
        e = popxl.variable(np.zeros(2, np.float32))
    assert [a.id, b.id, c.id, d.id, e.id] == ["w", "w__t0", "b", "b__t1", "t"]


class Lin(popxl.Module):
    def build(self, x):
        with popxl.name_scope("inner"):
            return x + x


def test_subgraph_tensor_ids_are_scoped_and_names_are_not():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(Lin(), _spec(3))
    x = g.inputs[0]
    assert x.id == "Lin_subgraph(0)/x" and x.name == "x"
    assert g.outputs[0].id == "Lin_subgraph(0)/inner/add_out"
    assert g.inputs_by_name == {"x": x}


def test_op_ids_start_at_100_and_count_hidden_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        x = ops.host_load(s, "x")  # Init + HostLoad
        y = x + x
    assert [op.id for op in ir.main_graph.ops] == [100, 101, 102]
    assert [op.type for op in ir.main_graph.ops] == ["Init", "HostLoad", "Add"]
    assert x.id == "x_hostload" and y.producer.id == 102


def test_create_graph_inputs_follow_parameters_lists_and_by_ref():
    ir = popxl.Ir()
    with ir.main_graph:

        def fn(a, xs, w: popxl.TensorByRef, scale=2):
            ops.add_(w, a)
            return [a + x for x in xs]

        g = ir.create_graph(fn, _spec(2), [_spec(2), _spec(2)], _spec(2))
    assert [t.name for t in g.inputs] == ["a", "xs_0", "xs_1", "w"]
    assert g._by_ref_inputs == {g.inputs[3]}
    assert len(g.outputs) == 2


def test_create_graph_signature_mismatch_is_a_value_error():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(ValueError, match="do not match"):
        ir.create_graph(lambda x: x, _spec(2), _spec(2))


def test_mixed_tensor_list_is_a_type_error():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(TypeError, match="mixes tensors"):
        ir.create_graph(lambda xs: xs[0], [_spec(2), 3])


def test_variable_outside_main_graph_names_the_graph():
    ir = popxl.Ir()
    with ir.main_graph:

        def bad(x):
            popxl.variable(np.zeros(2, np.float32), name="w")
            return x

        with pytest.raises(ValueError, match=r"subgraph .*bad_subgraph\(0\).*main graph"):
            ir.create_graph(bad, _spec(2))


def test_tensor_from_another_graph_names_both_graphs():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(2, np.float32), name="w")
        with pytest.raises(
            ValueError,
            match=r"'w'.*belongs to graph 'main'.*graph '.*uses_w_subgraph\(0\)'.*test_ir.py",
        ):

            def uses_w(x):
                return x + w

            ir.create_graph(uses_w, _spec(2))


def test_failed_op_creation_leaves_the_graph_unchanged():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros(2, np.float32), name="a")
        b = popxl.variable(np.zeros(3, np.float32), name="b")
        n_ops, n_tensors = len(ir.main_graph.ops), len(ir.main_graph.tensors)
        with pytest.raises(ValueError, match=r"Add: .*\(2,\) and \(3,\).*test_ir.py"):
            ops.add(a, b)
        assert (len(ir.main_graph.ops), len(ir.main_graph.tensors)) == (n_ops, n_tensors)


def test_scalar_operands_take_the_tensor_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        h = popxl.variable(np.ones(2, np.float16), popxl.float16, name="h")
        y = h + 1
        z = 3 + h
    assert y.dtype is popxl.float16 and z.dtype is popxl.float16
    assert y.producer.inputs[1].dtype is popxl.float16


def test_call_input_errors():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x, y: x + y, _spec(2), _spec(2))
        a = popxl.variable(np.zeros(2, np.float32), name="a")
        with pytest.raises(ValueError, match="Not enough inputs.*\n.*y"):
            ops.call(g, a)
        with pytest.raises(ValueError, match="Too many inputs"):
            ops.call(g, a, a, a)
        with pytest.raises(ValueError, match="both positionally and in inputs_dict"):
            ops.call(g, a, a, inputs_dict={g.inputs[0]: a})
        with pytest.raises(ValueError, match=r"expects \(2,\) float32"):
            ops.call(g, a, popxl.variable(np.zeros(3, np.float32)))
        (out,) = ops.call(g, a, 1.5)  # scalars become constants of the input's dtype
    assert out.id == "add_out"


def test_call_outputs_copy_subgraph_output_names():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda x: ops.identity(x, "result"), _spec(2))
        a = popxl.variable(np.zeros(2, np.float32), name="a")
        (o1,) = ops.call(g, a)
        (o2,) = ops.call(g, a)
    assert (o1.id, o2.id) == ("result", "result__t0")


def test_in_sequence_adds_topological_constraints():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        a = popxl.variable(np.zeros(2, np.float32), name="a")
        x = a + a
        y = a + a
        with popxl.in_sequence(False):
            p = a + a
            q = a + a
        z = a + a
    cons = {(b.id, c.id) for b, c in ir.main_graph._topocons}
    ids = [t.producer.id for t in (x, y, p, q, z)]
    assert (ids[0], ids[1]) in cons and (ids[1], ids[2]) in cons and (ids[1], ids[3]) in cons
    assert (ids[2], ids[3]) not in cons
    assert (ids[2], ids[4]) in cons and (ids[3], ids[4]) in cons
    assert [op.id for op in schedule(ir.main_graph)] == ids
    with pytest.raises(TypeError):
        popxl.in_sequence(None)


def test_reprs():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((1,), np.int32), name="bob")
    assert repr(v) == "Tensor[bob popxl.dtypes.int32 (1,)]"
    assert repr(popxl.float16) == "popxl.dtypes.float16"
    assert repr(popxl.TensorSpec((2, 4), popxl.float32)) == (
        "TensorSpec(shape=(2, 4), dtype=popxl.dtypes.float32, meta_shape=())"
    )
    assert repr(ir).startswith("Ir[id=")
    assert repr(ir.replica_grouping()) == (
        "ReplicaGrouping(num_replicas=1, stride=1, group_size=1, num_groups=1)"
    )


def test_replica_grouping_assignments():
    ir = popxl.Ir(replication=8)
    assert ir.replica_grouping(1, 2).assignment == [0, 0, 1, 1, 2, 2, 3, 3]
    assert ir.replica_grouping(2, 4).assignment == [0, 1, 0, 1, 0, 1, 0, 1]
    assert ir.replica_grouping(4, 2).assignment == [0, 1, 2, 3, 0, 1, 2, 3]
    assert ir.replica_grouping(1, 2).num_groups == 4


def test_format_schedule_golden():
    ir = popxl.Ir()
    with ir.main_graph:

        def step(x, w):
            y = x + w
            return ops.identity(y, "y")

        g = ir.create_graph(step, _spec(2, 4), _spec(4))
    text = format_schedule(g, {g.inputs[1]: "weight"})
    assert text == (
        "Graph : test_format_schedule_golden.step_subgraph(0)\n"
        "  (%1, weight=%2) -> (%4) {\n"
        "    Add.100 (%1 [(2, 4) float32], %2 [(4,) float32]) -> (%3 [(2, 4) float32])\n"
        "    Identity.101 (%3 [(2, 4) float32]) -> (%4 [(2, 4) float32])\n"
        "  }"
    )
    verify(g)
    verify(ir.main_graph)


def test_get_current_graph_without_context_raises():
    with pytest.raises(RuntimeError, match="no graph has been selected"):
        popxl.gcg()


def test_tensor_diag_and_scalar_constants():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.arange(12, dtype=np.float32).reshape(3, 4), name="m")
        d = v.diag()
        c = popxl.constant(2)
        s = popxl.d2h_stream(d.shape, d.dtype, "d")
        ops.host_store(s, d)
    assert c.shape == () and c.dtype is popxl.int32
    with popxl.Session(ir, "ipu_hw") as session:
        np.testing.assert_array_equal(session.run()[s], [0.0, 5.0, 10.0])
