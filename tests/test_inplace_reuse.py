"""Elementwise kernels writing into dead temporaries (sim/inplace.py) give the same bits.

Each program is compared exactly (assert_array_equal) with the same torch calls made eagerly,
since reuse only changes where results are stored; the hazard cases (a temporary viewed, or
written in place, and still live) must not be overwritten.
"""

from __future__ import annotations

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops

X = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
W = np.abs(np.random.default_rng(1).standard_normal((4, 5))).astype(np.float32) + 0.1


def _run(build):
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        s = popxl.h2d_stream(X.shape, popxl.float32, "x")
        x = ops.host_load(s, "x")
        w = popxl.variable(W, name="w")
        results = build(x, w)
        outs = [popxl.d2h_stream(r.shape, r.dtype, f"o{i}") for i, r in enumerate(results)]
        for o, r in zip(outs, results):
            ops.host_store(o, r)
    with popxl.Session(ir, "ipu_hw") as session:
        got = session.run({s: X})
        names = session._program.namespace
        n_into = sum(1 for f in names.values() if getattr(f, "__name__", "") == "into")
        return [got[o] for o in outs], n_into


def test_adam_like_chain_reuses_temporaries_with_the_same_bits():
    def chain(x, w):
        d = x - w * 0.5
        sq = ops.sqrt(w)  # a variable's sqrt: a fresh result, may take a dead buffer
        den = sq / 3.0 + 1e-5
        return [(d * d) / den]

    (got,), n_into = _run(chain)
    x, w = torch.from_numpy(X), torch.from_numpy(W)
    d = x - w * 0.5
    want = (d * d) / (torch.sqrt(w) / 3.0 + 1e-5)
    np.testing.assert_array_equal(got, want.numpy())
    assert n_into >= 3


def test_viewed_temporary_is_not_overwritten():
    def viewed(x, w):
        t = x * 2.0
        r = ops.reshape(t, (20,))  # a view of t stays live
        u = (x + 1.0) * 3.0  # must not land in t's storage
        return [r, u]

    (r, u), _ = _run(viewed)
    np.testing.assert_array_equal(r, (torch.from_numpy(X) * 2.0).reshape(20).numpy())
    np.testing.assert_array_equal(u, ((torch.from_numpy(X) + 1.0) * 3.0).numpy())


def test_temporary_written_in_place_is_not_reused():
    def written(x, w):
        t = x * 2.0
        t2 = ops.scaled_add_(t, w, b=1.0)  # t2 shares t's storage
        u = (x + 1.0) * 3.0
        return [t2, u]

    (t2, u), _ = _run(written)
    x, w = torch.from_numpy(X), torch.from_numpy(W)
    np.testing.assert_array_equal(t2, (x * 2.0).add_(w).numpy())
    np.testing.assert_array_equal(u, ((x + 1.0) * 3.0).numpy())


def test_relu_writes_into_batch_norm_output_as_eager_relu_():
    """Batch norm declares fresh outputs (`OpDef.fresh_outputs`): ReLU writes into its dead
    output, as eager's ``relu_`` does (the one reuse here). Same bits as eager."""
    x4 = X.reshape(2, 2, 5, 1)

    def block(x, w):
        y = ops.batch_norm_training(ops.reshape(x, (2, 2, 5, 1)))[0]
        return [ops.relu(y)]

    (got,), n_into = _run(block)
    y = torch.nn.functional.batch_norm(torch.from_numpy(x4), None, None, training=True)
    np.testing.assert_array_equal(got, y.relu_().numpy())
    assert n_into == 1
