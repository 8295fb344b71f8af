"""The Session's plan: memory per IPU by category, liveness, code, OOM, cycles and the report.

Expected numbers are worked out by hand from the tensor sizes and the model's constants.
"""

import itertools
import json
from dataclasses import replace
from math import ceil

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim.cost import CODE_BYTES_PER_OP, CODE_BYTES_PER_TILE, CONTROL_CYCLES, CostModel
from popxl_core.sim.liveness import LivenessAnalysis
from popxl_core.sim.machine import IPU_MODEL, MK2
from popxl_core.sim.plan import OutOfMemoryError, OutOfMemoryWarning, build_plan
from popxl_core.sim.report import SimReport

LEAF_CODE = CODE_BYTES_PER_OP + CODE_BYTES_PER_TILE  # a leaf op on one tile (< 256 B tensors)
SYNC = 40  # ceil(2 x 15 ns x 1 hop x 1.327 GHz)
RUN = MK2.run_overhead_cycles  # the fixed cost of one Session.run


def f32(*shape):
    return np.zeros(shape, np.float32)


# memory by category --------------------------------------------------------------------
def test_variable_bytes_per_ipu_are_exact():
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(f32(3, 5), name="a")  # 60 B
        popxl.variable(np.zeros(7, np.float16), name="b")  # 14 B
        with popxl.ipu(1):
            popxl.variable(np.zeros((2, 2), np.int32), name="c")  # 16 B
    plan = build_plan(ir, MK2)
    assert plan.memory[0].variables == 74
    assert plan.memory[1].variables == 16
    assert plan.variable_bytes == {0: 74, 1: 16}
    assert plan.memory[0].total == 74 and plan.memory[0].code == 0


def test_constants_count_in_every_called_graph_and_stream_buffers_once():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((10,), popxl.float32, "x")  # 40 B stream buffer
        x = ops.host_load(s)
        y = x + popxl.constant(np.ones(10, np.float32), name="c10")  # 40 B constant
        body = ir.create_graph(lambda a: a + popxl.constant(np.ones(10, np.float32)), y)  # 40 B
        ops.repeat(body, 4, y)
        ops.host_load(s)  # the same stream again: its buffer is not counted twice
    mem = build_plan(ir, MK2).memory[0]
    assert mem.constants == 80
    assert mem.streams == 40


def test_liveness_of_a_chain_is_exact():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(1000), name="v")  # 4000 B, always-live
        t1 = ops.identity(v, "t1")
        t2 = ops.identity(t1, "t2")
        t3 = ops.add(t1, t2)  # t1 and t2 die here
        ops.identity(t3, "t4")  # never consumed: live at its step only
    plan = build_plan(ir, MK2)
    live = plan.liveness
    assert [step[0] for step in live.curve] == [4000, 8000, 12000, 8000]
    assert live.peak == {0: 12000} and live.peak_step == {0: 2}
    assert {t.name for t in live.top[0]} == {"t1", "t2", t3.id}
    assert {t.op for t in live.top[0]} == {
        f"{t.producer.type}.{t.producer.id}" for t in (t1, t2, t3)
    }
    assert plan.memory[0].activations == 12000
    # t1..t4 are 4000 B = 16 grains of 256 B, so each op is spread over 16 tiles
    code = 4 * (CODE_BYTES_PER_OP + 16 * CODE_BYTES_PER_TILE)
    assert plan.memory[0].code == code
    assert plan.memory[0].total == 4000 + 12000 + code


def test_inplace_output_aliases_its_input():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(100), name="v")  # 400 B
        t = ops.identity(v)
        u = ops.add_(t, 1.0)  # aliases t: no new bytes, keeps t alive
        ops.identity(u)
    curve = [step[0] for step in build_plan(ir, MK2).liveness.curve]
    assert curve == [400, 400, 800]


def test_inplace_on_a_variable_adds_nothing():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(100), name="v")
        ops.add_(v, 1.0)
    plan = build_plan(ir, MK2)
    assert plan.liveness.peak.get(0, 0) == 0 and plan.memory[0].activations == 0


def _outputs_live_to_end(a):
    b = ops.identity(a, "b")
    c = ops.identity(a, "c")
    d = ops.identity(c, "d")
    e = ops.identity(d, "e")
    return b, e


def test_graph_outputs_live_to_the_end_and_calls_add_the_callee_peak():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(25), name="v")  # S = 100 B
        g = ir.create_graph(_outputs_live_to_end, v)
        b, _ = ops.call(g, v)
        ops.identity(b)
    analysis = LivenessAnalysis()
    assert [s[0] for s in analysis.of(g).curve] == [100, 200, 300, 300]
    # main: at the call, the callee's peak (its outputs included); then b and identity(b)
    assert [s[0] for s in analysis.of(ir.main_graph).curve] == [300, 200]
    assert build_plan(ir, MK2).memory[0].activations == 300


