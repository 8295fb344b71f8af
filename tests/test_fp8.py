"""Float8 (popxl.float8_143 / float8_152): the formats bit for bit against their definition
(1-4-3 bias 8 and 1-5-2 bias 16, no infinities, no negative zero, 0x80 = NaN; arXiv:2206.02915),
host conversions, device casts, the scaled float8 matmul and convolution, fp8_amax_scale."""

from __future__ import annotations

import numpy as np
import pytest

import addons
import popxl_core as popxl
from popxl_core import fp8_utils, ops
from popxl_core.errors import OpDataError

FORMATS = {popxl.float8_143: (3, 8), popxl.float8_152: (2, 16)}  # mantissa bits, bias


def _decode(code: int, mbits: int, bias: int) -> float:
    """The value of a float8 code from the format's definition."""
    if code == 0x80:
        return float("nan")
    sign = -1.0 if code & 0x80 else 1.0
    e, f = (code & 0x7F) >> mbits, code & ((1 << mbits) - 1)
    if e == 0:
        return sign * f / 2**mbits * 2.0 ** (1 - bias)
    return sign * (1 + f / 2**mbits) * 2.0 ** (e - bias)


def _table(dt):
    return np.array([_decode(c, *FORMATS[dt]) for c in range(256)], np.float64)


def _encode(x: np.ndarray, dt, nan_on_overflow=True) -> np.ndarray:
    """Round to nearest, ties to the even code, from the table of finite values."""
    table = _table(dt)
    codes = np.array([c for c in range(256) if c != 0x80 and not (c & 0x80 and table[c] == 0)])
    vals = table[codes]
    top = vals.max()
    half_ulp = (top - np.sort(vals)[-2]) / 2
    out = []
    for v in x.astype(np.float64).ravel():
        # inf and NaN are NaN in float8 whatever the mode (PopXL: float16 70000, an inf)
        if not np.isfinite(v) or (abs(v) >= top + half_ulp and nan_on_overflow):
            out.append(0x80)
            continue
        v = float(np.clip(v, -top, top))
        d = np.abs(vals - v)
        best = codes[d == d.min()]
        out.append(int(best[0] if len(best) == 1 else best[best % 2 == 0][0]))
    return np.array(out, np.uint8).reshape(x.shape)


@pytest.mark.parametrize("dt", FORMATS)
def test_every_code_decodes_as_defined(dt):
    codes = np.arange(256, dtype=np.uint8).view(dt.as_numpy())
    got = fp8_utils.host_pow2scale_cast_from_fp8(codes, popxl.float64)
    np.testing.assert_array_equal(got, _table(dt))  # NaN only at 0x80
    assert (
        got[0x7F] == fp8_utils.fp8_max(dt) == {popxl.float8_143: 240, popxl.float8_152: 57344}[dt]
    )


@pytest.mark.parametrize("dt", FORMATS)
@pytest.mark.parametrize("nan_on_overflow", [True, False])
def test_encoding_rounds_to_nearest_even(dt, nan_on_overflow):
    vals = np.unique(_table(dt)[~np.isnan(_table(dt))])
    mids = (vals[1:] + vals[:-1]) / 2  # exact ties
    top = vals[-1]
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            vals,
            mids,
            rng.uniform(-1.2 * top, 1.2 * top, 500),
            rng.normal(0, 1e-2, 200),
            [np.inf, -np.inf, np.nan, -0.0, 2 * top],
        ]
    )
    x = x.astype(np.float32)
    got = fp8_utils.host_pow2scale_cast_to_fp8(x, dt, 0, nan_on_overflow)
    assert got.dtype == dt.as_numpy()  # PopXL's float8 host array
    np.testing.assert_array_equal(got.view(np.uint8), _encode(x, dt, nan_on_overflow))


