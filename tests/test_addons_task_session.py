"""addons.TaskSession (state, steps, checkpoints), write_variables_pb and memmap variables
(popxl_api.md §4.9, §1.6, §4.4): checked against the values written and the plain Session."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import addons
import addons.remote
import popxl_core as popxl
from popxl_core import ops


def _program(init: float = 1.0, extra: bool = False):
    """w += x each run (x from the host); y = w * 2 to the host. State: w (and b if extra)."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(np.full(3, init, np.float32), name="w")
        state = {"layer.w": w}
        if extra:
            state["layer.b"] = popxl.variable(np.zeros(2, np.float32), name="b")
        inputs = addons.InputStreams(x=((3,), popxl.float32))
        outputs = addons.OutputStreams(y=((3,), popxl.float32))
        ops.var_updates.accumulate_(w, ops.host_load(inputs.x))
        ops.host_store(outputs.y, w * 2)
    state = addons.NamedTensors.from_dict(state)
    return addons.TaskSession(inputs, outputs, state, ir=ir, device_desc="ipu_model")


def test_run_counts_steps_and_named_data():
    s = _program()
    x = np.array([1, 2, 3], np.float32)
    with s:
        for _ in range(2):
            out = s.run({s.inputs.x: x})
    assert s.session_state["steps"] == 2
    np.testing.assert_array_equal(out[s.outputs.y], (1 + 2 * x) * 2)
    data = s.get_named_tensors_data()
    assert isinstance(data, addons.NamedTensorData) and data.keys_flat() == ["layer.w"]
    np.testing.assert_array_equal(data.layer.w, 1 + 2 * x)


def test_checkpoint_round_trip_and_layout(tmp_path):
    s = _program()
    with s:
        s.run({s.inputs.x: np.ones(3, np.float32)})
        s.add_session_state_info({"epoch": 4})
        s.save_checkpoint(str(tmp_path / "ckpt"))
    # popxl.addons' layout: model/<key>.npz per state key
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["model", "session_info.json"]
    assert os.listdir(tmp_path / "ckpt" / "model") == ["layer.w.npz"]
    assert json.loads((tmp_path / "ckpt" / "session_info.json").read_text()) == {
        "steps": 1,
        "epoch": 4,
    }
    with np.load(tmp_path / "ckpt" / "model" / "layer.w.npz") as npz:
        np.testing.assert_array_equal(npz["layer.w"], np.full(3, 2.0, np.float32))
    t = _program(init=7.0)
    # works detached, like write_variables_data; 'epoch' is new to t's session_state
    with pytest.warns(UserWarning, match=r"session_state .* keys only in it: \['epoch'\]"):
        t.load_checkpoint(str(tmp_path / "ckpt"))
    assert t.session_state == {"steps": 1, "epoch": 4}
    with t:
        out = t.run({t.inputs.x: np.zeros(3, np.float32)})
    np.testing.assert_array_equal(out[t.outputs.y], np.full(3, 4.0, np.float32))
    assert t.session_state["steps"] == 2


def test_max_checkpoints_keeps_the_newest(tmp_path):
    s = _program()
    s.max_checkpoints = 2
    dirs = [str(tmp_path / f"step{i}") for i in range(3)]
    for d in dirs:
        s.save_checkpoint(d)
    assert [os.path.exists(d) for d in dirs] == [False, True, True]


def test_report_missing(tmp_path):
    small, big = _program(), _program(extra=True)
    big.save_checkpoint(str(tmp_path / "big"))
    with pytest.warns(UserWarning, match=r"data keys not in the state \(ignored\): \['layer.b'\]"):
        small.load_checkpoint(str(tmp_path / "big"))
    with pytest.raises(ValueError, match=r"state keys not in the data .*\['layer.b'\]"):
        big.load_from_session(small, report_missing="error")
    small.load_checkpoint(str(tmp_path / "big"), report_missing="none")
    with pytest.raises(ValueError, match="report_missing must be one of"):
        small.load_from_session(big, report_missing="loud")
    with pytest.raises(FileNotFoundError, match="model/<key>.npz per state key"):
        small.load_checkpoint(str(tmp_path / "nothing"))


def test_checkpoint_without_session_info_or_a_key(tmp_path):
    """As popxl.addons: a missing session_info.json restarts at step 0; a missing key is
    reported ('error' raises) and the variable left as it is."""
    s = _program(init=2.0, extra=True)
    with s:
        s.run({s.inputs.x: np.ones(3, np.float32)})
    s.save_checkpoint(str(tmp_path / "c"))
    os.remove(tmp_path / "c" / "session_info.json")
    os.remove(tmp_path / "c" / "model" / "layer.b.npz")
    t = _program(init=0.0, extra=True)
    with pytest.raises(ValueError, match=r"state keys not in the data .*\['layer.b'\]"):
        t.load_checkpoint(str(tmp_path / "c"), report_missing="error")
    t.load_checkpoint(str(tmp_path / "c"), report_missing="none")
    assert t.session_state == {"steps": 0}
    np.testing.assert_array_equal(t.get_named_tensors_data().layer.w, np.full(3, 3.0))


def test_load_from_session_copies_state():
    a, b = _program(init=3.0), _program(init=0.0)
    b.load_from_session(a)
    np.testing.assert_array_equal(b.get_named_tensors_data().layer.w, np.full(3, 3.0))


def test_state_must_be_variables():
    ir = popxl.Ir()
    with ir.main_graph:
        c = popxl.constant(np.ones(2, np.float32), name="c")
    with pytest.raises(TypeError, match="state 'c' is Tensor.* holds variables"):
        addons.TaskSession([], [], addons.NamedTensors(c=c), ir=ir, device_desc="ipu_model")


