"""PopXL's public surface where Graphcore's own suites (tools/peer_suites.py) read it: dtype
tables, popxl.utils.to_numpy, popxl.testing, error classes and messages scripts match on."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import compat_popart, dtypes, ops, utils
from popxl_core.errors import OpDataError
from popxl_core.ir import IrChangedWarning
from popxl_core.testing import get_all_int_dtypes


def test_dtype_tables_as_popxl():
    assert popxl.dtype.as_dtype(builtins.float) is popxl.float32  # PopXL's python float
    assert torch.float8_e4m3fnuz not in dtypes._PT_TO_POPXL  # no numpy twin in torch
    assert torch.uint32 not in dtypes._PT_TO_POPXL
    assert popxl.dtype.as_dtype(torch.float8_e4m3fnuz) is popxl.float8_143  # still converts
    assert get_all_int_dtypes(include_signed=False) == [
        popxl.uint8,
        popxl.uint16,
        popxl.uint32,
        popxl.uint64,
    ]


def test_utils_to_numpy_as_popxl():
    assert utils.downcast_np_dtypes[np.dtype("float64")] == np.dtype("float32")
    x = np.ones(3, np.float32)
    assert np.shares_memory(utils.to_numpy(x, copy=False), x)
    assert not np.shares_memory(utils.to_numpy(x), x)
    fp8 = utils.to_numpy([1.0, 3.0], popxl.float8_152, log2_scale=1)
    assert fp8.dtype == dtypes.np_dtype_float8_152
    want = utils.host_pow2scale_cast_to_fp8([2.0, 6.0], popxl.float8_152)
    np.testing.assert_array_equal(fp8, want)
    t8 = torch.ones(2, dtype=torch.float8_e4m3fnuz)
    assert utils.to_numpy(t8).dtype == dtypes.np_dtype_float8_143
    with pytest.raises(ValueError, match="float8_143 / float8_152 only"):
        utils.to_numpy(x, log2_scale=1)


def test_errors_scripts_match_on():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.zeros((2, 2), np.uint8), popxl.float8_143)
        b = popxl.variable(np.zeros((2, 2), np.uint8), popxl.float8_152)
        with pytest.raises(TypeError, match="All inputs to a concat operation must have the sa"):
            ops.concat([a, b], 0)
        with pytest.raises(ValueError, match="must be a scalar tensor"):
            ops.matmul_pow2scaled(a, a, popxl.constant([1, 2], popxl.int32))
        with pytest.raises(TypeError, match="must be of type popxl.int32"):
            ops.conv_pow2scaled(
                ops.reshape(a, (1, 1, 2, 2)),
                ops.reshape(a, (1, 1, 2, 2)),
                popxl.constant(1, popxl.int8),
            )
    assert compat_popart.poplar_application_runtime_error is OpDataError


def test_scalar_stream_takes_transfers_with_unit_dims():
    """PopXL's _verify_io_shape: a stream of scalars takes (transfers, 1) as well as
    (transfers,); dimension 0 must still be the transfers."""
    ir = popxl.Ir()
    body = ir.create_empty_graph("body")
    with ir.main_graph:
        s_in = popxl.h2d_stream((), popxl.uint32)
        s_out = popxl.d2h_stream((), popxl.uint32)
    with body:
        ops.host_store(s_out, ops.host_load(s_in) + popxl.constant(1, popxl.uint32))
    with ir.main_graph:
        ops.repeat(body, 4)
    ir.num_host_transfers = 4
    with popxl.Session(ir, "ipu_model") as sess:
        out = sess.run({s_in: np.arange(4, dtype=np.uint32).reshape(4, 1)})
        np.testing.assert_array_equal(out[s_out], [1, 2, 3, 4])
        with pytest.raises(ValueError, match=r"has shape \(1, 4\)"):
            sess.run({s_in: np.arange(4, dtype=np.uint32).reshape(1, 4)})


def test_graph_contexts_of_two_irs_do_not_nest():
    mg1, mg2 = popxl.Ir().main_graph, popxl.Ir().main_graph
    with pytest.raises(RuntimeError, match="nested graph contexts must belong to one Ir"):
        with mg1, mg2:
            pass
    with mg2:  # the failed entry left no context behind
        assert popxl.gcg() is mg2


def test_global_replication_from_session_options():
    """PopDist's options (enableDistributedReplicatedGraphs, globalReplicationFactor) make the
    Ir's replication the global one: sharding over the global replicas is valid."""
    ir = popxl.Ir()
    opts = ir._pb_ir.getSessionOptions()
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicaOffset = 0
    opts.globalReplicationFactor = 8
    assert ir.replication_factor == 8 and opts.getGlobalReplicationFactor() == 8
    with ir.main_graph:
        buf = popxl.replica_sharded_buffer((4, 4), popxl.float32, shard_over=8)
    assert buf.tensor_shape == (2,)