def test_the_live_set_across_a_call_adds_to_the_callee_peak():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(25), name="v")  # 100 B
        keep = ops.identity(v, "keep")
        g = ir.create_graph(lambda a: ops.identity(ops.identity(a)), v)  # peak 200 B
        (out,) = ops.call(g, v)
        ops.add(keep, out)
    assert [s[0] for s in build_plan(ir, MK2).liveness.curve] == [100, 300, 300]


def test_liveness_is_per_ipu():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(25), name="v")
        a = ops.identity(v)  # 100 B on IPU 0
        w = a.copy_to_ipu(1)  # 100 B on IPU 1
        with popxl.ipu(1):
            ops.identity(w)
    plan = build_plan(ir, MK2)
    assert plan.liveness.curve == [{0: 100, 1: 0}, {0: 100, 1: 100}, {0: 0, 1: 200}]
    assert plan.memory[0].activations == 100 and plan.memory[1].activations == 200


# code and outlining --------------------------------------------------------------------
def _two_calls(same: bool):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(4), name="v")
        g1 = ir.create_graph(lambda a: a + a, v)
        g2 = g1 if same else ir.create_graph(lambda a: a + a, v)
        ops.call(g1, v)
        ops.call(g2, v)
    return build_plan(ir, MK2)


def test_outlined_subgraph_code_counts_once():
    outlined, copied = _two_calls(True), _two_calls(False)
    assert outlined.memory[0].code == 2 * CODE_BYTES_PER_OP + LEAF_CODE
    assert copied.memory[0].code == 2 * CODE_BYTES_PER_OP + 2 * LEAF_CODE
    assert [g.runs for g in outlined.graphs] == [1, 2]


@pytest.mark.parametrize("n", [1, 7])
def test_repeat_body_code_counts_once(n):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(4), name="v")
        body = ir.create_graph(lambda a: a + a, v)
        ops.repeat(body, n, v)
    plan = build_plan(ir, MK2)
    assert plan.memory[0].code == CODE_BYTES_PER_OP + LEAF_CODE
    assert plan.graphs[1].runs == n and plan.work.flops == 4 * n


# out of memory ---------------------------------------------------------------------------
def test_oom_is_raised_where_fatal_naming_ipu_sizes_and_contributors():
    tiny = replace(MK2, name="tiny", tiles_per_ipu=2, bytes_per_tile=1024)  # 2 KiB per IPU
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(f32(300), name="small")  # 1200 B
        with popxl.ipu(1):
            popxl.variable(f32(750), name="big")  # 3000 B
    with pytest.raises(OutOfMemoryError) as info:
        build_plan(ir, tiny)
    err = info.value
    assert isinstance(err, MemoryError)
    text = str(err)
    assert "IPU 1 of 'tiny'" in text and "2.93 KiB" in text and "2 KiB" in text
    assert "variable 'big' 2.93 KiB" in text
    assert err.plan.out_of_memory == [1]
    assert build_plan(ir, replace(tiny, oom_is_error=False)).out_of_memory == [1]


def _huge_activation_ir():
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(f32(4), name="w")
        ops.init((300, 1024, 1024), popxl.float32, "huge")  # 1.17 GiB, never allocated here
    return ir


def test_session_on_ipu_hw_raises_oom_and_ipu_model_only_reports_it():
    ir = _huge_activation_ir()
    with pytest.raises(OutOfMemoryError, match=r"IPU 0 of 'ipu_hw'.*needs 1\.17 GiB.*897 MiB"):
        popxl.Session(ir, "ipu_hw")
    with pytest.warns(OutOfMemoryWarning, match="'ipu_hw' would stop here"):
        session = popxl.Session(ir, "ipu_model")  # the same Ir: the failed one did not own it
    report = session.report
    assert report.plan.out_of_memory == [0]
    assert "OUT OF MEMORY" in report.summary()
    assert report.to_dict()["memory"]["0"]["out_of_memory"] is True


def test_mlp_weights_fit_ipu_hw_but_not_the_4_tile_ipu_model():
    ir = popxl.Ir()
    with ir.main_graph:
        popxl.variable(f32(784, 1024), name="w")  # 3.06 MiB > 2.44 MiB (4 tiles)
    assert build_plan(ir, MK2).out_of_memory == []
    with pytest.warns(OutOfMemoryWarning):
        assert build_plan(ir, IPU_MODEL).out_of_memory == [0]
    assert IPU_MODEL.bytes_per_ipu == 4 * 638_976 and MK2.bytes_per_ipu == 1472 * 638_976


# cycles -----------------------------------------------------------------------------------
def test_add_cycles_are_the_bsp_formula():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(f32(64, 64), name="a")  # 16 KiB = 64 grains -> 64 tiles
        b = popxl.variable(f32(64, 64), name="b")
        ops.add(a, b)
    plan = build_plan(ir, MK2)
    # compute: max(4096 flops / (64 x 32), 3 x 16384 B / (64 x 24)) + 200; no exchange
    assert plan.cycles == 32 + 200 + SYNC + RUN
    assert plan.work.cycles.compute == 232 and plan.work.cycles.exchange == 0


