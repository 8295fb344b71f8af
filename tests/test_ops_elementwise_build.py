"""What the elementwise ops put in the graph: op types, inputs and dtypes users can print."""

from __future__ import annotations

import numpy as np

import popxl_core as popxl
from popxl_core import dtypes
from popxl_core.ops.elementwise import negate
from popxl_core.ops.scaled_add import scaled_add_
from popxl_core.ops.unary import log2


def _subgraph(fn, *specs):
    ir = popxl.Ir()
    with ir.main_graph:
        return ir.create_graph(fn, *[popxl.TensorSpec(s, d) for s, d in specs])


def _types(g):
    return [op.type for op in g._ops]


def test_scaled_add_float_scales_are_attributes_tensor_scales_inputs():
    def fn(w, grad, lr):
        scaled_add_(w, grad, b=-0.05)
        scaled_add_(w, grad, b=negate(lr))

    g = _subgraph(fn, ((2, 2), dtypes.float32), ((2, 2), dtypes.float16), ((), dtypes.float32))
    first, neg, second = g._ops
    assert (first.type, neg.type, second.type) == (
        "ScaledAddLhsInplace",
        "Neg",
        "ScaledAddLhsInplace",
    )
    assert len(first.inputs) == 2 and first.attrs["b"] == -0.05
    assert len(second.inputs) == 3 and second.inputs[2] is neg.outputs[0]
    # Mixed precision: a float32 weight updated with a float16 gradient stays float32.
    assert second.outputs[0].dtype is dtypes.float32


def test_dunders_build_ops_with_scalars_in_the_tensor_dtype():
    def fn(x):
        return x * 2, 2 - x, x**2, -x, x % 3, 2 / x

    g = _subgraph(fn, ((3,), dtypes.float16))
    assert _types(g) == ["Mul", "Sub", "Pow", "Neg", "Fmod", "Div"]
    for op in g._ops:
        assert all(t.dtype is dtypes.float16 for t in (*op.inputs, *op.outputs)), op.type
    assert g._ops[1].inputs[1] is g.inputs[0]  # 2 - x keeps the operand order


def test_log2_is_built_from_log_ops():
    g = _subgraph(lambda x: log2(x), ((3,), dtypes.float32))
    assert _types(g) == ["Log", "Log", "Div"]


def test_scaled_add_mixed_dtype_runs():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.ones((2, 2), np.float32), name="w")
        gr = popxl.constant(np.full((2, 2), 0.5, np.float16), dtypes.float16)
        lr = popxl.constant(np.float32(0.1), dtypes.float32)
        scaled_add_(w, gr, b=negate(lr))
    with popxl.Session(ir, "ipu_hw") as session:
        session.run({})
        got = session.get_tensor_data(w)
    np.testing.assert_allclose(got, np.full((2, 2), 0.95, np.float32), rtol=1e-6)
