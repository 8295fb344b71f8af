"""Kernels that skip outputs nothing reads (``OpDef.extra["dead_output_kernels"]``).

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
    session = popxl.Session(ir, "ipu_hw", _reference=reference)
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
