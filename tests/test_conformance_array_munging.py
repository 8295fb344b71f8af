"""addons.array_munging: shard layouts checked element by element and by round trips
(tensor_parallel_input is covered by tests/test_addons_array_munging.py)."""

from __future__ import annotations

import numpy as np
import pytest

from addons import array_munging as am

X = np.arange(4 * 6 * 2).reshape(4, 6, 2)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_shard_puts_part_i_on_axis_0_and_unshard_inverts(axis):
    n = X.shape[axis]
    parts = am.shard(X, n, axis)
    for i in range(n):
        np.testing.assert_array_equal(parts[i], np.take(X, [i], axis=axis))
    np.testing.assert_array_equal(am.unshard(parts, axis), X)


def test_shard2d_first_axis_outermost_and_round_trip():
    blocks = am.shard2D(X, 2, 3, 0, 1)
    assert blocks.shape == (6, 2, 2, 2)
    np.testing.assert_array_equal(blocks[1 * 3 + 2], X[2:4, 4:6])  # outer part 1, inner part 2
    np.testing.assert_array_equal(am.unshard2D(blocks, 2, 3, -3, -2), X)


def test_repeats_and_replica_layouts():
    v = np.array([5, 6, 7, 8])
    np.testing.assert_array_equal(am.repeat(v, 3, 1), np.stack([v] * 3, axis=1))
    np.testing.assert_array_equal(am.repeat_axis(v, 2), np.r_[v, v])
    contiguous = am.repeat_shard(v, 3, 2, 0, "contiguous")
    strided = am.repeat_shard(v, 3, 2, 0, "strided")
    assert [r.tolist() for r in contiguous] == [[5, 6], [7, 8]] * 3
    assert [r.tolist() for r in strided] == [[5, 6]] * 3 + [[7, 8]] * 3


def test_pad_squeeze_and_axes():
    np.testing.assert_array_equal(am.pad_axis(np.ones((2, 1)), 3, 0), [[1], [1], [0]])
    assert am.squeeze_safe(np.zeros((1, 3, 1)), [0, 1]).shape == (3, 1)  # size-3 axis kept
    assert am.squeeze_safe(np.zeros((1, 3, 1))).shape == (3,)
    assert am.handle_negative_axis(X, -1) == 2
    with pytest.raises(IndexError, match="out of range"):
        am.handle_negative_axis(X, 3)