@pytest.mark.parametrize("dt", FORMATS)
@pytest.mark.parametrize("nan_on_overflow", [True, False])
def test_float64_and_float16_round_once(dt, nan_on_overflow):
    """A float64 just above a float8 tie rounds up (rounding to float32 first would land on the
    tie and round to even); a float16 inf is NaN even when saturating."""
    vals = np.unique(_table(dt)[~np.isnan(_table(dt))])
    mids = (vals[1:] + vals[:-1]) / 2
    x = np.concatenate([mids * (1 + 2.0**-40), mids * (1 - 2.0**-40), [1e300, -1e300]])
    got = fp8_utils.host_pow2scale_cast_to_fp8(x, dt, 0, nan_on_overflow).view(np.uint8)
    np.testing.assert_array_equal(got, _encode(x, dt, nan_on_overflow))
    with np.errstate(over="ignore"):  # 70000 is beyond float16: inf
        h = np.array([np.inf, 70000, -np.inf]).astype(np.float16)
    got16 = fp8_utils.host_pow2scale_cast_to_fp8(h, dt, 0, nan_on_overflow).view(np.uint8)
    np.testing.assert_array_equal(got16, [0x80, 0x80, 0x80])


def test_log2_scale_and_bad_input():
    bits = fp8_utils.host_pow2scale_cast_to_fp8(np.array([3.0, 1000.0]), popxl.float8_143, -3)
    back = fp8_utils.host_pow2scale_cast_from_fp8(bits, popxl.float16, 3)
    assert back.dtype == np.float16
    np.testing.assert_array_equal(back, [3.0, 1024.0])
    with pytest.raises(ValueError, match=r"log2_scale must be an integer in \[-32, 32\)"):
        fp8_utils.host_pow2scale_cast_to_fp8(np.ones(2), popxl.float8_143, 32)
    with pytest.raises(TypeError, match="float8_143 or popxl.float8_152"):
        fp8_utils.host_pow2scale_cast_to_fp8(np.ones(2), popxl.float16)
    with pytest.raises(TypeError, match="popxl float8 array"):
        fp8_utils.host_pow2scale_cast_from_fp8(np.ones(2, np.uint8))
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        fp8_utils.host_pow2scale_cast_from_fp8(bits, popxl.float8_143)


