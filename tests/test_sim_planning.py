"""Planning mode (popxl_core.planning): the same plan as a real build, no values, no run."""

from functools import partial

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.shape_only import known_shape
from addons.task_session import TaskSession
from popxl_core import ops
from popxl_core.planning import PlanOnlyError, planning
from popxl_core.sim.oom import OutOfMemoryError, OutOfMemoryWarning


class _Linear(addons.Module):
    def build(self, x):
        w = self.add_variable_input("w", _counted(np.random.rand, (8, 8)), popxl.float32)
        return x @ w


_draws = [0]


def _counted(fn, shape):
    def draw():
        _draws[0] += 1
        return fn(*shape)

    return draw


def _program(ir: popxl.Ir) -> dict:
    """A small replicated program with every kind of variable: plain, remote (one buffer
    entry per layer, loaded in a subgraph), replica-sharded (gathered), from a factory."""
    with ir.main_graph, popxl.in_sequence():
        x_in = popxl.h2d_stream((4, 8), popxl.float32, "x")
        facts, graph = _Linear().create_graph(x_in.spec)
        buf = addons.named_variable_buffers(facts, entries=2, shard_over_dict=False)
        layers = [facts.init_remote(buf, n, f"layer{n}") for n in range(2)]
        w = popxl.variable(np.random.rand(8, 8).astype(np.float32), name="w")
        full, shard = popxl.replica_sharded_variable(np.ones((4, 8), np.float32), name="s")
        x = ops.host_load(x_in)
        for n in range(2):
            load, names = addons.load_remote_graph(buf)
            (x,) = graph.bind(addons.NamedTensors.pack(names, load.call(n))).call(x)
        y = ops.matmul(x + ops.collectives.replicated_all_gather(shard).reshape((4, 8)), w)
        out = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(out, y)
    return {"w": w, "full": full, "layers": layers, "x": x_in}


def _planned_ir(plan: bool) -> popxl.Ir:
    if not plan:
        return popxl.Ir(replication=2)
    with planning():
        return popxl.Ir(replication=2)


def _session(plan: bool):
    ir = _planned_ir(plan)
    tensors = _program(ir)
    return popxl.Session(ir, "ipu_hw"), tensors


def test_the_plan_is_the_plan_of_the_program_really_built():
    real, _ = _session(plan=False)
    planned, tensors = _session(plan=True)
    assert planned.ir.planning and not real.ir.planning
    assert planned.report.to_dict() == real.report.to_dict()
    assert planned.report.summary() == real.report.summary()
    assert planned.plan.streaming_memory_bytes > 0
    # the variables hold their shape and dtype, not values: one broadcast zero each
    for v in (tensors["w"], tensors["full"], tensors["layers"][1].w):
        assert not any(v._data.strides) and v._data.shape == tuple(v.shape)


def test_running_or_reading_values_raises():
    session, tensors = _session(plan=True)
    x = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(PlanOnlyError, match="planning mode.*nothing to run"):
        with session:
            session.run({tensors["x"]: x})
    with pytest.raises(PlanOnlyError, match="^run: "):
        session.run({tensors["x"]: x})
    with pytest.raises(PlanOnlyError, match="get_tensor_data"):
        session.get_tensor_data(tensors["w"])
    with pytest.raises(PlanOnlyError, match="write_variables_data"):
        session.write_variable_data(tensors["w"], np.ones((8, 8), np.float32))


def test_a_task_session_is_planned_and_refuses_to_run():
    ir = _planned_ir(True)
    state = addons.NamedTensors(w=_program(ir)["w"])
    session = TaskSession([], [], state, ir=ir, device_desc="ipu_hw")
    assert isinstance(session, TaskSession) and session.state.w is state.w
    with pytest.raises(PlanOnlyError, match="^run: "):
        session.run({})
    assert session.session_state["steps"] == 0


def test_factories_draw_nothing_and_write_no_memmap_files(tmp_path):
    _draws[0] = 0
    with planning():
        ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = _Linear().create_graph(popxl.TensorSpec((4, 8), popxl.float32))
        built = _draws[0]  # one value gives its shape (popxl.addons draws a test value too)
        for n in range(3):
            facts.init(f"l{n}")
        facts.init("m", memmap_dir=str(tmp_path / "mm"))
    assert built == 1 and _draws[0] == 1 and not (tmp_path / "mm").exists()


def test_an_out_of_memory_plan_is_reported_with_a_warning():
    def build():
        ir = popxl.Ir()
        with ir.main_graph:
            w = popxl.variable(np.broadcast_to(np.float32(0), (2**28,)), name="big")  # 1 GiB
            ops.var_updates.accumulate_(w, popxl.constant(1.0))
        return ir

    with pytest.raises(OutOfMemoryError):
        popxl.Session(build(), "ipu_hw")
    with planning():
        ir = build()
    with pytest.warns(OutOfMemoryWarning, match="planning mode: reported, not raised"):
        session = popxl.Session(ir, "ipu_hw")
    assert session.plan.out_of_memory == [0]
    assert "OUT OF MEMORY by 127.07 MiB" in session.report.summary()


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("", False)])
def test_the_environment_switch_sets_the_mode_of_new_irs(monkeypatch, value, expected):
    monkeypatch.setenv("POPXL_SIM_PLAN", value)
    assert popxl.Ir().planning is expected


class _Huge(addons.Module):
    def build(self, x):
        # 2**40 float32 values (4 TiB): planned from the samplers' size arguments, never drawn
        w = self.add_variable_input(
            "w", partial(np.random.normal, 0, 0.02, (2**20, 2**20)), x.dtype
        )
        b = self.add_variable_input("b", partial(np.random.uniform, size=2**20), x.dtype)
        return x @ w + b


def test_known_samplers_are_planned_from_their_size_without_drawing():
    with planning():
        ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.h2d_stream((1, 2**20), popxl.float32, "x")
        facts, graph = _Huge().create_graph(x.spec)
        tensors = facts.init()
        graph.bind(tensors).call(ops.host_load(x))
    assert tensors.w.shape == (2**20, 2**20) and tensors.b.shape == (2**20,)
    with pytest.warns(OutOfMemoryWarning):
        assert popxl.Session(ir, "ipu_hw").plan.memory[0].variables == 2**42 + 2**22


def test_known_shape_reads_only_size_arguments_of_known_samplers():
    assert known_shape(partial(np.random.normal, 0, 1, (2, 3))) == (2, 3)
    assert known_shape(partial(np.random.default_rng(0).normal, size=4)) == (4,)
    assert known_shape(partial(np.zeros, (5,))) == (5,)
    assert known_shape(partial(np.random.normal, 0, 1)) is None  # a scalar: drawn
    assert known_shape(partial(np.arange, 6)) is None and known_shape(lambda: 0) is None


SCRIPT = """
import numpy as np, popxl_core as popxl
from popxl_core import ops
ir = popxl.Ir()
with ir.main_graph:
    w = popxl.variable(np.ones((64, 64), np.float32), name="w")
    ops.var_updates.accumulate_(w, popxl.constant(1.0))
session = popxl.Session(ir, "ipu_hw")
with session:
    session.run()
"""


def test_a_script_run_unchanged_under_the_switch_is_planned_and_reported(tmp_path, monkeypatch):
    from popxl_core import report

    (tmp_path / "app.py").write_text(SCRIPT)
    monkeypatch.setenv("POPXL_SIM_PLAN", "1")
    assert report.main(["--out", str(tmp_path / "out"), str(tmp_path / "app.py")]) == 0
    assert "variables 16 KiB" in (tmp_path / "out" / "session_1.txt").read_text()
