"""Subgraph outputs no call site reads are not computed (popxl_core/sim/call_outputs.py).

The pruned program must give the reference interpreter's results bit for bit (the reference
runs every op of every graph); an output read at any call site, or returned by a loop body, is
computed.
"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim import CompileOptions

RNG = np.random.default_rng(3)
X = RNG.standard_normal((8, 16)).astype(np.float32)
W = RNG.standard_normal((16, 32)).astype(np.float32)


def _layer_and_grads(read_dx_at: tuple[bool, ...]):
    """gelu(x @ w), autodiff'd for x and w; one call site per entry of ``read_dx_at``, each
    storing dw and, where True, dx."""
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(X, name="x")
        w = popxl.variable(W, name="w")
        graph = ir.create_graph(lambda a, b: ops.gelu(a @ b), x, w)
        info = popxl.transforms.autodiff(graph)
        site = ops.call_with_info(graph, x, w)
        ones = popxl.constant(np.ones((8, 32), np.float32))
        streams = []
        for k, read_dx in enumerate(read_dx_at):
            dx, dw = ops.call(info.graph, ones, inputs_dict=info.inputs_dict(site))[:2]
            for name, t in [("dw", dw), ("dx", dx)][: 2 if read_dx else 1]:
                s = popxl.d2h_stream(t.shape, t.dtype, f"{name}{k}")
                ops.host_store(s, t)
                streams.append(s)
    return ir, streams


def _run(read_dx_at, reference: bool):
    ir, streams = _layer_and_grads(read_dx_at)
    session = popxl.Session(ir, "ipu_hw", compile_options=CompileOptions(interpret=reference))
    with session:
        out = session.run()
    return session, [out[s] for s in streams]


@pytest.mark.parametrize("read_dx_at", [(False,), (True,), (False, False), (False, True)])
def test_unread_outputs_are_not_computed_and_results_are_the_references(read_dx_at):
    session, got = _run(read_dx_at, reference=False)
    _, want = _run(read_dx_at, reference=True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    pruned = session._program.stats["unread_graph_outputs"]
    # the forward's gelu output (the backward reads x @ w, nothing reads y), and dx unless
    # some site reads it (then every site computes it: one compiled backward graph)
    assert pruned == (1 if any(read_dx_at) else 2)
    matmuls = sum(c.source.count("matmul") for c in session._program.graphs.values())
    assert matmuls == (3 if any(read_dx_at) else 2)  # forward, dw, and dx where read


def test_a_loop_body_returns_every_output():
    ir = popxl.Ir()
    with ir.main_graph:
        x, y = popxl.variable(X, name="x"), popxl.variable(X, name="y")
        body = ir.create_graph(lambda a, b: (a * 2.0, ops.gelu(b)), x, y)
        out = ops.repeat(body, 3, x, y)  # the second output is carried, never stored
        s = popxl.d2h_stream(out[0].shape, out[0].dtype, "out")
        ops.host_store(s, out[0])
    session = popxl.Session(ir, "ipu_hw")
    assert session._program.stats["unread_graph_outputs"] == 0
    with session:
        np.testing.assert_array_equal(session.run()[s], X * 8.0)