def test_module_from_variable_factories():
    """popxl.addons' Module.from_variable_factories: the i-th factory's input is m[i], and the
    building module's args hold them under the attribute's name."""
    import addons

    class Chain(addons.Module):
        def build(self, x):
            self.weights = addons.Module.from_variable_factories(
                [addons.VariableFactory(lambda: np.eye(2, dtype=np.float32) * 2) for _ in range(2)]
            )
            for i in range(2):
                x = x @ self.weights[i]
            return x

    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.ones((2, 2), np.float32))
        facts, graph = Chain().create_graph(x)
        assert sorted(facts.to_dict()) == ["weights.0", "weights.1"]
        assert graph.args.weights[1] in graph.graph
        (y,) = graph.bind(facts.init()).call(x)
        s = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(s, y)
    with popxl.Session(ir, "ipu_model") as sess:
        np.testing.assert_array_equal(sess.run()[s], np.full((2, 2), 4.0))


def test_popxl_cache_dir_turns_engine_caching_on(monkeypatch):
    monkeypatch.setenv("POPXL_CACHE_DIR", "/tmp/popxl-cache")
    opts = popxl.Ir()._pb_ir.getSessionOptions()
    assert opts.enableEngineCaching and opts.cachePath == "/tmp/popxl-cache"
    monkeypatch.delenv("POPXL_CACHE_DIR")
    assert not popxl.Ir()._pb_ir.getSessionOptions().enableEngineCaching


@pytest.mark.parametrize("env, opts, want", [("FOO", set(), 1), ("", {"foo", "final"}, 2)])
def test_dot_checks_write_files(tmp_path, monkeypatch, env, opts, want):
    """ir.dot_checkpoint writes a Graphviz file when its check (case-blind), ALL or, at the
    Session, FINAL is enabled by POPART_DOT_CHECKS or the dotChecks option."""
    monkeypatch.setenv("POPART_DOT_CHECKS", env)
    ir = popxl.Ir()
    o = ir._pb_ir.getSessionOptions()
    o.dotChecks, o.logDir = opts, str(tmp_path)
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32), name="a")
        b = a + a
        ir.dot_checkpoint("Foo")
        ops.host_store(popxl.d2h_stream(b.shape, b.dtype), b * b)
        ir.dot_checkpoint("Bar")
    popxl.Session(ir, "ipu_model")
    files = sorted(p.name for p in tmp_path.glob("*.dot"))
    assert len(files) == want and files[0] == "001_Foo.dot"
    assert (tmp_path / files[0]).read_text().startswith('digraph "Foo" {')


def test_dot_checkpoint_enables_all_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("POPART_DOT_CHECKS", raising=False)
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(np.ones(2, np.float32)) + 1.0
        ir.dot_checkpoint("Mid", tmp_path / "dots")
    assert ir._pb_ir.getSessionOptions().dotChecks == {"ALL"}
    popxl.Session(ir, "ipu_model")
    assert sorted(p.name for p in (tmp_path / "dots").glob("*.dot")) == [
        "001_Mid.dot",
        "002_FINAL.dot",
    ]


def test_ir_changed_after_a_session_warns_and_the_session_keeps_its_program():
    """PopXL lets a program grow after a Session was built on its Ir (its
    test_automatic_dot_check builds twice into one Ir): one IrChangedWarning per Session, that
    Session runs what it compiled, a new Session runs the changed Ir."""
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(np.ones(2, np.float32), name="a")
        s1 = popxl.d2h_stream((2,), popxl.float32, "s1")
        ops.host_store(s1, a + 1.0)
    first = popxl.Session(ir, "ipu_model")
    with pytest.warns(IrChangedWarning, match=r"tensor .*keeps running what it compiled") as w:
        with ir.main_graph:
            s2 = popxl.d2h_stream((2,), popxl.float32, "s2")
            ops.host_store(s2, ops.relu(a) * 3.0)
        ir.create_graph(lambda: None)
    assert len(w) == 1 and w[0].filename == __file__
    with first:
        assert set(first.run()) == {s1}
    with popxl.Session(ir, "ipu_model") as second:
        np.testing.assert_array_equal(second.run()[s2], [3.0, 3.0])
    with pytest.raises(RuntimeError, match="runs by this setting; setting num_host_transfers to 2"):
        ir.num_host_transfers = 2