def _mse_scale_by_definition(x, mbits, low, high, src_mbits):
    """PopXL's histogram error model, written out per bias (the two error terms exactly as
    PopXL's documented python states them); returns the middle of the lowest-error biases."""
    lim = [2.0**i for i in range(-126, 126)]
    hist = np.zeros(253)
    for v in np.abs(x.astype(np.float64)):
        hist[0 if v < lim[0] else 252 if v > lim[-1] else np.frexp(v)[1] + 126] += 1
    hist /= hist.sum()
    span, q, errs = high - low + 1, 2.0 ** (-2 * (src_mbits - mbits)), {}
    for index, bias in enumerate(range(-31, 32)):
        m = low + bias + 126
        e = (lim[0] / 2) ** 2 + sum(lim[i] ** 2 * hist[i + 1] for i in range(m))
        e += sum(lim[i] ** 2 * hist[i + 1] * q for i in range(m, min(m + span, 252)))
        e += sum((lim[index + span - 1] - lim[i]) ** 2 * hist[i + 1] for i in range(m + span, 252))
        errs.setdefault(e, []).append(bias)
    ties = errs[min(errs)]
    return ties[len(ties) // 2]


@pytest.mark.parametrize("src", [np.float16, np.float32])
def test_mse_scale_is_popxls_histogram_estimate(src):
    """host_fp8_mse_scale returns (error, -bias) as PopXL does, and _pb its scale."""
    rng = np.random.default_rng(1)
    assert fp8_utils.host_fp8_mse_scale(np.array([0.00098, 240], src), popxl.float8_143)[1] == 0
    for x, dt, fmt in [
        (rng.uniform(2**5, 2**6, 300), popxl.float8_143, (3, -10, 7)),
        (rng.uniform(2**-6, 2**-5, 300), popxl.float8_143, (3, -10, 7)),
        (rng.normal(0, 3000, 300), popxl.float8_152, (2, -17, 15)),
    ]:
        x = x.astype(src)
        err, scale = fp8_utils.host_fp8_mse_scale(x, dt)
        assert isinstance(err, float) and -31 <= scale <= 31
        assert scale == -_mse_scale_by_definition(x, *fmt, 23 if src == np.float32 else 10)
        assert fp8_utils.host_fp8_mse_scale_pb(x, dt) == scale


def _run(ir, streams_in=None):
    with popxl.Session(ir, "ipu_model") as sess:
        return sess.run(streams_in or {}), sess


@pytest.mark.parametrize("dt", FORMATS)
def test_device_cast_equals_host_cast(dt):
    x = np.random.default_rng(2).uniform(-80, 80, (4, 8)).astype(np.float16)
    x[0, 0] = 6e4  # overflows at scale 2: NaN
    ir = popxl.Ir()
    with ir.main_graph:
        xin = popxl.variable(x, name="x")
        y = ops.pow2scale_cast_to_fp8(xin, 2, dt)
        back = ops.pow2scale_cast_from_fp8(y, popxl.constant(-2, popxl.int32), popxl.float32)
        s_y, s_b = popxl.d2h_stream(y.shape, dt), popxl.d2h_stream(back.shape, popxl.float32)
        ops.host_store(s_y, y)
        ops.host_store(s_b, back)
    out, _ = _run(ir)
    want = fp8_utils.host_pow2scale_cast_to_fp8(x, dt, 2)
    assert out[s_y].dtype == dt.as_numpy()
    np.testing.assert_array_equal(out[s_y], want)
    np.testing.assert_array_equal(
        out[s_b], fp8_utils.host_pow2scale_cast_from_fp8(want, popxl.float32, -2)
    )


def test_float8_variables_and_streams():
    x = np.array([[1.5, -300.0], [0.01, 17.0]], np.float32)
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(x, popxl.float8_152, name="v", log2_scale=1, nan_on_overflow=False)
        bits_v = popxl.variable(
            fp8_utils.host_pow2scale_cast_to_fp8(x, popxl.float8_143), popxl.float8_143, name="bits"
        )
        s_in = popxl.h2d_stream((2, 2), popxl.float8_143, "in")
        loaded = ops.host_load(s_in)
        s_out = popxl.d2h_stream((2, 2), popxl.float16, "out")
        ops.host_store(s_out, ops.pow2scale_cast_from_fp8(loaded, 0))
    feed = fp8_utils.host_pow2scale_cast_to_fp8(x, popxl.float8_143)
    out, sess = _run(ir, {s_in: feed})
    np.testing.assert_array_equal(
        out[s_out], fp8_utils.host_pow2scale_cast_from_fp8(feed, popxl.float16)
    )
    got = sess.get_tensor_data(v)
    assert v.dtype == popxl.float8_152 and got.dtype == popxl.dtypes.np_dtype_float8_152
    np.testing.assert_array_equal(
        got, fp8_utils.host_pow2scale_cast_to_fp8(x, popxl.float8_152, 1, False)
    )
    np.testing.assert_array_equal(sess.get_tensor_data(bits_v).view(np.uint8), feed.view(np.uint8))


def test_float8_variable_bad_input():
    ir = popxl.Ir()
    with ir.main_graph:
        with pytest.raises(TypeError, match="float values .* or uint8 bits, got int16"):
            popxl.variable(np.ones(2, np.int16), popxl.float8_143)
        with pytest.raises(ValueError, match="apply to float8 data only"):
            popxl.variable(np.ones(2, np.float32), log2_scale=2)
        with pytest.raises(TypeError, match="not a plain cast"):
            ops.cast(popxl.variable(np.ones(2, np.float32)), popxl.float8_143)
        with pytest.raises(TypeError, match="float16 or float32 input, got int32"):
            ops.pow2scale_cast_to_fp8(popxl.variable(np.ones(2, np.int32)), 0)


def test_run_time_log2_scale_out_of_range():
    ir = popxl.Ir()
    with ir.main_graph:
        s = popxl.variable(np.int32(40), name="scale")
        y = ops.pow2scale_cast_to_fp8(popxl.variable(np.ones(2, np.float16)), s)
        ops.host_store(popxl.d2h_stream(y.shape, y.dtype), y)
    with pytest.raises(OpDataError, match=r"Pow2ScaleThenCast.*log2_scale is 40; it must be in"):
        _run(ir)


def _scaled_ops(scale: int, throw=None):
    """Run a cast to float8 and back, a scaled matmul, conv and conv transpose, each at the
    run-time log2 scale ``scale``; ``throw``: the session option, set before the Session is
    built and reset to True once it is (PopART reads it when it lowers the ops)."""
    ir = popxl.Ir()
    one8 = fp8_utils.host_pow2scale_cast_to_fp8(np.ones((1, 1, 2, 2)), popxl.float8_143)
    with ir.main_graph:
        s = popxl.variable(np.int32(scale), name="scale")
        x8 = popxl.variable(one8, popxl.float8_143)
        outs = {
            "to": ops.pow2scale_cast_to_fp8(popxl.variable(np.full(2, 0.5, np.float16)), s),
            "from": ops.pow2scale_cast_from_fp8(x8, s, popxl.float32),
            "mm": ops.matmul_pow2scaled(x8, x8, s),
            "conv": ops.conv_pow2scaled(x8, x8, s),
            "convt": ops.conv_transpose_pow2scaled(x8, x8, s),
        }
        streams = {k: popxl.d2h_stream(t.shape, t.dtype, name=k) for k, t in outs.items()}
        for k, t in outs.items():
            ops.host_store(streams[k], t)
    opts = ir._pb_ir.getSessionOptions()
    assert opts.throwIfLog2ScaleTensorNotInRange is True
    if throw is not None:
        opts.throwIfLog2ScaleTensorNotInRange = throw
    with popxl.Session(ir, "ipu_model") as sess:
        opts.throwIfLog2ScaleTensorNotInRange = True
        out = sess.run()
    return {k: out[st].view(np.uint8) if k == "to" else out[st] for k, st in streams.items()}


@pytest.mark.parametrize("scale", [-50, 40, 100])
def test_log2_scale_out_of_range_runs_when_the_option_is_off(scale):
    """PopART's ``throwIfLog2ScaleTensorNotInRange=False``: no range check (PopART calls the
    result undefined); here the scale wraps into its 6-bit signed field (mod 64)."""
    with pytest.raises(OpDataError, match=f"log2_scale is {scale}; it must be in"):
        _scaled_ops(scale)
    with pytest.raises(OpDataError, match=f"log2_scale is {scale}; it must be in"):
        _scaled_ops(scale, throw=True)
    got = _scaled_ops(scale, throw=False)
    wrapped = (scale + 32) % 64 - 32
    want = _scaled_ops(wrapped)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert got["from"][0, 0, 0, 0] == 2.0**wrapped


def test_matmul_and_conv_pow2scaled_against_the_format_definition():
    rng = np.random.default_rng(3)
    a_bits = rng.integers(0, 256, (3, 7)).astype(np.uint8)
    b_bits = rng.integers(0, 256, (7, 4)).astype(np.uint8)
    a_bits[a_bits == 0x80] = 0  # no NaN operands
    b_bits[b_bits == 0x80] = 0
    x_bits = rng.integers(0, 0x7F, (1, 2, 4, 4)).astype(np.uint8)
    w_bits = rng.integers(0x81, 0xFF, (3, 2, 2, 2)).astype(np.uint8)
    ir = popxl.Ir()
    with ir.main_graph:
        a = popxl.variable(a_bits, popxl.float8_143)
        b = popxl.variable(b_bits, popxl.float8_152)
        mm = ops.matmul_pow2scaled(a, b, -20)
        cv = ops.conv_pow2scaled(
            popxl.variable(x_bits, popxl.float8_143),
            popxl.variable(w_bits, popxl.float8_143),
            3,
            stride=(2, 2),
        )
        streams = [popxl.d2h_stream(t.shape, t.dtype) for t in (mm, cv)]
        for s, t in zip(streams, (mm, cv)):
            ops.host_store(s, t)
    out, _ = _run(ir)
    t143, t152 = _table(popxl.float8_143), _table(popxl.float8_152)
    want_mm = (t143[a_bits] @ t152[b_bits] * 2.0**-20).astype(np.float16)
    assert out[streams[0]].dtype == np.float16
    np.testing.assert_array_equal(out[streams[0]], want_mm)  # exact: float8 products, small K
    x, w = t143[x_bits], t143[w_bits]
    want_cv = np.zeros((1, 3, 2, 2))
    for o in range(3):
        for i in range(2):
            for j in range(2):
                want_cv[0, o, i, j] = np.sum(x[0, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2] * w[o])
    np.testing.assert_array_equal(out[streams[1]], (want_cv * 8).astype(np.float16))


@pytest.mark.parametrize("amax, want", [(240.0, 0), (1000.0, -3), (3.0, 6), (0.0, 31)])
def test_fp8_amax_scale(amax, want):
    x = np.array([0.5, -amax, amax / 3], np.float16) if amax else np.zeros(3, np.float16)
    ir = popxl.Ir()
    with ir.main_graph:
        s = addons.fp8_amax_scale(popxl.variable(x), popxl.float8_143)
        st = popxl.d2h_stream(s.shape, s.dtype)
        ops.host_store(st, s)
    out, _ = _run(ir)
    assert out[st] == want
    if amax:
        assert amax * 2.0**want <= 240 < amax * 2.0 ** (want + 1)


def test_float8_remote_variable_round_trip():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2,), popxl.float8_143)
        v = popxl.remote_variable(np.array([1.0, 2.0], np.float32), buf, 0, popxl.float8_143)
        y = ops.pow2scale_cast_from_fp8(ops.remote_load(buf, 0), 0)
        out = popxl.d2h_stream(y.shape, y.dtype)
        ops.host_store(out, y)
        ops.remote_store(buf, 0, ops.pow2scale_cast_to_fp8(y * 2, 0))
    res, sess = _run(ir)
    np.testing.assert_array_equal(res[out], [1.0, 2.0])
    want = fp8_utils.host_pow2scale_cast_to_fp8(np.array([2.0, 4.0]), popxl.float8_143)
    np.testing.assert_array_equal(sess.get_tensor_data(v), want)


