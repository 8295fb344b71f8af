"""Compile-time fusion of transpose(matmul(a, b)) into matmul(b.T, a.T) (sim/fuse.py).

With ``Ir.numerics = "torch"`` (popxl_fx's setting) the fused result is compared bit for bit
with torch computing ``b.T @ a.T`` (eager PyTorch's weight-gradient call); with the default
``"ipu"`` numerics, bit for bit with the unfused product transposed. Both are compared with
``(a @ b).T`` within the rounding bound of a reordered 33-term sum; the result must be
contiguous. A matmul whose output is also read elsewhere is left alone.
"""

from __future__ import annotations

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops

RNG = np.random.default_rng(0)
A = RNG.standard_normal((16, 33)).astype(np.float32)
B = RNG.standard_normal((33, 20)).astype(np.float32)
# a reordered float32 sum of 33 products differs by at most 33 ulp-units of sum |a_i b_i|
BOUND = (33 * 2.0**-24) * (np.abs(A) @ np.abs(B)).T


def _session(also_read_product: bool, numerics: str = "torch"):
    ir = popxl.Ir()
    ir.numerics = numerics
    with ir.main_graph:
        sa = popxl.h2d_stream(A.shape, popxl.float32, "a")
        sb = popxl.h2d_stream(B.shape, popxl.float32, "b")
        a, b = ops.host_load(sa, "a"), ops.host_load(sb, "b")
        g = ir.create_graph(lambda x, y: ops.transpose(x @ y, (1, 0)), a, b)
        (t,) = ops.call(g, a, b)
        if also_read_product:  # in main: the product is read by the transpose and an add
            p = a @ b
            t = ops.transpose(p, (1, 0))
            ops.host_store(popxl.d2h_stream(p.shape, popxl.float32, "p"), p + 0.0)
        out = popxl.d2h_stream(t.shape, popxl.float32, "t")
        ops.host_store(out, t)
    session = popxl.Session(ir, "ipu_hw")
    return session, {sa: A, sb: B}, out


def test_transposed_matmul_is_one_contiguous_matmul():
    session, feeds, out = _session(False)
    source = "".join(c.source for c in session._program.graphs.values())
    assert source.count(" = k") == 1  # the MatMul and its Transpose: one kernel call
    with session:
        got = session.run(feeds)[out]
    ta, tb = torch.from_numpy(A), torch.from_numpy(B)
    np.testing.assert_array_equal(got, (tb.T @ ta.T).numpy())  # bit for bit
    assert (np.abs(got - (ta @ tb).T.numpy()) <= BOUND).all()
    kernel = next(iter(session._program.kernel_ops))
    assert session._program.namespace[kernel](ta, tb).is_contiguous()


def test_shared_product_is_not_fused():
    session, feeds, out = _session(True)
    main = session._program.main.source
    # matmul, transpose, add as three calls (direct torch calls, sim/direct.py): the product
    # has two readers
    assert [main.count(c) for c in ("torch.matmul(", ".permute(", "torch.add(")] == [1, 1, 1]
    with session:
        got = session.run(feeds)[out]
    ref = (torch.from_numpy(A) @ torch.from_numpy(B)).T.numpy()
    np.testing.assert_array_equal(got, ref)  # unfused: torch's own matmul, transposed


def test_fused_matmul_keeps_ipu_numerics():
    session, feeds, out = _session(False, numerics="ipu")
    with session:
        got = session.run(feeds)[out]
    ta, tb = torch.from_numpy(A), torch.from_numpy(B)
    # the unfused "ipu" product (16 rows, 20 columns: torch's own matmul), transposed
    np.testing.assert_array_equal(got, (ta @ tb).T.numpy())
    kernel = next(iter(session._program.kernel_ops))
    assert session._program.namespace[kernel](ta, tb).is_contiguous()
