"""Targets table, overrides, and out-of-memory errors (raised before any step) and warnings."""

import tracemalloc
from dataclasses import fields

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim.machine import BOW, IPU_MODEL, MK2, SOURCES, TARGETS, Machine, target
from popxl_core.sim.oom import OutOfMemoryError, OutOfMemoryWarning
from popxl_core.sim.plan import build_plan

HIDDEN = 10_000  # 3 x 10,000^2 + 784 x 10,000 + ... = 307,940,010 float32 weights


def test_every_constant_has_a_source_and_targets_differ_where_published():
    assert set(SOURCES) == {f.name for f in fields(Machine)} - {"name"}
    assert set(TARGETS) == {"ipu_hw", "ipu_hw:bow", "ipu_model", "cpu"}
    assert MK2.bytes_per_ipu == 1472 * 638_976 and IPU_MODEL.bytes_per_ipu == 4 * 638_976
    assert BOW.clock_hz == 1.85e9 and BOW.tiles_per_ipu == MK2.tiles_per_ipu
    assert MK2.oom_is_error and not IPU_MODEL.oom_is_error and IPU_MODEL.oom_warns


def test_overrides_and_their_errors():
    t = target("ipu_model", tiles_per_ipu=16, clock_hz=1e9, bytes_per_tile=1000, num_ipus=2)
    assert (t.bytes_per_ipu, t.clock_hz, t.num_ipus, t.name) == (16_000, 1e9, 2, "ipu_model")
    with pytest.raises(ValueError, match=r"cannot override sram_bytes_per_cycle_per_tile"):
        target("ipu_hw", sram_bytes_per_cycle_per_tile=1)
    with pytest.raises(ValueError, match=r"tiles_per_ipu must be positive, got 0"):
        target("ipu_hw", tiles_per_ipu=0)
    with pytest.raises(ValueError, match=r"Unknown device 'ipu_hw:mk3'"):
        target("ipu_hw:mk3")


def _two_ipu_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(4, np.float32), name="v")
        with popxl.ipu(1):
            ops.identity(v.copy_to_ipu(1), "on_ipu1")
    return ir


def test_session_takes_a_machine_and_checks_its_ipu_count():
    session = popxl.Session(_two_ipu_ir(), target("ipu_hw:bow", num_ipus=2))
    assert session.machine.name == "ipu_hw:bow" and sorted(session.plan.memory) == [0, 1]
    assert session.report.to_dict()["machine"]["clock_hz"] == 1.85e9
    with pytest.raises(ValueError, match=r"placed on IPU 1, but target 'ipu_hw' has num_ipus=1"):
        popxl.Session(_two_ipu_ir(), target("ipu_hw", num_ipus=1))


def _big_mlp_ir(batch: int = 8):
    """~308 M float32 weights (1.15 GiB) as broadcast fills: no host memory is allocated."""
    ir = popxl.Ir()
    widths = (784, HIDDEN, HIDDEN, HIDDEN, HIDDEN, 10)
    with ir.main_graph:
        x = ops.host_load(popxl.h2d_stream((batch, 784), popxl.float32, "x"))
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            w = popxl.variable(np.broadcast_to(np.float32(0.01), (a, b)), name=f"w{i}")
            x = x @ w
            x.producer.module_path = f"net.fc{i}"  # what popxl_fx sets on lowered ops
            x = ops.gelu(x) if i < len(widths) - 2 else x
        ops.host_store(popxl.d2h_stream(x.shape, x.dtype, "y"), x)
    return ir


def test_a_300m_weight_mlp_fails_on_ipu_hw_before_anything_is_allocated():
    tracemalloc.start()
    try:
        ir = _big_mlp_ir()
        with pytest.raises(OutOfMemoryError) as info:
            popxl.Session(ir, "ipu_hw")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 50e6  # the 1.2 GB of weights were never materialised
    n = 784 * HIDDEN + 3 * HIDDEN**2 + HIDDEN * 10
    plan = info.value.plan
    assert plan.memory[0].variables == 4 * n
    text = str(info.value)
    assert text.startswith("Out of memory on IPU 0 of 'ipu_hw' (estimate): the peak needs 1.15 GiB")
    assert "the IPU has 897 MiB (1472 tiles x 624 KiB)" in text
    assert "variable 'w1' 381.47 MiB" in text  # the largest always-live items
    assert "Largest tensors live at the peak:" in text and "torch module 'net.fc" in text
    assert "remote variables with phased execution" in text  # variables dominate
    assert "replicated tensor sharding" in text and "needs replication" in text
    assert ir._session is None  # the failed Session did not take the Ir


