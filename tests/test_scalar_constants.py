"""Python scalars made constants (`arg_checks._scalar_kept`, the quick path of
`check_conversion`): every value that changes on the way to the dtype is refused as the
full check refuses it, every value that does not is kept, with the same data."""

from __future__ import annotations

import math

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import arg_checks

KEPT = [
    (1.5, popxl.float32),
    (3, popxl.int32),
    (-(2**31), popxl.int32),
    (2.0, None),
    (7, None),
    (float("nan"), popxl.float32),
    (float("-inf"), popxl.float16),
    (3, popxl.float32),
    (True, popxl.int32),
]
REFUSED = [
    (1e39, popxl.float32),
    (2**31, popxl.int32),
    (1.5, popxl.int32),
    (70000.0, popxl.float16),
]


@pytest.mark.parametrize("value, dtype", KEPT)
def test_a_value_the_dtype_holds_is_kept(value, dtype):
    with popxl.Ir().main_graph:
        c = popxl.constant(value, dtype)
    expected = np.array(value).astype(c.dtype.as_numpy())
    assert c._data.shape == () and c._data.dtype == expected.dtype
    assert np.array_equal(c._data, expected, equal_nan=True)


@pytest.mark.parametrize("value, dtype", REFUSED)
def test_a_value_the_dtype_changes_is_refused(value, dtype):
    with popxl.Ir().main_graph, pytest.raises(ValueError, match="does not fit"):
        popxl.constant(value, dtype)


@pytest.mark.parametrize("value, dtype", KEPT + REFUSED)
def test_the_quick_path_agrees_with_the_full_check(value, dtype, monkeypatch):
    def outcome():
        try:
            with popxl.Ir().main_graph:
                return ("kept", popxl.constant(value, dtype)._data.tobytes())
        except ValueError as e:
            return ("refused", str(e))

    quick = outcome()
    monkeypatch.setattr(arg_checks, "_scalar_kept", lambda data, arr: False)
    assert outcome() == quick


def test_the_quick_path_takes_the_scalars_it_is_for():
    assert arg_checks._scalar_kept(1.5, np.array(1.5, np.float32))
    assert arg_checks._scalar_kept(3, np.array(3, np.int32))
    assert not arg_checks._scalar_kept(1e39, np.array(math.inf, np.float32))
    assert not arg_checks._scalar_kept(True, np.array(1, np.int32))  # a bool: the full check
    assert not arg_checks._scalar_kept(3, np.array([3], np.int32))  # not a scalar
