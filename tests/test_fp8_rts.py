"""float8 end to end, against the formats' definition (tests/test_fp8.py's `_table` and
`_encode`): every code's host round trip (stream in and out, variables, remote variables), and
a float8 remote variable with replicated tensor sharding updated on the device step by step."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops
from tests.test_fp8 import FORMATS, _encode, _table


@pytest.mark.parametrize("dt", FORMATS)
def test_every_code_round_trips_through_host_and_device(dt):
    codes = np.arange(256, dtype=np.uint8).view(dt.as_numpy())
    ir = popxl.Ir()
    with ir.main_graph:
        s_in, s_out = popxl.h2d_stream((256,), dt, "in"), popxl.d2h_stream((256,), dt, "out")
        ops.host_store(s_out, ops.host_load(s_in))
        v = popxl.variable(np.zeros(256, np.uint8), dt, name="v")
        buf = popxl.remote_buffer((256,), dt)
        rv = popxl.remote_variable(np.zeros(256, np.uint8), buf, 0, dt, name="rv")
    with popxl.Session(ir, "ipu_model") as sess:
        out = sess.run({s_in: codes})[s_out]
        sess.write_variables_data({v: codes, rv: codes})
        got_v, got_rv = sess.get_tensor_data(v), sess.get_tensor_data(rv)
    for got in (out, got_v, got_rv):
        assert got.dtype == dt.as_numpy()
        np.testing.assert_array_equal(got.view(np.uint8), np.arange(256))
    decoded = popxl.fp8_utils.host_pow2scale_cast_from_fp8(out, popxl.float64)
    np.testing.assert_array_equal(decoded, _table(dt))  # NaN only at 0x80


@pytest.mark.parametrize("dt", FORMATS)
def test_float8_rts_remote_variable_updated_bit_exact(dt):
    """Each step: load this replica's shard, all-gather, decode at 2**-s to float16, update
    (x * 0.75 - 0.5), encode at 2**s, keep this replica's slice and store it back."""
    s, steps = 2, 3
    data = np.random.default_rng(4).uniform(-12, 12, 8).astype(np.float32)
    ir = popxl.Ir(replication=2)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.replica_sharded_buffer((8,), dt)
        v = popxl.remote_replica_sharded_variable(data, buf, 0, dt, "v", log2_scale=s)
        step = ir.create_empty_graph("step")
        with step, popxl.in_sequence():
            full = ops.collectives.replicated_all_gather(ops.remote_load(buf, 0))
            x = ops.pow2scale_cast_from_fp8(full, -s, popxl.float16)
            new = ops.pow2scale_cast_to_fp8(x * 0.75 - 0.5, s, dt)
            ops.remote_store(buf, 0, ops.collectives.replica_sharded_slice(new))
        ops.repeat(step, steps)
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
        got = sess.get_tensor_data(v)

    table = _table(dt)
    bits = _encode(data.astype(np.float64) * 2.0**s, dt)
    for _ in range(steps):
        x = (table[bits] * 2.0**-s).astype(np.float16)
        y = x * np.float16(0.75) - np.float16(0.5)  # float16 arithmetic, as on the device
        bits = _encode(y.astype(np.float64) * 2.0**s, dt)
    assert got.dtype == dt.as_numpy() and got.shape == (8,)
    assert not np.array_equal(bits, _encode(data.astype(np.float64) * 2.0**s, dt))
    np.testing.assert_array_equal(got.view(np.uint8), bits)