def _phased_big_mlp_ir(batch: int = 8):
    """The same MLP with its weights in Streaming Memory, one phase per layer: load the
    layer's weights, compute, drop them. The three 10,000 x 10,000 layers share one remote
    buffer of 3 entries (as seed 003's inner layers do)."""
    ir = popxl.Ir()
    widths = (784, HIDDEN, HIDDEN, HIDDEN, HIDDEN, 10)
    with ir.main_graph, popxl.in_sequence(True):  # in order: one layer's weights at a time
        x = ops.host_load(popxl.h2d_stream((batch, 784), popxl.float32, "x"))
        inner = popxl.remote_buffer((HIDDEN, HIDDEN), popxl.float32, entries=3)
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            if a == b:
                buf, entry = inner, i - 1
            else:
                buf, entry = popxl.remote_buffer((a, b), popxl.float32), 0
            value = np.broadcast_to(np.float32(0.01), (a, b))
            popxl.remote_variable(value, buf, entry, name=f"w{i}")
            x = x @ ops.remote_load(buf, entry)
            x = ops.gelu(x) if i < len(widths) - 2 else x
        ops.host_store(popxl.d2h_stream(x.shape, x.dtype, "y"), x)
    return ir


def test_the_same_mlp_with_remote_variables_and_phases_builds_on_ipu_hw():
    session = popxl.Session(_phased_big_mlp_ir(), "ipu_hw")  # no OutOfMemoryError
    data = session.report.to_dict()
    n = 784 * HIDDEN + 3 * HIDDEN**2 + HIDDEN * 10
    assert data["streaming_memory_bytes"] == 4 * n == 1_231_760_000  # ~1.2 GB off chip
    assert data["variable_bytes"] == 0
    # the largest phase's weights: one 10,000 x 10,000 float32 layer, 381.47 MiB
    assert data["variables_on_chip_peak_bytes"] == 4 * HIDDEN**2
    capacity = data["capacity_bytes_per_ipu"]
    assert 4 * HIDDEN**2 < data["peak_bytes_per_ipu"][0] < capacity < 4 * n
    assert data["out_of_memory"] == []
    assert data["remote_bytes_loaded"] == 4 * n  # every layer loaded once per run


def test_the_same_mlp_planned_for_ipu_model_warns():
    # planned only: a Session would copy the 1.2 GB of weights to the simulated device
    with pytest.warns(OutOfMemoryWarning, match=r"Out of memory on IPU 0 of 'ipu_model'"):
        plan = build_plan(_big_mlp_ir(), target("ipu_model", tiles_per_ipu=1472))
    assert plan.out_of_memory == [0]
    assert plan.report().to_dict()["peak_bytes_per_ipu"][0] > MK2.bytes_per_ipu


def test_a_session_on_the_4_tile_ipu_model_warns_and_runs():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((784, 1024), np.float32), name="w")  # 3.06 MiB > 2.44 MiB
        y = ops.host_load(popxl.h2d_stream((1, 784), popxl.float32, "x")) @ w
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype, "y"), y)
    with pytest.warns(OutOfMemoryWarning, match=r"'w' 3.06 MiB"):
        session = popxl.Session(ir, "ipu_model")
    with session:
        out = session.run({ir.get_all_h2d_streams().pop(): np.ones((1, 784), np.float32)})
    assert next(iter(out.values()))[0, 0] == 784.0


def test_activation_heavy_oom_suggests_recompute_and_batch_serialisation():
    tiny = target("ipu_hw", tiles_per_ipu=1, bytes_per_tile=64 * 1024)
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.ones(16, np.float32), name="v")
        a = ops.identity(ops.init((64, 256), popxl.float32, "big_act")) + 1.0
        a.producer.module_path = "encoder.layer0"
        ops.add(a, ops.reduce_sum(v))
    with pytest.raises(OutOfMemoryError) as info:
        popxl.Session(ir, tiny)
    text = str(info.value)
    assert "recomputation" in text and "batch serialisation" in text
    assert "remote variables" not in text  # 64 B of variables: not worth it
    assert "(made by Add." in text and "torch module 'encoder.layer0'" in text


def test_a_broadcast_fill_variable_is_a_fresh_value_that_runs_like_a_full_array():
    base = np.array(2.0)  # float64: downcast to float32 like any host data
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.broadcast_to(base, (3, 4)), name="v")
        ops.host_store(popxl.d2h_stream((3, 4), popxl.float32, "y"), v + 1.0)
    base[...] = 5.0  # the variable took its own copy of the value
    assert v.dtype == popxl.float32 and v._data.nbytes == 48 and not any(v._data.strides)
    session = popxl.Session(ir, "cpu")
    with session:
        out = session.run()
    np.testing.assert_array_equal(next(iter(out.values())), np.full((3, 4), 3.0, np.float32))
    assert session.get_tensor_data(v).flags.writeable  # the Session's host copy is a real array
