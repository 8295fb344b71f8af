"""Kernels that skip outputs nothing reads (``speed.DEAD_OUTPUT_KERNELS``).

A linear layer's gradient op computes ``dx``, ``dw`` and ``db``; for a first layer nothing reads
``dx`` (eager autograd does not compute it either), and the compiler runs the op table's kernel
without that GEMM. The gradients that are read must be the same bits as the reference
interpreter's, which always runs the full kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.linear import LINEAR_GRAD
from popxl_core.ops.registry import create_op
from popxl_core.sim import CompileOptions


def _program(read_dx: bool, dtype=np.float32):
    rng = np.random.default_rng(0)
    ir = popxl.Ir()
    ir.numerics = "torch"
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(rng.standard_normal((6, 5)).astype(dtype), name="x")
        w = popxl.variable(rng.standard_normal((4, 5)).astype(dtype), name="w")
        g = popxl.variable(rng.standard_normal((6, 4)).astype(dtype), name="g")
        dx, dw, db = create_op(LINEAR_GRAD, [g, x, w], {"has_bias": True})
        read = [dw, db, dx] if read_dx else [dw, db]
        streams = []
        for i, t in enumerate(read):
            s = popxl.d2h_stream(t.shape, t.dtype, f"out{i}")
            ops.host_store(s, t)
            streams.append(s)
    return ir, streams


def _run(read_dx: bool, reference: bool, dtype=np.float32):
    ir, streams = _program(read_dx, dtype)
    session = popxl.Session(ir, "ipu_hw", compile_options=CompileOptions(interpret=reference))
    with session:
        out = session.run({})
    return [np.array(out[s]) for s in streams], session._program


@pytest.mark.parametrize("read_dx", [False, True])
def test_linear_grad_without_its_input_gradient_equals_the_reference_bitwise(read_dx):
    fast, program = _run(read_dx, reference=False)
    ref, _ = _run(read_dx, reference=True)
    for a, b in zip(fast, ref):
        assert a.tobytes() == b.tobytes()  # the same kernels on the same values: rtol=atol=0
    assert program.stats["dead_outputs"] == (0 if read_dx else 1)


def test_float16_keeps_the_full_kernel():
    # the float16 path computes in float32 and rounds every output: not the variant
    fast, program = _run(False, reference=False, dtype=np.float16)
    ref, _ = _run(False, reference=True, dtype=np.float16)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(fast, ref))
    assert program.stats["dead_outputs"] == 0


def _grads(g, x, w):
    return tuple(create_op(LINEAR_GRAD, [g, x, w], {"has_bias": True}))


def _called(calls: int, runs: int, reference: bool, repeat: bool = False):
    """``dx, dw, db`` of a subgraph fed per run from streams, called ``calls`` times (the
    second time on other data: both results are stored after both calls), or as a loop body."""
    rng = np.random.default_rng(1)
    ir = popxl.Ir()
    ir.numerics = "torch"
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(rng.standard_normal((4, 5)).astype(np.float32), name="w")
        specs = [("g", (6, 4)), ("x", (6, 5))]
        ins = [popxl.h2d_stream(shape, popxl.float32, n) for n, shape in specs]
        g, x = (ops.host_load(s, s.tensor_id) for s in ins)
        sub = ir.create_graph(_grads, g.spec, x.spec, w.spec)
        if repeat:

            def body(a, b, c):  # carries a (6, 4) through dw: dw is read in every iteration
                dw = _grads(a, b, c)[1]
                return (a * 0.5 + ops.matmul(b, ops.transpose(dw)) * 0.01,)

            loop_body = ir.create_graph(body, g.spec, x.spec, w.spec)
            results = [ops.repeat(loop_body, 2, g, x, w)[0]]
        else:
            results = [*ops.call(sub, g, x, w)]
            if calls == 2:
                results += ops.call(sub, g * 2.0, x, w)
        streams = []
        for i, t in enumerate(results):
            s = popxl.d2h_stream(t.shape, t.dtype, f"out{i}")
            ops.host_store(s, t)
            streams.append(s)
    session = popxl.Session(ir, "ipu_hw", compile_options=CompileOptions(interpret=reference))
    outs = []
    with session:
        for run in range(runs):
            data = np.random.default_rng(10 + run)
            feeds = {s: data.standard_normal(s.shape).astype(np.float32) for s in ins}
            res = session.run(feeds)
            outs.append([np.array(res[s]) for s in streams])
    return outs, session._program


@pytest.mark.parametrize("calls", [1, 2])
def test_buffered_weight_gradient_across_runs_equals_the_reference_bitwise(calls):
    # called once: dw is written into a buffer the program keeps, run after run; called
    # twice, the second call would overwrite the first result while it is still to be stored
    fast, program = _called(calls, runs=3, reference=False)
    ref, _ = _called(calls, runs=3, reference=True)
    for run_fast, run_ref in zip(fast, ref):
        for a, b in zip(run_fast, run_ref):
            assert a.tobytes() == b.tobytes()
    assert program.stats["buffered_ops"] == (1 if calls == 1 else 0)


def test_a_loop_body_is_not_buffered():
    fast, program = _called(1, runs=2, reference=False, repeat=True)
    ref, _ = _called(1, runs=2, reference=True, repeat=True)
    assert all(a.tobytes() == b.tobytes() for f, r in zip(fast, ref) for a, b in zip(f, r))
    assert program.stats["buffered_ops"] == 0


def test_outputs_above_the_buffer_bound_are_allocated_each_run(monkeypatch):
    from popxl_core.sim import variants

    monkeypatch.setattr(variants, "MAX_BUFFER_BYTES", 4 * 5 * 4 - 1)  # dw (4, 5) float32: 80 B
    fast, program = _called(1, runs=2, reference=False)
    ref, _ = _called(1, runs=2, reference=True)
    assert all(a.tobytes() == b.tobytes() for f, r in zip(fast, ref) for a, b in zip(f, r))
    assert program.stats["buffered_ops"] == 0