def test_float_data_is_never_stored_as_float8_bits():
    from popxl_core.host_data import to_numpy

    with pytest.raises(TypeError, match="host_pow2scale_cast_to_fp8"):
        to_numpy(np.array([1.0, 2.0]), popxl.float8_143)


def test_pow2scaled_ops_have_popxl_op_types():
    """PopXL's matmul_pow2scaled / conv_pow2scaled / conv_transpose_pow2scaled make a MatMul /
    Conv / ConvTranspose with a third (log2 scale) input; the table keeps their own rows, but
    users see PopXL's types. (Their numbers: the op table's samples, bit for bit.)"""
    from addons.testing_utils import ops_of_type

    ir = popxl.Ir()
    g = ir.create_empty_graph("fp8")
    with g:
        a = popxl.graph_input((2, 4), popxl.float8_143, "a")
        b = popxl.graph_input((4, 3), popxl.float8_143, "b")
        x = popxl.graph_input((1, 2, 4, 4), popxl.float8_143, "x")
        w = popxl.graph_input((3, 2, 2, 2), popxl.float8_143, "w")
        mm = ops.matmul_pow2scaled(a, b, 0)
        cv = ops.conv_pow2scaled(x, w, 0)
        wt = popxl.graph_input((2, 3, 2, 2), popxl.float8_152, "wt")
        ct = ops.conv_transpose_pow2scaled(x, wt, -2, stride=(2, 2))
        with pytest.raises(TypeError, match="must be float8_143 or float8_152, got float16"):
            ops.conv_transpose_pow2scaled(ops.cast(x, popxl.float16), wt, 0)
    assert (mm.producer.opType(), cv.producer.opType()) == ("MatMul", "Conv")
    assert ct.producer.opType() == "ConvTranspose"
    assert (ct.shape, ct.dtype) == ((1, 3, 8, 8), popxl.float16)
    text = addons.GraphWithNamedArgs(g).print_schedule()
    lines = text.splitlines()[2:4]
    assert lines[0].startswith(f"    MatMul.{mm.producer.id} (%1 [(2, 4) float8_143], ")
    assert lines[0].count("[") == 4 and "[() int32]) -> (" in lines[0]  # the scale: 3rd input
    assert lines[1].startswith(f"    Conv.{cv.producer.id} (")
    assert ops_of_type(g, "MatMul") == 1 and ops_of_type(g, "Conv") == 1


