"""Clear errors from the elementwise ops: what went wrong, with both dtypes/shapes named."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import dtypes
from popxl_core.ops.elementwise import add, maximum, mul, where
from popxl_core.ops.scaled_add import scaled_add, scaled_add_
from popxl_core.ops.unary import cast, clip


def _graph_with(*specs):
    """An Ir and a subgraph with inputs of the given (shape, dtype) specs, left open."""
    ir = popxl.Ir()
    g = ir.create_empty_graph("g")
    with g:
        ins = [popxl.graph_input(shape, dt, f"x{i}") for i, (shape, dt) in enumerate(specs)]
    return g, ins


@pytest.mark.parametrize("op,name", [(add, "Add"), (mul, "Mul")])
def test_binary_dtype_mismatch_names_both_dtypes(op, name):
    g, (a, b) = _graph_with(((2, 3), dtypes.float32), ((2, 3), dtypes.float16))
    with g, pytest.raises(TypeError) as info:
        op(a, b)
    msg = str(info.value)
    assert name in msg and "float32" in msg and "float16" in msg
    assert not g._ops, "a failed op must leave the graph unchanged"


def test_binary_shape_mismatch_names_both_shapes():
    g, (a, b) = _graph_with(((2, 3), dtypes.float32), ((4,), dtypes.float32))
    with g, pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"):
        mul(a, b)


def test_where_needs_bool_condition():
    g, (c, a, b) = _graph_with(
        ((3,), dtypes.float32), ((3,), dtypes.float32), ((3,), dtypes.float32)
    )
    with (
        g,
        pytest.raises(TypeError, match="Where: the condition must be a bool tensor, got float32"),
    ):
        where(c, a, b)


def test_scaled_add_inplace_cannot_broadcast_its_target():
    g, (x, y) = _graph_with(((4,), dtypes.float32), ((3, 4), dtypes.float32))
    with g:
        assert scaled_add(x, y).shape == (3, 4)  # out of place broadcasting is fine
        with pytest.raises(ValueError, match=r"ScaledAddLhsInplace: the in-place target X \(4,\)"):
            scaled_add_(x, y, b=-0.1)


def test_scaled_add_tensor_scale_must_have_one_element():
    g, (x, y, s) = _graph_with(
        ((4,), dtypes.float32), ((4,), dtypes.float32), ((2,), dtypes.float32)
    )
    with g, pytest.raises(ValueError, match=r"one element, got shape \(2,\)"):
        scaled_add_(x, y, b=s)


def test_clip_bounds_out_of_order():
    g, (x,) = _graph_with(((4,), dtypes.float32))
    with g, pytest.raises(ValueError, match=r"min \(1.0\) is greater than max \(0.0\)"):
        clip(x, 1.0, 0.0)


def test_cast_rejects_non_dtype_and_fp8():
    g, (x,) = _graph_with(((4,), dtypes.float32))
    with g:
        with pytest.raises(TypeError, match="popxl dtype"):
            cast(x, np.float16)
        with pytest.raises(TypeError, match="pow2scale_cast_to_fp8"):
            cast(x, dtypes.float8_143)


def test_maximum_needs_a_tensor():
    g, _ = _graph_with(((4,), dtypes.float32))
    with g:
        with pytest.raises(ValueError, match="at least one tensor"):
            maximum()
        with pytest.raises(TypeError, match="at least one popxl.Tensor"):
            maximum(1.0, 2.0)
