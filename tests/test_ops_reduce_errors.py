"""Error messages of the reduce, matmul and loss ops: clear, early, in the user's terms."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def _graph_with(*specs):
    """Build inside a subgraph whose inputs have the given (shape, dtype) specs."""
    ir = popxl.Ir()
    g = ir.create_graph(lambda: None)
    with g:
        ins = [popxl.graph_input(shape, dtype, f"x{i}") for i, (shape, dtype) in enumerate(specs)]
    return g, ins


def test_matmul_inner_dim_mismatch_names_both_shapes():
    g, (a, b) = _graph_with(((3, 4), popxl.float32), ((5, 6), popxl.float32))
    with g, pytest.raises(ValueError) as e:
        ops.matmul(a, b)
    assert "(3, 4)" in str(e.value) and "(5, 6)" in str(e.value)
    assert not g._ops, "a failed op must leave the graph unchanged"


def test_matmul_batch_mismatch_and_scalar():
    g, (a, b, s) = _graph_with(
        ((2, 3, 4), popxl.float32), ((3, 4, 5), popxl.float32), ((), popxl.float32)
    )
    with g:
        with pytest.raises(ValueError, match=r"batch dimensions.*\(2, 3, 4\).*\(3, 4, 5\)"):
            ops.matmul(a, b)
        with pytest.raises(ValueError, match="rank >= 1"):
            ops.matmul(s, b)


def test_matmul_of_mixed_dtypes_takes_lhs_dtype():
    """PopART types a MatMul by its lhs (popxl.addons' test_from_variable_factories builds
    float32 @ float16): rhs is cast to lhs's dtype, the gradient of rhs keeps rhs's dtype."""
    g, (a, b, f8) = _graph_with(
        ((3, 4), popxl.float32), ((4, 5), popxl.float16), ((4, 5), popxl.float8_143)
    )
    with g:
        assert (a @ b).dtype == popxl.float32
        assert [op.type for op in g._ops] == ["Cast", "MatMul"]
        assert ops.matmul(b.T, a.T).dtype == popxl.float16
        assert ops.matmul(a, b, output_type=popxl.float16).dtype == popxl.float16
        with pytest.raises(TypeError, match="same dtype"):
            ops.matmul(a, f8)  # float8 mixes with nothing (PopART: FLOAT8 inputs only)
    ir = popxl.Ir()
    x, w = np.arange(12.0).reshape(3, 4) / 8, np.arange(20.0).reshape(4, 5) / 16
    with ir.main_graph:
        a, b = popxl.variable(x, popxl.float32), popxl.variable(w, popxl.float16)
        y = a @ b
        fwd = ir.create_graph(lambda p, q: p @ q, a, b)
        grads = popxl.transforms.autodiff(fwd).graph.outputs
        s = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(s, y)
    assert [t.dtype for t in grads] == [popxl.float32, popxl.float16]
    with popxl.Session(ir, "ipu_model") as sess:
        got = sess.run()[s]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, x.astype(np.float32) @ w.astype(np.float16), rtol=1e-6)


def test_matmul_output_type_and_shapes():
    g, (a, b, v) = _graph_with(
        ((2, 1, 3, 4), popxl.float16), ((5, 4, 6), popxl.float16), ((4,), popxl.float16)
    )
    with g:
        out = ops.matmul(a, b, output_type=popxl.float32)
        assert out.shape == (2, 5, 3, 6) and out.dtype == popxl.float32
        assert ops.matmul(v, b).shape == (5, 6)
        assert ops.matmul(a, v).shape == (2, 1, 3)
        assert ops.matmul(v, v).shape == ()


def test_softmax_without_axis_is_a_type_error():
    g, (x,) = _graph_with(((2, 3), popxl.float32))
    with g:
        with pytest.raises(TypeError):
            ops.softmax(x)  # popxl requires the axis
        with pytest.raises(ValueError, match="out of range"):
            ops.softmax(x, 2)


def test_nll_with_float_labels_is_a_clear_error():
    g, (p, lab) = _graph_with(((4, 3), popxl.float32), ((4,), popxl.float32))
    with g, pytest.raises(TypeError, match="labels must be an integer"):
        ops.nll_loss(p, lab)
    with g, pytest.raises(TypeError, match="labels must be an integer"):
        ops.nll_loss_with_softmax_grad(p, lab)


def test_nll_label_shape_and_reduction():
    g, (p, lab) = _graph_with(((4, 3), popxl.float32), ((3,), popxl.int32))
    with g:
        with pytest.raises(ValueError, match=r"labels shape \(3,\).*\(4, 3\)"):
            ops.nll_loss(p, lab)
        with pytest.raises(ValueError, match="reduction"):
            ops.nll_loss(p, lab, reduction="average")


@pytest.mark.parametrize("fn", [ops.sum, ops.mean, ops.max, ops.median, ops.logsumexp])
def test_reduction_axis_out_of_range(fn):
    g, (x,) = _graph_with(((2, 3), popxl.float32))
    with g:
        with pytest.raises(ValueError, match="axis 2 is out of range for rank 2"):
            fn(x, 2)
        with pytest.raises(ValueError, match="axis -3 is out of range"):
            fn(x, [0, -3])
        assert fn(x, -1, keepdims=True).shape == (2, 1)
        assert fn(x).shape == ()


def test_index_reductions_errors():
    g, (x,) = _graph_with(((2, 3), popxl.float32))
    with g:
        with pytest.raises(ValueError, match="out of range"):
            ops.argmax(x, 2)
        with pytest.raises(ValueError, match="k=4"):
            ops.topk(x, 4, 1, True, True)
        with pytest.raises(ValueError, match="out of range"):
            ops.cumsum(x, -3)
        assert ops.argmin(x, 1).dtype == popxl.int32


def test_float_only_reductions_reject_integers():
    g, (x,) = _graph_with(((2, 3), popxl.int32))
    with g:
        assert ops.sum(x, 0).dtype == popxl.int32
        with pytest.raises(TypeError, match="floating point"):
            ops.mean(x)


def test_all_ignored_mean_nll_is_zero_not_nan():
    # Every label ignored: the mean divides by max(count, 1), so the loss is 0 (torch: nan).
    ir = popxl.Ir()
    with ir.main_graph:
        p = popxl.variable(np.full((3, 2), 0.5, np.float32))
        lab = popxl.variable(np.array([1, 1, 1], np.int32))
        loss, dx = ops.nll_loss_with_softmax_grad(p, lab, ignore_index=1)
        s1, s2 = popxl.d2h_stream((), popxl.float32), popxl.d2h_stream((3, 2), popxl.float32)
        ops.host_store(s1, loss)
        ops.host_store(s2, dx)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run({})
    assert out[s1] == 0.0 and np.all(out[s2] == 0.0)


def test_costs_count_real_work():
    from popxl_core.ops.registry import get_opdef
    from popxl_core.tensor import TensorSpec

    f32 = popxl.float32
    a, b = TensorSpec((2, 1, 3, 4), f32), TensorSpec((5, 4, 6), f32)
    out = TensorSpec((2, 5, 3, 6), f32)
    cost = get_opdef("MatMul").cost([a, b], [out], {})
    assert cost.flops == 2 * 3 * 4 * 6 * 10
    assert cost.bytes == (24 + 120 + 180) * 4
    x, y = TensorSpec((8, 16), f32), TensorSpec((8,), f32)
    assert get_opdef("ReduceSum").cost([x], [y], {}).flops == 128
    assert get_opdef("Softmax").cost([x], [x], {}).flops == 5 * 128


def test_reduce_sum_alias():
    assert ops.reduce_sum is ops.sum and "reduce_sum" in ops.__all__
    assert {"argmax", "argmin", "topk", "cumsum", "log_softmax"} <= set(ops.__all__)
