"""addons.pipelined_execution: a 2- and 3-stage pipeline over several simulated IPUs equals
the same stages run one micro-batch at a time (exactly: the same ops on the same values), and
its stash buffers count in the consumer IPU's memory."""

from __future__ import annotations

import numpy as np
import pytest

import addons
import popxl_core as popxl
from addons.transforms.repeat_graph import repeat_graph
from popxl_core import ops

RNG = np.random.default_rng(0)
W0 = RNG.normal(0, 0.3, (6, 8)).astype(np.float32)
W1 = RNG.normal(0, 0.3, (8, 4)).astype(np.float32)
W2 = RNG.normal(0, 0.3, (4, 3)).astype(np.float32)


def _mlp(pipelined: bool, steps: int, three: bool = False):
    """Stage 0 (IPU 0): load x, gelu(x @ w0) -> IPU 1. Stage 1 (IPU 1): y = h @ w1, plus an
    accumulation of y and a stash of x across both stages; stage 2 (IPU 2): y @ w2."""
    ir = popxl.Ir()
    ir.num_host_transfers = steps
    with ir.main_graph:
        with popxl.ipu(0):
            w0 = popxl.variable(W0, name="w0")
            x_s = popxl.h2d_stream((2, 6), popxl.float32, "x")
        with popxl.ipu(1):
            w1 = popxl.variable(W1, name="w1")
            acc = popxl.variable(np.zeros((2, 4), np.float32), name="acc")
        with popxl.ipu(2 if three else 1):
            w2 = popxl.variable(W2, name="w2")
        y_s = popxl.d2h_stream((2, 3 if three else 4), popxl.float32, "y")
        x_back = popxl.d2h_stream((2, 6), popxl.float32, "x_back")
        ctx = addons.pipelined_execution(steps) if pipelined else _Plain()
        with ctx as p:
            with p.stage(0), popxl.ipu(0):
                x = ops.host_load(x_s)
                h = ops.gelu(x @ w0).copy_to_ipu(1)
                x1 = x.copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                y = h @ w1
                ops.var_updates.accumulate_(acc, y)
                x_st = p.stash_and_restore_tensor(x1)
                if not three:
                    ops.host_store(y_s, y)
                    ops.host_store(x_back, x_st)
                else:
                    y2, x2 = y.copy_to_ipu(2), x_st.copy_to_ipu(2)
            if three:
                with p.stage(2), popxl.ipu(2):
                    ops.host_store(y_s, y2 @ w2)
                    ops.host_store(x_back, x2)
    if not pipelined:
        repeat_graph(ir.main_graph, steps)
    return ir, x_s, y_s, x_back, acc


