"""Remote buffers, remote and replica-sharded variables in simulated Streaming Memory, and
the errors for misuse. Values are moved, never computed, so every check is exact."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops import collectives as coll


def _store(t, name):
    s = popxl.d2h_stream(t.shape, t.dtype, name)
    ops.host_store(s, t)
    return s


def test_remote_variable_load_update_store():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2, 3), popxl.float32, entries=3)
        w = popxl.remote_variable(np.ones((2, 3), np.float32), buf, 2, name="w")
        x = ops.remote_load(buf, 2)
        ops.remote_store(buf, 2, x + 1.0)
        s = _store(x, "x")
    sess = popxl.Session(ir, "ipu_hw")
    np.testing.assert_array_equal(sess.get_tensor_data(w), np.ones((2, 3)))
    with sess:
        out = sess.run()[s]
        np.testing.assert_array_equal(out, np.ones((2, 3)))
        np.testing.assert_array_equal(sess.get_tensor_data(w), np.full((2, 3), 2.0))
        sess.write_variable_data(w, np.full((2, 3), 7.0, np.float32))
        np.testing.assert_array_equal(sess.run()[s], np.full((2, 3), 7.0))
    np.testing.assert_array_equal(sess.get_tensor_data(w), np.full((2, 3), 8.0))


def test_tensor_offsets_and_inplace_load():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2,), popxl.int32, entries=4)
        for i in range(4):
            ops.remote_store(buf, i, popxl.constant([i, 10 * i], popxl.int32))
        i = popxl.constant(3, popxl.int32)
        loaded = ops.remote_load(buf, i)
        target = ops.init((2,), popxl.int32, "t")
        same = ops.remote_load_(buf, 1, target)
        s1, s2 = _store(loaded, "a"), _store(same, "b")
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()
    np.testing.assert_array_equal(out[s1], [3, 30])
    np.testing.assert_array_equal(out[s2], [1, 10])


def test_grouped_remote_variable_per_replica():
    ir = popxl.Ir(4)
    rg = ir.replica_grouping(2, 2)  # groups {0, 2} and {1, 3}
    data = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2,), popxl.float32)
        w = popxl.remote_variable(data, buf, replica_grouping=rg)
        x = ops.remote_load(buf, 0)
        s = _store(x, "x")
        ops.remote_store(buf, 0, x * 10.0)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()[s]
        np.testing.assert_array_equal(out, data[rg.assignment])
        np.testing.assert_array_equal(sess.get_tensor_data(w), data * 10)


@pytest.mark.parametrize("n", [5, 6])
def test_remote_replica_sharded_variable_pads_to_ceil(n):
    ir = popxl.Ir(2)
    full = np.arange(n, dtype=np.float32) + 1
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.replica_sharded_buffer((n,), popxl.float32)
        assert buf.tensor_shape == (-(-n // 2),) and buf.meta_shape == (n,)
        w = popxl.remote_replica_sharded_variable(full, buf, 0, name="w")
        shard = ops.remote_load(buf, 0)
        s = _store(shard, "shard")
        ops.remote_store(buf, 0, shard * 2.0)
    with popxl.Session(ir, "ipu_hw") as sess:
        out = sess.run()[s]
        padded = np.concatenate([full, np.zeros(out.size - n, np.float32)])
        np.testing.assert_array_equal(out.reshape(-1), padded)
        np.testing.assert_array_equal(sess.get_tensor_data(w), full * 2)
        with pytest.raises(ValueError, match=rf"'w' has host shape \({n},\)"):
            sess.write_variable_data(w, np.zeros((n + 1,), np.float32))


def test_replica_sharded_variable_keeps_on_chip_shard_across_runs():
    ir = popxl.Ir(2)
    with ir.main_graph, popxl.in_sequence():
        w, shard = popxl.replica_sharded_variable(np.arange(3, dtype=np.float32), name="w")
        assert shard.shape == (2,) and shard.meta_shape == (3,)
        ops.var_updates.accumulate_(shard, popxl.constant(np.ones(2, np.float32)))
        full = coll.replicated_all_gather(shard)
        s = _store(full, "full")
    sess = popxl.Session(ir, "ipu_hw")
    with sess:
        np.testing.assert_array_equal(sess.run()[s][0], [1.0, 2.0, 3.0])
        np.testing.assert_array_equal(sess.run()[s][1], [2.0, 3.0, 4.0])
        np.testing.assert_array_equal(sess.get_tensor_data(w), [2.0, 3.0, 4.0])
        sess.write_variable_data(w, np.zeros(3, np.float32))
        np.testing.assert_array_equal(sess.run()[s][0], [1.0, 1.0, 1.0])
        with pytest.raises(TypeError, match="on-chip shard of replica-sharded variable 'w'"):
            sess.get_tensor_data(shard)


def test_streaming_memory_survives_reattach():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((1,), popxl.float32, entries=2)
        x = ops.remote_load(buf, 1)
        ops.remote_store(buf, 1, x + 1.0)
        s = _store(x, "x")
    sess = popxl.Session(ir, "ipu_hw")
    with sess:
        sess.run()
    with sess:
        assert sess.run()[s] == 1.0


def test_build_errors_name_buffer_and_tensor():
    ir = popxl.Ir(4)
    with ir.main_graph:
        buf = popxl.remote_buffer((2, 3), popxl.float32, entries=2)
        x = popxl.variable(np.ones((3, 2), np.float32), name="x")
        msg = r"Tensor x does not match buffer.\nTensor 'x' \(3, 2\) float32 does not fit"
        with pytest.raises(ValueError, match=msg):
            ops.remote_store(buf, 0, x)
        y = popxl.variable(np.ones((2, 3), np.int32), name="y")
        with pytest.raises(ValueError, match="holds \\(2, 3\\) float32"):
            ops.remote_store(buf, 0, y)
        with pytest.raises(IndexError, match="Offset 2 is out of range .* has 2 entries"):
            ops.remote_load(buf, 2)
        with pytest.raises(IndexError, match="Offset 5 is out of range"):
            popxl.remote_variable(np.ones((2, 3), np.float32), buf, 5)
        with pytest.raises(ValueError, match="'v' \\(4,\\) float32 does not fit"):
            popxl.remote_variable(np.ones(4, np.float32), buf, 0, name="v")
        with pytest.raises(ValueError, match="shard_over=3 must be a positive divisor"):
            popxl.replica_sharded_buffer((6,), popxl.float32, shard_over=3)
        with pytest.raises(TypeError, match="integer scalar tensor"):
            ops.remote_load(buf, popxl.constant(1.0))
    with pytest.raises(ValueError, match="does not divide the replication factor 4"):
        ir.replica_grouping(1, 3)


def test_remote_variable_used_directly_is_an_error():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float32)
        w = popxl.remote_variable(np.ones(2, np.float32), buf, name="w")
        _store(w + 1.0, "y")
    with pytest.raises(ValueError, match="reads remote variable 'w'.*remote_load"):
        popxl.Session(ir, "ipu_hw")


def test_host_data_with_wrong_replica_dim():
    ir = popxl.Ir(2)
    with ir.main_graph:
        s = popxl.h2d_stream((3,), popxl.float32, "x")
        _store(ops.host_load(s), "y")
    with popxl.Session(ir, "ipu_hw") as sess:
        with pytest.raises(ValueError, match=r"'x' has shape \(3, 3\); expected \(2, 3\)"):
            sess.run({s: np.ones((3, 3), np.float32)})
        out = sess.run({s: np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert out[list(out)[0]].shape == (2, 3)


def test_grouped_variable_host_data_needs_group_dim():
    ir = popxl.Ir(4)
    with ir.main_graph:
        with pytest.raises(ValueError, match="needs leading dim 2"):
            popxl.variable(
                np.ones((3,), np.float32), name="v", replica_grouping=ir.replica_grouping(1, 2)
            )


def test_tensor_locations_compare_by_value():
    on = popxl.TensorLocation(popxl.TensorStorage.OffChip, popxl.ReplicatedTensorSharding.On)
    assert on == popxl.TensorLocation(
        popxl.TensorStorage.OffChip, popxl.ReplicatedTensorSharding.On
    )
    assert on != popxl.TensorLocation()
    assert repr(on) == "TensorLocation(OffChip, On)"
    assert popxl.TileSet.IO != popxl.TileSet.Compute


def test_scalar_int_remote_variable_accumulates():
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((), popxl.int32)
        w = popxl.remote_variable(np.array(5, np.int32), buf, name="w")
        x = ops.remote_load(buf, 0)
        ops.var_updates.accumulate_(x, popxl.constant(2, popxl.int32))
        ops.remote_store(buf, 0, x)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        sess.run()
        assert sess.get_tensor_data(w) == 9


def test_buffer_properties_and_sharded_validation_as_popxl():
    """tensor_shape / tensor_dtype have no setter (AttributeError, as PopXL's properties);
    set_remote_buffer_info changes them; a sharded check compares the whole tensor with
    meta_shape."""
    ir = popxl.Ir(2)
    with ir.main_graph:
        buf = popxl.remote_buffer((0,), popxl.int8)
        with pytest.raises(AttributeError, match="can't set attribute 'tensor_shape'"):
            buf.tensor_shape = (11,)
        with pytest.raises(AttributeError, match="can't set attribute 'tensor_dtype'"):
            buf.tensor_dtype = popxl.int16
        buf.set_remote_buffer_info(popxl.int16, (3, 11, 5), 42)
        assert (buf.tensor_shape, buf.tensor_dtype, buf.entries) == ((3, 11, 5), popxl.int16, 42)
        sharded = popxl.replica_sharded_buffer((4, 2), popxl.float32)
        whole = popxl.variable(np.ones((4, 2), np.float32))
        sharded.validate_tensor_matches_buffer(whole, num_shards=2)
        with pytest.raises(ValueError, match="does not match buffer"):
            sharded.validate_tensor_matches_buffer(whole.reshape((8,)), num_shards=2)


def test_sharded_variable_in_a_full_shape_buffer():
    """PopXL accepts a buffer of the full shape for a remote replica-sharded variable: the
    entries become the shard's shape (with a warning) and the values round-trip."""
    ir = popxl.Ir(2)
    with ir.main_graph:
        buf = popxl.RemoteBuffer((4,), popxl.float32, 1)
        with pytest.warns(UserWarning, match="now hold \\(2,\\)"):
            v = popxl.remote_replica_sharded_variable(np.arange(4, dtype=np.float32), buf, 0)
        whole = ops.collectives.replicated_all_gather(ops.remote_load(buf, 0))
        s = _store(whole, "whole")
    assert buf.tensor_shape == (2,) and buf.meta_shape == (4,)
    with popxl.Session(ir, "ipu_model") as sess:
        out = sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(v), np.arange(4))
    np.testing.assert_array_equal(out[s][0].reshape(-1), np.arange(4))