def test_write_variables_pb_casts_and_refuses_changed_values():
    s = _program()
    w = s.state.layer.w
    addons.write_variables_pb(s, {w: np.array([1, 2, 3], np.int64)})
    np.testing.assert_array_equal(s.get_tensor_data(w), [1.0, 2.0, 3.0])
    ir = popxl.Ir()
    with ir.main_graph:
        i = popxl.variable(np.zeros(2, np.int32), name="i")
    sess = popxl.Session(ir, "ipu_model")
    with pytest.raises(ValueError):
        addons.write_variables_pb(sess, {i: np.array([0.5, 1.0])})


# memmap variables -------------------------------------------------------------------------
def test_memmap_variable_is_its_host_buffer(tmp_path):
    path = tmp_path / "w.npy"
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(3,))
    mm[:] = 1.0
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(mm, name="w")
        ops.var_updates.accumulate_(v, popxl.constant(np.ones(3, np.float32)))
    with popxl.Session(ir, "ipu_model") as s:
        s.run()
        s.run()
    np.testing.assert_array_equal(np.load(path), [3.0, 3.0, 3.0])  # the file holds the value
    assert isinstance(s.get_tensor_data(v), np.memmap)


def test_memmap_bad_input(tmp_path):
    mm = np.lib.format.open_memmap(tmp_path / "m.npy", mode="w+", dtype=np.float64, shape=(2, 3))
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(ValueError, match="must already be in C-ordered"):
            popxl.variable(mm.T, downcast=False)
        with pytest.raises(ValueError, match="the `dtype` parameter must be None or"):
            popxl.variable(mm, popxl.float32)
        with pytest.raises(ValueError, match="requires downcasting"):  # PopXL: no copy
            popxl.variable(mm)
        assert popxl.variable(mm, downcast=False).dtype == popxl.float64


def test_factories_memmap_dir_and_read_only_if_exists(tmp_path):
    def build(value):
        ir = popxl.Ir()
        with ir.main_graph:
            f = addons.NamedVariableFactories(
                a=addons.VariableFactory(lambda: np.full(2, value, np.float32), name="a")
            )
            vs = f.init(memmap_dir=str(tmp_path), read_only_if_exists=True)
        return ir, vs

    def on_disk():  # raw values, no .npy header (as popxl.addons writes them)
        return np.fromfile(tmp_path / "a.npy", np.float32)

    ir, vs = build(5.0)
    np.testing.assert_array_equal(on_disk(), [5.0, 5.0])
    ir2, vs2 = build(9.0)  # the file exists: read back, not re-drawn
    with popxl.Session(ir2, "ipu_model") as s:
        np.testing.assert_array_equal(s.get_tensor_data(vs2.a), [5.0, 5.0])
        s.write_variable_data(vs2.a, np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(on_disk(), [5.0, 5.0])  # read only
    assert isinstance(vs.a._data, np.memmap) and vs.a._memmap_arr is vs.a._data


def test_factories_reuse_memmaps_and_init_remote(tmp_path):
    """An existing memmap file is the variable's value (opened "r+": training writes it back),
    for init and init_remote alike; get_tensor_data returns that memmap."""

    def factories(value):
        return addons.NamedVariableFactories(
            w=addons.VariableFactory(lambda: np.full(3, value, np.float32), name="w")
        )

    ir = popxl.Ir()
    with ir.main_graph:
        first = factories(1.0).init("m", memmap_dir=str(tmp_path))
        ops.var_updates.accumulate_(first.w, popxl.constant(np.ones(3, np.float32)))
    with popxl.Session(ir, "ipu_model") as s:
        s.run()
    np.testing.assert_array_equal(np.fromfile(tmp_path / "m.w.npy", np.float32), [2.0] * 3)
    ir2 = popxl.Ir()
    with ir2.main_graph, popxl.in_sequence():  # the store after the update (PopXL's rule)
        bufs = addons.named_variable_buffers(factories(7.0))
        again = factories(7.0).init_remote(bufs, 0, "m", memmap_dir=str(tmp_path))
        loaded = addons.remote.load_remote(bufs)
        ops.var_updates.accumulate_(loaded.w, popxl.constant(np.ones(3, np.float32)))
        addons.remote.store_remote(bufs, loaded)
    assert again.w._memmap_arr is not None
    with popxl.Session(ir2, "ipu_model") as s:
        s.run()
    got = s.get_tensor_data(again.w)
    assert got is again.w._memmap_arr
    np.testing.assert_array_equal(got, [3.0] * 3)  # 1 + 1 + 1: the file's value was used


def test_checkpoint_copies_memmap_files(tmp_path):
    """A memmap-backed state variable is saved as its file, copied into model/ (popxl.addons)."""
    ir = popxl.Ir()
    with ir.main_graph:
        f = addons.NamedVariableFactories(
            w=addons.VariableFactory(lambda: np.arange(3, dtype=np.float32), name="w")
        )
        state = f.init("net", memmap_dir=str(tmp_path / "mm"))
        ops.var_updates.accumulate_(state.w, popxl.constant(np.ones(3, np.float32)))
    s = addons.TaskSession([], [], state, ir=ir, device_desc="ipu_model")
    with s:
        s.run()
    s.save_checkpoint(str(tmp_path / "ckpt"))
    assert os.listdir(tmp_path / "ckpt" / "model") == ["net.w.npy"]
    saved = np.fromfile(tmp_path / "ckpt" / "model" / "net.w.npy", np.float32)
    np.testing.assert_array_equal(saved, [1.0, 2.0, 3.0])