def test_broadcast_operand_is_exchanged():
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(f32(64, 64), name="a")
        b = popxl.variable(f32(64), name="b")  # 256 B moved to the 64 tiles
        ops.add(a, b)
    c = build_plan(ir, MK2).work.cycles
    assert c.exchange == 1 and c.compute == ceil((16384 * 2 + 256) / (64 * 24)) + 200


def test_host_transfers_cost_latency_plus_bandwidth():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((1000,), popxl.float32, "x")
        o = popxl.d2h_stream((1000,), popxl.float32, "y")
        ops.host_store(o, ops.host_load(s))
    plan = build_plan(ir, MK2)
    one = ceil((MK2.host_latency_s + 4000 / MK2.host_bytes_per_s) * MK2.clock_hz)
    assert plan.work.cycles.host == 2 * one and plan.cycles == 2 * (one + SYNC) + RUN
    assert plan.work.host_bytes_in == 4000 and plan.work.host_bytes_out == 4000


def _repeat_plan(n: int):
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(8, 8), name="v")
        body = ir.create_graph(lambda a: a + a, v)
        ops.repeat(body, n, v)
    return build_plan(ir, MK2), body


def test_cycles_grow_linearly_with_repeat_count():
    cycles = [_repeat_plan(n)[0].cycles for n in range(1, 5)]
    _, body = _repeat_plan(1)
    per_iteration = CostModel(MK2).graph_work(body).cycles.total + CONTROL_CYCLES
    assert [b - a for a, b in itertools.pairwise(cycles)] == [per_iteration] * 3
    assert cycles[0] == per_iteration + RUN  # nothing else in the main graph


def test_call_costs_its_callee_and_if_its_dearer_branch():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(f32(8, 8), name="v")
        cheap = ir.create_graph(lambda a: a + a, v)
        dear = ir.create_graph(lambda a: (a + a) + a, v)
        flag = popxl.constant(True, popxl.bool)
        ops.conditional(flag, cheap, dear, then_inputs=[v], else_inputs=[v])
    plan = build_plan(ir, MK2)
    add = CostModel(MK2).graph_work(cheap).cycles.total
    assert plan.cycles == CONTROL_CYCLES + 2 * add + RUN
    assert plan.work.flops == 128


@pytest.mark.skipif(not hasattr(ops, "matmul"), reason="ops.matmul not written yet")
def test_matmul_costs_2mnk_flops_on_the_amp_rate():
    m, k, n = 8, 784, 512
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(f32(m, k), name="x")
        w = popxl.variable(f32(k, n), name="w")
        ops.matmul(x, w)
    plan = build_plan(ir, MK2)
    assert plan.work.flops == 2 * m * n * k
    mm = ir.main_graph.ops[0]
    tiles = ceil(k * n * 4 / 256)  # the weight is the largest tensor: 1568 grains -> 1472
    assert min(tiles, 1472) == 1472 == plan.ops[0].tiles
    nbytes = mm.opdef.cost([x.spec, w.spec], [mm.outputs[0].spec], mm.attrs).bytes
    c = plan.work.cycles
    assert c.compute == max(ceil(2 * m * n * k / (1472 * 32)), ceil(nbytes / (1472 * 24))) + 200
    assert c.exchange == ceil((m * k + k * n) * 4 / (1472 * 4))


# report --------------------------------------------------------------------------------
def test_session_report_is_a_simreport_built_once():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((4, 4), np.float32), name="w")
        s = popxl.h2d_stream((4, 4), popxl.float32, "x")
        o = popxl.d2h_stream((4, 4), popxl.float32, "y")
        ops.host_store(o, ops.host_load(s) + w)
    session = popxl.Session(ir, "ipu_hw")
    report = session.report
    assert isinstance(report, SimReport) and session.report is report
    text = report.summary()
    assert str(report) == text
    lines = text.splitlines()
    assert lines[0] == (
        "IPU memory (estimate, ipu_hw: 1472 tiles x 624 KiB = 897 MiB per IPU, per replica)"
    )
    assert lines[1].startswith("  IPU 0: variables 64 B, constants 0 B, code ")
    assert lines[2].startswith(f"Time per run (estimate): {report.plan.cycles:,} cycles = ")
    assert "FLOPs" in lines[3] and "host in 64 B, out 64 B" in lines[3]
    data = json.loads(json.dumps(report.to_dict()))
    assert data["estimate"] is True and data["memory"]["0"]["variables"] == 64
    assert data["flops"] == 16 and data["cycles"]["total"] == report.plan.cycles
    with session:
        out = session.run({s: np.full((4, 4), 2.0, np.float32)})
    assert np.all(out[o] == 3.0) and session.report is report
