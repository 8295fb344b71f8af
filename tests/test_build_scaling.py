"""Build cost grows linearly with graph size: building the IR and the Session (verify, plan,
compile) for a 20,000-op chain takes at most 30x the time of a 2,000-op chain (10x the ops;
the bound leaves 3x for noise on a shared machine and CPU caches, and fails for anything
quadratic, which would be ~100x). Times are compared only as a ratio, never absolutely.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def _build(n_ops: int) -> popxl.Session:
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.h2d_stream((4,), popxl.float32, "x")
        x = ops.host_load(s, "x")
        for i in range(n_ops // 2):
            x = ops.gelu(x) if i % 2 else x * popxl.constant(np.float32(1.0001))
            x = x + popxl.constant(np.float32(0.5))
        ops.host_store(popxl.d2h_stream((4,), popxl.float32, "y"), x)
    return popxl.Session(ir, "cpu")


def _seconds(n_ops: int) -> float:
    start = time.perf_counter()
    session = _build(n_ops)
    elapsed = time.perf_counter() - start
    assert len(session.ir.main_graph._ops) >= n_ops
    return elapsed


@pytest.mark.slow
def test_build_time_is_linear_in_graph_size():
    small = min(_seconds(2_000) for _ in range(2))
    large = _seconds(20_000)
    assert large / small < 30.0, f"2,000 ops: {small:.2f} s, 20,000 ops: {large:.2f} s"
