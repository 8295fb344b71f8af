"""The smaller pieces of the PopXL / popxl.addons surface: host shapes, names, error wording,
op settings, FLOP counts, repeat_graph, debug printing (popxl_api.md §1, §4)."""

from __future__ import annotations

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.named_replica_grouping import NamedReplicaGrouping
from addons.transforms.repeat_graph import repeat_graph
from popxl_core import ops


def _scalar_program():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((), popxl.float32, "x")
        x = ops.host_load(s)
        out = popxl.d2h_stream((), popxl.float32, "y")
        ops.host_store(out, x * 2)
    return ir, s, out


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_run_accepts_size_one_array_for_all_ones_shape(shape):
    ir, s, out = _scalar_program()
    with popxl.Session(ir, "ipu_model") as sess:
        y = sess.run({s: np.full(shape, 3.0, np.float32)})
    assert y[out].shape == () and y[out] == 6.0


def test_run_still_refuses_other_shapes():
    ir, s, _ = _scalar_program()
    with popxl.Session(ir, "ipu_model") as sess:
        with pytest.raises(ValueError, match="has shape \\(2,\\)"):
            sess.run({s: np.ones(2, np.float32)})


def test_replica_sharded_slice_named_after_its_input():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        ws = [popxl.variable(np.ones(4, np.float32), name=n) for n in ("b", "a")]
        shards = [ops.collectives.replica_sharded_slice(w) for w in ws]
    assert [t.name for t in shards] == ["b_sharded_slice", "a_sharded_slice"]
    # NamedTensors order tensors by name: shards pair with their variables when zipped
    nt_vars = addons.NamedTensors(b=ws[0], a=ws[1])
    nt_shards = addons.NamedTensors(b=shards[0], a=shards[1])
    pairs = [(v.name, s.name) for v, s in zip(nt_vars.tensors, nt_shards.tensors)]
    assert pairs == [("a", "a_sharded_slice"), ("b", "b_sharded_slice")]


def test_remote_buffer_error_wording():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError) as e:
            popxl.remote_buffer((2,), popxl.float32, entries=0)
        assert e.value.args[0] == "Entries must be a non-zero, positive integer"
        b = popxl.remote_buffer((2,), popxl.float32)
        for prop, value in (("tensor_shape", (3,)), ("tensor_dtype", popxl.float16)):
            # PopXL's properties have no setter: Python's AttributeError, its 3.10 wording
            with pytest.raises(AttributeError, match=f"can't set attribute '{prop}'"):
                setattr(b, prop, value)
        with pytest.raises(ValueError, match="Entries must be"):
            b.entries = -1


def test_remote_buffer_internals_popxl_code_reads():
    """PopXL's RemoteBuffer keeps ``_current_ir`` (the PopART IR) and ``_remote_buffer_id``;
    PopART's ``getRemoteBufferInfo(id)`` gives ``TensorInfo.shape()`` and ``repeats``."""
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.remote_buffer((2, 3), popxl.float16, entries=4)
        b = popxl.remote_buffer((5,), popxl.int32)
    assert a._current_ir is ir._pb_ir and (a._remote_buffer_id, b._remote_buffer_id) == (1, 2)
    info = ir._pb_ir.getRemoteBufferInfo(a.remote_buffer_id)
    assert info.TensorInfo.shape() == [2, 3] and info.repeats == 4
    assert info.TensorInfo.data_type_lcase() == "float16" and info.TensorInfo.nelms() == 6
    a.entries = 7  # addons' load_remote_graph grows a buffer: PopART's record follows
    assert ir._pb_ir.getRemoteBufferInfo(1).repeats == 7
    assert sorted(ir._pb_ir.getAllRemoteBufferInfos()) == [1, 2]
    assert ir._pb_ir.hasRemoteBufferInfo(2) and not ir._pb_ir.hasRemoteBufferInfo(3)
    with pytest.raises(KeyError, match="No remote buffer with id 3"):
        ir._pb_ir.getRemoteBufferInfo(3)


def _matmul_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones((2, 3), np.float32))
        with popxl.ipu(1):
            b = popxl.variable(np.ones((3, 5), np.float32))
            c = b.T @ b.T.T
    with ir.main_graph:
        d = a @ a.T
    return ir, c, d


def test_fc_pass_and_available_memory_proportion():
    ir, c, d = _matmul_ir()
    addons.disable_fc_pass(ir)
    assert c.producer.settings == d.producer.settings == {"use_fully_connected_pass": False}
    addons.enable_fc_pass(ir)
    assert d.producer.settings["use_fully_connected_pass"] is True
    addons.set_available_memory_proportion_by_ipu(ir, [0.2, 0.4])
    assert d.producer.attrs["available_memory_proportion"] == 0.2
    assert c.producer.attrs["available_memory_proportion"] == 0.4
    with pytest.raises(ValueError, match="on IPU 1, but only 1 proportions"):
        addons.set_available_memory_proportion_by_ipu(ir, [0.5])
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        addons.set_available_memory_proportion_by_ipu(ir, [0.5, 1.5])