@pytest.mark.parametrize("dt", FORMATS)
def test_float8_sharded_variables_and_print(dt, capfd):
    """Replica-sharded float8 variables (on chip and remote) gather, print their values and
    write back bit for bit; the sharded buffer holds float8 shards."""
    data = np.array([1.0, -2.5, 0.375, 96.0], np.float32)
    want = fp8_utils.host_pow2scale_cast_to_fp8(data, dt, 1)
    ir = popxl.Ir(replication=2)
    with ir.main_graph, popxl.in_sequence():
        v, shard = popxl.replica_sharded_variable(data, dt, log2_scale=1)
        buf = popxl.replica_sharded_buffer((4,), dt)
        rv = popxl.remote_replica_sharded_variable(want, buf, 0)
        gathered = ops.collectives.replicated_all_gather(shard)
        ops.print_tensor(gathered, "g")
        g2 = ops.collectives.replicated_all_gather(ops.remote_load(buf, 0))
        s = popxl.d2h_stream(g2.shape, dt)
        ops.host_store(s, g2)
    with popxl.Session(ir, "ipu_model") as sess:
        out = sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(v), want)
        sess.write_variable_data(rv, want[::-1].copy())
        np.testing.assert_array_equal(sess.get_tensor_data(rv), want[::-1])
    np.testing.assert_array_equal(out[s][0].reshape(-1), want)
    printed = capfd.readouterr().err
    assert "g:" in printed and "192" in printed  # 96 * 2: the value, not its bits


