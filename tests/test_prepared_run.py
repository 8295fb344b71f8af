"""`Session.prepared_run` against `Session.run` on the same Session: the same outputs bit for
bit, the same conversions and the same errors, with its output buffers written again by every
call."""

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def _session():
    """out = x @ w + b with w a variable, b a second input stream."""
    ir = popxl.Ir()
    with ir.main_graph:
        x_s = popxl.h2d_stream((3, 4), popxl.float32, "x")
        b_s = popxl.h2d_stream((2,), popxl.float32, "b")
        w = popxl.variable(np.arange(8, dtype=np.float32).reshape(4, 2) / 7, name="w")
        y = ops.matmul(ops.host_load(x_s, "x"), w) + ops.host_load(b_s, "b")
        out_s = popxl.d2h_stream(y.shape, y.dtype, "out")
        ops.host_store(out_s, y)
    return popxl.Session(ir, "ipu_model"), x_s, b_s, out_s


def _arrays(seed):
    g = np.random.default_rng(seed)
    return g.standard_normal((3, 4)).astype(np.float32), g.standard_normal(2).astype(np.float32)


def test_outputs_are_run_s_bit_for_bit_and_the_buffers_are_reused():
    session, x_s, b_s, out_s = _session()
    with session:
        prepared = session.prepared_run([x_s, b_s])
        first = None
        for seed in range(3):
            x, b = _arrays(seed)
            got = prepared([x, b])
            want = session.run({x_s: x, b_s: b})[out_s]
            assert got[out_s].tobytes() == want.tobytes()
            first = got[out_s] if first is None else first
            assert got[out_s] is first  # one buffer, written by every call


def test_arrays_are_taken_in_the_streams_order():
    session, x_s, b_s, out_s = _session()
    x, b = _arrays(0)
    with session:
        got = session.prepared_run([b_s, x_s])([b, x])[out_s].copy()
        assert np.array_equal(got, session.run({x_s: x, b_s: b})[out_s])


def test_a_float64_array_is_converted_as_run_converts_it():
    session, x_s, b_s, out_s = _session()
    x, b = _arrays(1)
    with session:
        got = session.prepared_run([x_s, b_s])([x.astype(np.float64), b])[out_s].copy()
        assert np.array_equal(got, session.run({x_s: x.astype(np.float64), b_s: b})[out_s])


def test_a_wrong_shape_or_dtype_raises_run_s_error():
    session, x_s, b_s, _ = _session()
    x, b = _arrays(2)
    with session:
        prepared = session.prepared_run([x_s, b_s])
        with pytest.raises(ValueError, match=r"Input for stream 'x' has shape \(4, 3\)"):
            prepared([x.T.copy(), b])
        with pytest.raises(TypeError, match="Input for stream 'b' has dtype int32"):
            prepared([x, b.astype(np.int32)])
        with pytest.raises(ValueError, match="2 arrays for 2 streams|1 arrays for 2 streams"):
            prepared([x])


def test_streams_must_be_the_irs_inputs():
    session, x_s, b_s, _ = _session()
    with pytest.raises(ValueError, match="Missing input: 'b'"):
        session.prepared_run([x_s])
    with pytest.raises(ValueError, match="repeat one"):
        session.prepared_run([x_s, b_s, x_s])


def test_runs_only_attached():
    session, x_s, b_s, _ = _session()
    prepared = session.prepared_run([x_s, b_s])
    with pytest.raises(ValueError, match="Must be attached"):
        prepared(list(_arrays(0)))