def test_flops_breakdown_per_op_through_calls_and_loops(capsys):
    """popxl.addons' evaluate_FLOPs: op type -> {op id: FLOPs}, a Call's or Loop's graph
    under "<type>_<id>(<graph>)" (a Loop times its count), "TOT" the total; the Ir's
    breakdown times the replication factor."""
    ir = popxl.Ir()
    ir.replication_factor = 2
    with ir.main_graph:
        x = popxl.variable(np.ones((4, 8), np.float32))
        w = popxl.variable(np.ones((8, 8), np.float32))
        g = ir.create_graph(lambda a, b: ops.gelu(a @ b) + a, x, w)
        ops.call(g, x, w)
        ops.repeat(g, 3, x, w)
        y = x * 2.0
    mm, add = g._ops[0].id, g._ops[2].id
    per_call = {"MatMul": {mm: 2 * 4 * 8 * 8}, "Add": {add: 4 * 8}, "TOT": 2 * 4 * 8 * 8 + 32}
    assert addons.evaluate_FLOPs(g) == per_call
    call, loop = (op for op in ir.main_graph._ops if op.type in ("Call", "Loop"))
    name = g.id[: g.id.index("_subgraph(")]  # the graph's name less PopART's suffix
    keys = (f"Call_{call.id}({name})", f"Loop_{loop.id}({name})")
    want = {
        "MatMul": {keys[0]: {mm: 512}, keys[1]: {mm: 3 * 512}},
        "Add": {keys[0]: {add: 32}, keys[1]: {add: 3 * 32}},
        "TOT": 4 * per_call["TOT"] + 32,
        "Mul": {y.producer.id: 32},
    }
    assert addons.evaluate_FLOPs(ir.main_graph) == want
    assert addons.total_FLOPs(ir) == 2 * want["TOT"]
    assert addons.evaluate_ir_FLOPs(ir)["Mul"] == {y.producer.id: 64}
    assert addons.format_flops_scientific(48000) == "48.000E+03"
    assert addons.format_flops_scientific(120000, "M") == "0.120E+06"
    addons.print_FLOPs(want)
    assert "\nMatMul  | 2.048E+03  | 92.8\n" in capsys.readouterr().out


def _step_program(repeated: bool, steps: int):
    """y = x * w; w += x: once per step, from a host stream."""
    ir = popxl.Ir()
    ir.num_host_transfers = steps if repeated else 1
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(np.array([1.0, 2.0], np.float32), name="w")
        s = popxl.h2d_stream((2,), popxl.float32, "x")
        x = ops.host_load(s)
        out = popxl.d2h_stream((2,), popxl.float32, "y")
        ops.host_store(out, x * w)
        ops.var_updates.accumulate_(w, x)
    return ir, w, s, out


def test_repeat_graph_equals_the_plain_program_run_step_by_step():
    steps = 3
    data = np.arange(steps * 2, dtype=np.float32).reshape(steps, 2)
    ir, w, s, out = _step_program(False, steps)
    with popxl.Session(ir, "ipu_model") as sess:
        want = np.stack([sess.run({s: d})[out] for d in data])
        want_w = sess.get_tensor_data(w).copy()
    ir, w, s, out = _step_program(True, steps)
    op_ids = [op.id for op in ir.main_graph.ops]
    body = repeat_graph(ir.main_graph, steps)
    assert [op.id for op in body.ops] == op_ids  # ops moved, ids kept
    assert [op.type for op in ir.main_graph.ops] == ["Loop"]
    with popxl.Session(ir, "ipu_model") as sess:
        got = sess.run({s: data})[out]
        got_w = sess.get_tensor_data(w)
    np.testing.assert_array_equal(got, want)  # exact: the same ops on the same values
    np.testing.assert_array_equal(got_w, want_w)


def test_repeat_graph_bad_input():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda a: a + 1, popxl.TensorSpec((2,), popxl.float32))
    with pytest.raises(ValueError, match="it has outputs"):
        repeat_graph(g, 2)
    with pytest.raises(ValueError, match="positive int"):
        repeat_graph(ir.main_graph, 0)


@pytest.mark.parametrize("level, printed", [("DEBUG", False), ("INFO", True)])
def test_debug_print_tensor_follows_model_log_level(monkeypatch, level, printed):
    monkeypatch.delenv("MODEL_LOG_LEVEL", raising=False)  # default INFO
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones(2, np.float32))
        y = addons.print_tensor(x, level=level)
    assert (y is not x) == printed
    assert sum(op.type == "PrintTensor" for op in ir.main_graph.ops) == int(printed)
    monkeypatch.setenv("MODEL_LOG_LEVEL", "LOUD")
    with ir.main_graph, pytest.raises(ValueError, match="Unknown log level 'LOUD'"):
        addons.print_tensor(x)


def test_named_replica_grouping():
    ir = popxl.Ir(replication=4)
    g = ir.replica_grouping(group_size=2)
    named = NamedReplicaGrouping.build_groups(["a.w", "b"], g)
    assert named.to_dict() == {"a.w": g, "b": g}
    with pytest.raises(TypeError, match="must be a ReplicaGrouping"):
        NamedReplicaGrouping.build_groups(["a"], 2)


def test_module_paths_and_names_popxl_code_imports(caplog):
    """Names the reference lists at popxl.addons' top level and in its ``utils``, and the
    type aliases of ``popxl.session`` (popxl_api.md §1.1, §4.1, §4.9)."""
    import logging
    import re

    from addons import array_munging, utils
    from addons.layers import WeightsDict
    from popxl_core.sim import session

    assert addons.shard is array_munging.shard and addons.unshard2D is array_munging.unshard2D
    assert addons.WeightsDict is utils.WeightsDict is WeightsDict
    assert addons.GradGraphInfo is popxl.transforms.GradGraphInfo
    assert re.fullmatch("[0-9a-f]{40}|unknown", addons.GIT_COMMIT)
    with pytest.raises(AttributeError, match="no attribute 'GIT_COMMITS'"):
        addons.GIT_COMMITS  # noqa: B018
    assert session.h2dStreamBufferMaps.__args__[0] is popxl.HostToDeviceStream
    assert session.d2hStreamBufferMaps.__args__[0] is popxl.DeviceToHostStream
    with caplog.at_level(logging.INFO, logger="popxl_addons"):
        with addons.timer("load", log_to_wandb=False):
            pass
    assert re.fullmatch(r"load took \d+\.\d{4} s", caplog.records[-1].getMessage())
