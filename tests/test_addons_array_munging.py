"""addons.array_munging (host data per replica) and addons.testing_utils.run_module."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from addons import array_munging as am
from addons.layers import Linear
from addons.testing_utils import TensorInput, ops_of_type, run_module


def test_shard_and_unshard_round_trip_on_every_axis():
    x = np.arange(2 * 4 * 6).reshape(2, 4, 6)
    for axis in (0, 1, 2, -1):
        s = am.shard(x, 2, axis)
        assert s.shape[0] == 2
        np.testing.assert_array_equal(am.unshard(s, axis), x)
    s2 = am.shard2D(x, 2, 3, 1, 2)
    assert s2.shape == (6, 2, 2, 2)
    np.testing.assert_array_equal(am.unshard2D(s2, 2, 3, 1, 2), x)


def test_repeats_pads_and_squeezes():
    x = np.arange(6).reshape(2, 3)
    assert am.repeat(x, 4, 0).shape == (4, 2, 3)
    np.testing.assert_array_equal(am.repeat_axis(x, 2, 1), np.concatenate([x, x], 1))
    np.testing.assert_array_equal(
        am.repeat_shard(np.arange(4), 2, 2, 0, "strided"), [[0, 1], [0, 1], [2, 3], [2, 3]]
    )
    np.testing.assert_array_equal(am.pad_axis(x, 5, -1)[:, 3:], np.zeros((2, 2)))
    assert am.squeeze_safe(np.zeros((4, 1, 3, 1)), [1, 0]).shape == (4, 3, 1)
    assert am.handle_negative_axis(x, -1) == 1
    with pytest.raises(IndexError, match="axis 2 is out of range"):
        am.handle_negative_axis(x, 2)


def test_run_module_matches_numpy():
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(4), rng.standard_normal((4, 2)), rng.standard_normal(2)
    (y,) = run_module(
        Linear(2),
        TensorInput(x, popxl.float32),
        weights=lambda v: {v.weight: w.astype(np.float32), v.bias: b.astype(np.float32)},
    )
    # one float32 matmul of 4 terms: a few ulps
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-5, atol=1e-6)


def test_ops_of_type_counts_ops():
    ir = popxl.Ir()
    with ir.main_graph:
        g = ir.create_graph(lambda a: a * a + a, popxl.TensorSpec((2,), popxl.float32))
    assert ops_of_type(g, "Mul") == 1 and ops_of_type(g, "MatMul") == 0
