"""np.memmap variables as PopXL has them (Graphcore's test_mmap_variable): the memmap is the
host buffer, flushed by weights_to_host; a read-only one makes weights_to_host raise; what
would need a copy is refused with PopXL's messages; a non-constant replica grouping falls
back to a copy, with a warning on stderr. Also the popart stand-in's device enums."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import compat_popart, ops


def _memmap(tmp_path, mode="w+", dtype=np.float32, shape=(4,), order="C"):
    return np.memmap(str(tmp_path / "w.npy"), dtype=dtype, shape=shape, mode=mode, order=order)


def _plus_one(data, replication=2, rg=None):
    ir = popxl.Ir(replication=replication)
    with ir.main_graph:
        w = popxl.variable(data, name="w", replica_grouping=rg)
        ops.var_updates.accumulate_(w, popxl.constant(1.0))
    return ir, w


def test_weights_to_host_flushes_the_memmap(tmp_path, monkeypatch):
    mm = _memmap(tmp_path)
    mm[:] = 1.0
    ir, w = _plus_one(mm)
    flushed = []
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        monkeypatch.setattr(mm, "flush", lambda: flushed.append(True), raising=False)
    assert flushed == [True]  # once, by the exit's weights_to_host
    assert sess.get_tensor_data(w) is mm
    np.testing.assert_array_equal(mm, 2.0)


def test_read_only_memmap_weights_to_host_raises(tmp_path):
    mm = _memmap(tmp_path)
    mm[:] = 1.0
    mm.flush()
    ro = np.memmap(mm.filename, dtype=np.float32, shape=(4,), mode="r")
    ir, w = _plus_one(ro)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        with pytest.raises(ValueError, match="read-only np.memmap"):
            sess.weights_to_host()
    # the host has the other values now: the exit does not copy (nor raise) again
    np.testing.assert_array_equal(sess.get_tensor_data(w), np.ones(4))


def test_memmap_refusals_use_popxls_words(tmp_path):
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="^When passing a memory-mapped NumPy array, the `d"):
            popxl.variable(_memmap(tmp_path), popxl.float16)
        with pytest.raises(ValueError, match="^When passing a memory-mapped .* C-ordered"):
            popxl.variable(_memmap(tmp_path, shape=(2, 2), order="F"))
        f64 = _memmap(tmp_path, dtype=np.float64)
        for dt in (None, popxl.float64):
            with pytest.raises(ValueError, match=f"the dtype {dt} is not supported, as it req"):
                popxl.variable(f64, dt)


def test_non_const_grouping_copies_the_memmap_and_warns(tmp_path, capfd):
    rg_ir = popxl.Ir(replication=8)
    rg = rg_ir.replica_grouping_from_assignments([0, 0, 1, 1, 0, 0, 1, 1])
    mm = _memmap(tmp_path, shape=(2, 8))
    mm[:] = 1.0
    capfd.readouterr()
    ir, w = _plus_one(mm, 8, rg)
    err = capfd.readouterr().err
    assert err.count("you have passed np.memmap data and a non-const replica grouping") == 1
    assert not isinstance(w._data, np.memmap)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
    np.testing.assert_array_equal(sess.get_tensor_data(w), 2.0)
    np.testing.assert_array_equal(mm, 1.0)  # the file is not the host buffer


def test_sharded_buffer_made_with_the_grouped_shape(tmp_path):
    """A replica-sharded buffer made with the grouped data's shape (num_groups, *shape): its
    meta shape becomes the variable's, so a gather gives the variable's shape."""
    ir = popxl.Ir(replication=4)
    rg = ir.replica_grouping(stride=1, group_size=2)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    with ir.main_graph:
        buf = popxl.replica_sharded_buffer(data.shape, popxl.float32, rg, shard_over=2)
        v = popxl.remote_replica_sharded_variable(data, buf, 0, replica_grouping=rg)
        full = ops.collectives.replicated_all_gather(ops.remote_load(buf, 0), group=rg)
    assert buf.meta_shape == v.shape == full.shape == (4,)


def test_popart_device_enums():
    assert compat_popart.SyncPattern.Full == 0
    assert compat_popart.DeviceConnectionType.OnDemand == 1
    assert compat_popart.DeviceSelectionCriterion.Random == 1
    assert compat_popart.VirtualGraphMode.Manual == 1  # pipelining scripts set it
    assert [e.name for e in compat_popart.CommGroupType][:4] == [
        "All",
        "Consecutive",
        "Orthogonal",
        "Ungrouped",
    ]