def test_float8_training_steps_bit_exact():
    """Two SGD steps of a float8 linear layer (float32 master weights; weights and inputs cast
    to float8_143, the gradient to float8_152, all products pow2-scaled matmuls) equal the
    same steps computed from the formats' definition in numpy, bit for bit."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
    w0 = rng.uniform(-0.5, 0.5, (6, 3)).astype(np.float32)
    sx, sw, sg, lr = 4, 6, 8, np.float32(0.125)
    ir = popxl.Ir()
    with ir.main_graph, popxl.in_sequence():
        w = popxl.variable(w0, name="w")
        xv = popxl.variable(x, name="x")
        one_step = ir.create_empty_graph("step")
        with one_step:
            w_in = popxl.graph_input(w0.shape, popxl.float32, "w", by_ref=True)
            x_in = popxl.graph_input(x.shape, popxl.float32, "x")
            x8 = ops.pow2scale_cast_to_fp8(x_in, sx, popxl.float8_143)
            w8 = ops.pow2scale_cast_to_fp8(w_in, sw, popxl.float8_143)
            y = ops.matmul_pow2scaled(x8, w8, -sx - sw)  # float16
            g8 = ops.pow2scale_cast_to_fp8(y, sg, popxl.float8_152)  # dL/dy of L = sum(y*y)/2
            dw = ops.matmul_pow2scaled(g8.T, x8, -sg - sx).T
            ops.scaled_add_(w_in, ops.cast(dw, popxl.float32), b=float(-lr))
        ops.repeat(one_step, 2, w, xv)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        got = sess.get_tensor_data(w)

    t143, t152 = _table(popxl.float8_143), _table(popxl.float8_152)
    want = w0.copy()
    xq = t143[_encode(x.astype(np.float64) * 2.0**sx, popxl.float8_143)]
    for _ in range(2):
        wq = t143[_encode(want.astype(np.float64) * 2.0**sw, popxl.float8_143)]
        y = (xq @ wq * 2.0 ** (-sx - sw)).astype(np.float16)
        gq = t152[_encode(y.astype(np.float64) * 2.0**sg, popxl.float8_152)]
        dw = (gq.T @ xq * 2.0 ** (-sg - sx)).astype(np.float16).T
        want = want + (-lr) * dw.astype(np.float32)
    assert got.dtype == np.float32 and not np.array_equal(got, w0)  # the steps moved w
    np.testing.assert_array_equal(got, want)