class _Plain:
    """The same code with no pipeline: stages are no-ops."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def stage(self, i):
        return _Noop()

    def stash_and_restore_tensor(self, t):
        return t


class _Noop:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _run(built, data):
    ir, x_s, y_s, x_back, acc = built
    with popxl.Session(ir, "ipu_hw") as s:
        out = s.run({x_s: data})
        return out[y_s], out[x_back], s.get_tensor_data(acc).copy(), s


@pytest.mark.parametrize("steps, three", [(4, False), (1, False), (5, True), (2, True)])
def test_pipeline_equals_unpipelined_loop(steps, three):
    data = RNG.normal(0, 1, (steps, 2, 6)).astype(np.float32)
    if steps == 1:
        data = data[0]
    want = _run(_mlp(False, steps, three), data)
    got = _run(_mlp(True, steps, three), data)
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(g, w)  # exact: every micro-batch meets the same ops
    np.testing.assert_array_equal(got[1], data)  # the stashed x comes back with its batch


def test_schedule_has_ramp_up_main_and_ramp_down():
    ir, *_ = _mlp(True, 6, three=True)
    loops = [op for op in ir.main_graph.ops if op.type == "Loop"]
    assert [op.attrs["repeat_count"] for op in loops] == [6 - 2]  # 2 ramp-up, 4 main, 2 down
    body = loops[0].called_graphs[0]
    assert {op.ipu for op in body.ops} == {0, 1, 2}


def test_stash_memory_is_on_the_consumer_ipu():
    data = RNG.normal(0, 1, (5, 2, 6)).astype(np.float32)
    sess = _run(_mlp(True, 5, three=True), data)[3]
    stash = [t for t in sess.ir.main_graph.tensors if "_stash" in t.name]
    # h and x cross stage 0 -> 1 (IPU 1); y and x cross stage 1 -> 2 (IPU 2): one step each,
    # so two buffers per tensor, on the IPU that reads them
    assert sorted((t.ipu, t.nelms) for t in stash) == [
        (1, 12),
        (1, 12),
        (1, 16),
        (1, 16),
        (2, 8),
        (2, 8),
        (2, 12),
        (2, 12),
    ]
    on_ipu2 = sum(t.nelms * 4 for t in stash if t.ipu == 2)
    assert max(b for _, b in sess.report.liveness(2)) >= on_ipu2
    assert len(sess.report.totals()["peak_bytes_per_ipu"]) == 3


def test_bad_input():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2), np.float32))
        with pytest.raises(RuntimeError, match="must be in a stage"):
            with addons.pipelined_execution(2):
                w @ w
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2), np.float32))
        with pytest.raises(RuntimeError, match="stage 0 opened after stage 1"):
            with addons.pipelined_execution(2) as p:
                with p.stage(1):
                    w @ w
                with p.stage(0):
                    w @ w
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2), np.float32))
        with addons.pipelined_execution(2) as p:
            with p.stage(0):
                y = w @ w
        with pytest.raises(ValueError, match="is no longer in graph 'main': a transform moved"):
            ops.host_store(popxl.d2h_stream((2, 2), popxl.float32), y)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        with addons.pipelined_execution(0):
            pass


def _training(pipelined: bool, steps: int):
    """Forward on IPU 0 (an outlined gelu layer) and IPU 1, backward on IPU 1 then IPU 0 with
    the forward activations stashed across the stages; gradients accumulate on each IPU."""
    ir = popxl.Ir()
    ir.num_host_transfers = steps
    with ir.main_graph:
        with popxl.ipu(0):
            w0 = popxl.variable(W0, name="w0")
            acc0 = popxl.variable(np.zeros_like(W0), name="acc0")
            x_s = popxl.h2d_stream((2, 6), popxl.float32, "x")
            g0 = ir.create_graph(lambda x, w: ops.gelu(x @ w), x_s.spec, w0.spec)
            bwd0 = popxl.transforms.autodiff(g0)
        with popxl.ipu(1):
            w1 = popxl.variable(W1, name="w1")
            acc1 = popxl.variable(np.zeros_like(W1), name="acc1")
        y_s = popxl.d2h_stream((2, 4), popxl.float32, "y")
        ctx = addons.pipelined_execution(steps) if pipelined else _Plain()
        with ctx as p:
            with p.stage(0), popxl.ipu(0):
                info0 = ops.call_with_info(g0, ops.host_load(x_s), w0)
                h = info0.outputs[0].copy_to_ipu(1)
            with p.stage(1), popxl.ipu(1):
                y = h @ w1  # loss 0.5 * sum(y ** 2): dL/dy = y
                ops.host_store(y_s, y)
                ops.var_updates.accumulate_(acc1, h.T @ y)
                dh = (y @ w1.T).copy_to_ipu(0)
            with p.stage(2), popxl.ipu(0):
                acts = (
                    p.stash_and_restore_activations(info0, bwd0)
                    if pipelined
                    else bwd0.inputs_dict(info0)
                )
                _, dw0 = ops.call(bwd0.graph, dh, inputs_dict=acts)
                ops.var_updates.accumulate_(acc0, dw0)
    if not pipelined:
        repeat_graph(ir.main_graph, steps)
    return ir, x_s, y_s, acc0, acc1


@pytest.mark.parametrize("steps", [6, 2])
def test_pipelined_training_equals_unpipelined(steps):
    data = RNG.normal(0, 1, (steps, 2, 6)).astype(np.float32)
    results = []
    for pipelined in (False, True):
        ir, x_s, y_s, acc0, acc1 = _training(pipelined, steps)
        with popxl.Session(ir, "ipu_hw") as s:
            y = s.run({x_s: data})[y_s]
            results.append((y, s.get_tensor_data(acc0).copy(), s.get_tensor_data(acc1).copy()))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)
    assert np.abs(results[1][1]).max() > 0  # the stashed activations reached the backward


def _serial_and_overlapped(model, ops_):
    """(sum of every op's cycles, the busiest IPU's cycles + the IPU copies' cycles)."""
    per_ipu, copies = {}, 0
    for op in ops_:
        c = model.op_work(op).cycles.total
        if op.type == "IpuCopy":
            copies += c
        else:
            per_ipu[op.ipu] = per_ipu.get(op.ipu, 0) + c
    return sum(per_ipu.values()) + copies, max(per_ipu.values()) + copies


def test_cycle_estimate_runs_the_stages_of_a_time_step_at_once():
    """The machine model runs a pipeline's stages concurrently, each on its IPU: one time
    step costs its busiest IPU plus the IPU copies, not the sum over the IPUs; FLOPs and
    traffic still count every op."""
    ir = _mlp(True, 6, three=True)[0]
    plan = popxl.Session(ir, "ipu_hw").plan
    model = plan.model
    (loop,) = [op for op in ir.main_graph.ops if op.type == "Loop"]
    body = loop.called_graphs[0]
    serial, overlapped = _serial_and_overlapped(model, body.ops)
    assert len({op.ipu for op in body.ops}) == 3 and overlapped < serial
    assert model.graph_work(body).cycles.total == overlapped
    assert model.graph_work(body).flops == sum(model.op_work(op).flops for op in body.ops)
    # the whole program: every ramp step overlapped too, and less than the serial sum
    main_serial = (
        sum(model.op_work(op).cycles.total for op in ir.main_graph.ops if op.type != "Loop")
        + model.op_work(loop).cycles.total
    )
    assert plan.work.cycles.total - plan.work.cycles.launch < main_serial


def test_unpipelined_multi_ipu_ops_stay_serial():
    """Outside a pipeline nothing is assumed to overlap: the loop body costs the sum."""
    ir = _mlp(False, 4, three=True)[0]
    model = popxl.Session(ir, "ipu_hw").plan.model
    (loop,) = [op for op in ir.main_graph.ops if op.type == "Loop"]
    body = loop.called_graphs[0]
    serial, _ = _serial_and_overlapped(model, body.ops)
    assert model.graph_work(body).cycles.total == serial
