"""Shape and indexing ops: clear errors, getitem semantics and view/alias behaviour."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import dtypes, ops
from popxl_core.ops.gather import GatherIndexWarning

F32 = np.float32


def _graph_with(*specs):
    """An Ir and a subgraph with inputs of the given (shape, dtype) specs, left open."""
    ir = popxl.Ir()
    g = ir.create_empty_graph("g")
    with g:
        ins = [popxl.graph_input(shape, dt, f"x{i}") for i, (shape, dt) in enumerate(specs)]
    return g, ins


def _run(build, *arrays):
    """Build ``build(*variables)`` in the main graph, run it, return the host outputs."""
    ir = popxl.Ir()
    # in_sequence: the outputs are stored after the in-place writes of the views (unordered
    # otherwise, which PopXL's inplacing ambiguity check refuses)
    with ir.main_graph, popxl.in_sequence():
        vs = [popxl.variable(a, name=f"v{i}") for i, a in enumerate(arrays)]
        outs = build(*vs)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        streams = []
        for i, t in enumerate(outs):
            s = popxl.d2h_stream(t.shape, t.dtype, f"out{i}")
            ops.host_store(s, t)
            streams.append(s)
    session = popxl.Session(ir, "ipu_hw")
    with session:
        res = session.run({})
        data = session.get_tensors_data(vs)
    return [res[s] for s in streams], [data[v] for v in vs]


# errors --------------------------------------------------------------------------------------
def test_reshape_to_incompatible_size_names_both_shapes():
    g, (x,) = _graph_with(((2, 3), dtypes.float32))
    with g, pytest.raises(ValueError) as info:
        ops.reshape(x, (4, 2))
    msg = str(info.value)
    assert "Reshape" in msg and "(2, 3)" in msg and "(4, 2)" in msg
    assert "test_ops_shape_errors.py" in msg, "the error points at the user's line"
    assert not g._ops, "a failed op must leave the graph unchanged"


@pytest.mark.parametrize("shape", [(-1, -1), (5, -1), (-2, 3)])
def test_reshape_bad_targets(shape):
    g, (x,) = _graph_with(((2, 3), dtypes.float32))
    with g, pytest.raises(ValueError, match=r"\(2, 3\)|at most one -1"):
        ops.reshape(x, shape)


def test_concat_mismatched_ranks():
    g, (a, b) = _graph_with(((2, 3), dtypes.float32), ((3,), dtypes.float32))
    with g, pytest.raises(ValueError, match=r"same rank.*\(2, 3\).*\(3,\)"):
        ops.concat([a, b])


def test_concat_mismatched_sizes_and_dtypes():
    g, (a, b, c) = _graph_with(
        ((2, 3), dtypes.float32), ((2, 4), dtypes.float32), ((2, 3), dtypes.float16)
    )
    with g:
        assert ops.concat([a, b], axis=1).shape == (2, 7)
        with pytest.raises(ValueError, match="every axis but 0"):
            ops.concat([a, b])
        with pytest.raises(TypeError, match="float16"):
            ops.concat([a, c])


def test_gather_with_float_indices():
    g, (x, i) = _graph_with(((4, 3), dtypes.float32), ((2,), dtypes.float32))
    with g:
        with pytest.raises(
            TypeError, match="Gather: gather indices must be an integer tensor, got float32"
        ):
            ops.gather(x, i)
        with pytest.raises(TypeError, match="integers"):
            ops.gather(x, np.array([0.5, 1.0]))
        with pytest.raises(TypeError, match="integer or bool"):
            x[i]


def test_getitem_out_of_range():
    g, (x,) = _graph_with(((4, 3), dtypes.float32))
    with g:
        with pytest.raises(IndexError, match=r"index 4 is out of range for axis 0 with size 4"):
            x[4]
        with pytest.raises(IndexError, match=r"index -4 is out of range for axis 1 with size 3"):
            x[0, -4]
        with pytest.raises(IndexError, match="too many indices"):
            x[0, 0, 0]
        with pytest.raises(IndexError, match="out of range for axis 0 of size 4"):
            x[np.array([1, 4])]
        with pytest.raises(TypeError, match="not supported"):
            x[0, np.array([1])]


def test_other_shape_errors():
    g, (x, i2) = _graph_with(((4, 3), dtypes.float32), ((2,), dtypes.int32))
    with g:
        with pytest.raises(ValueError, match="not a permutation"):
            ops.transpose(x, (0, 0))
        with pytest.raises(ValueError, match=r"do not add up to 4"):
            ops.split(x, [1, 2])
        with pytest.raises(ValueError, match="3 equal parts"):
            ops.split(x, 3)
        with pytest.raises(ValueError, match="axis 2 is out of range"):
            ops.split(x, 2, axis=2)
        with pytest.raises(ValueError, match="repeat an axis"):
            ops.unsqueeze(x, [0, 0])
        with pytest.raises(ValueError, match=r"axes \[1\].*do not have size 1"):
            ops.squeeze(x, [1])
        with pytest.raises(ValueError, match="step of axis 0 must not be 0"):
            ops.slice(x, 0, 2, 0)
        with pytest.raises(ValueError, match="cannot be broadcast"):
            ops.expand(x, (2, 3))
        with pytest.raises(ValueError, match=r"index must have shape \(1,\)"):
            ops.dynamic_slice(x, i2, [0], [2], True)
        with pytest.raises(ValueError, match="t_update must be"):
            ops.dynamic_update(x, i2, x, [0, 1], [1, 1], True)


def test_gather_out_of_range_never_raises():
    # PopXL: zero_OOR=True gives zeros; zero_OOR=False is unspecified on the IPU but not an
    # error (the simulator gives zeros as well).
    # zero_OOR=False warns (the simulator can say what the IPU cannot).
    x = np.arange(6, dtype=F32).reshape(3, 2)
    for zero_oor in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (out,), _ = _run(
                lambda v, i, z=zero_oor: ops.gather(v, i, zero_OOR=z),
                x,
                np.array([0, 3, -1], np.int32),
            )
        np.testing.assert_array_equal(out, [[0, 1], [0, 0], [0, 0]])
        warned = [w for w in caught if issubclass(w.category, GatherIndexWarning)]
        assert len(warned) == (0 if zero_oor else 1)


# getitem numbers ----------------------------------------------------------------------------
def test_getitem_basic_matches_numpy():
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(F32)
    keys = [
        (1, slice(None), 2),
        (Ellipsis, 0),
        (slice(None, None, -1), None, 3),
        (slice(-2, None), slice(1, 100, 2), slice(5, 0, -2)),
        slice(None),
        -1,
    ]
    outs, _ = _run(lambda v: [v[k] for k in keys], x)
    for k, o in zip(keys, outs):
        np.testing.assert_array_equal(o, x[k])


def test_getitem_builds_popxl_ops():
    g, (x,) = _graph_with(((4, 6), dtypes.float32))
    with g:
        x[1:3, ::-2]
        x[0]
    assert [op.type for op in g._ops] == ["Slice", "Subsample", "Slice", "Reshape"]


def test_getitem_bool_mask_zeroes_and_keeps_shape():
    x = np.arange(6, dtype=F32).reshape(2, 3) + 1
    mask = np.array([[True, False, True], [False, True, False]])
    outs, _ = _run(lambda v, m: [v[m], v[mask]], x, mask)
    for o in outs:
        np.testing.assert_array_equal(o, np.where(mask, x, 0))


def test_getitem_integer_tensor_gathers():
    x = np.arange(12, dtype=F32).reshape(4, 3)
    idx = np.array([[3, 0], [1, 1]], np.int32)
    (out,), _ = _run(lambda v, i: v[i], x, idx)
    np.testing.assert_array_equal(out, x[idx])


# views and aliases -----------------------------------------------------------------------------
def _plus_one(region):
    def want(x):
        x = x.copy()
        x[region] += 1
        return x

    return want


def _updated_then_plus_one(x):
    x = x.copy()
    x[:, 1] = 0
    return x + 1


@pytest.mark.parametrize(
    "alias,want",
    [
        (lambda v: ops.reshape_(v, (6,)), _plus_one(np.s_[:, :])),
        (lambda v: v.flatten_(), _plus_one(np.s_[:, :])),
        (lambda v: v.T_, _plus_one(np.s_[:, :])),
        (lambda v: ops.slice_(v, [1, 1], [2, 3], axis=[0, 1]), _plus_one(np.s_[1:, 1:])),
        (
            lambda v: ops.dynamic_update_(
                v,
                popxl.constant(np.array([1], np.int32)),
                popxl.constant(np.zeros((2, 1), F32)),
                [1],
                [1],
                True,
            ),
            _updated_then_plus_one,
        ),
    ],
)
def test_inplace_ops_alias_their_input(alias, want):
    x = np.arange(6, dtype=F32).reshape(2, 3)

    def build(v):
        y = alias(v)
        ops.add_(y, popxl.constant(np.ones(y.shape, F32)))
        return y

    _, (after,) = _run(build, x)
    np.testing.assert_array_equal(after, want(x))


def test_view_outputs_do_not_leak_writes_into_inputs():
    x = np.arange(6, dtype=F32).reshape(2, 3)

    def build(v):
        outs = [
            ops.reshape(v, (3, 2)),
            ops.transpose(v),
            ops.slice(v, 0, 1),
            ops.expand(v, (2, 2, 3)),
            v[1],
        ]
        for t in outs:
            ops.add_(t, popxl.constant(np.ones(t.shape, F32)))
        return outs

    outs, (after,) = _run(build, x)
    np.testing.assert_array_equal(after, x)
    np.testing.assert_array_equal(outs[1], x.T + 1)
    np.testing.assert_array_equal(outs[4], x[1] + 1)


def test_split_and_flatten_and_squeeze_shapes():
    g, (x,) = _graph_with(((2, 1, 6), dtypes.float32))
    with g:
        assert [t.shape for t in ops.split(x, 3, axis=-1)] == [(2, 1, 2)] * 3
        assert ops.flatten(x).shape == (12,)
        assert ops.squeeze(x).shape == (2, 6)
        assert ops.unsqueeze(x, 0).shape == (1, 2, 1, 6)
        assert x.T.shape == (6, 1, 2)
    assert {op.type for op in g._ops} == {"Split", "Reshape", "Transpose"}
