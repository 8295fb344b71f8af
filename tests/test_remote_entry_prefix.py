"""A remote variable larger than its buffer's entries: PopXL accepts it (its `remote_variable`
does not compare the variable with the buffer), and PopART streams one entry's worth of the
variable's host data (Poplar's copyToRemoteBuffer copies one entry from the start of the host
buffer) and reads one entry back into it. popart's test_d2hWeightBuffer_elision builds one."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def _program(data, replication=1):
    ir = popxl.Ir(replication=replication)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2, 2), popxl.float32)
        with pytest.warns(UserWarning, match=r"\(2, 2, 2\) .* first 4 elements"):
            w = popxl.remote_variable(data, buf, name="w")
        loaded = ops.remote_load(buf, 0)
        ops.remote_store(buf, 0, loaded * 2.0)
        out = popxl.d2h_stream((2, 2), popxl.float32, "out")
        ops.host_store(out, loaded)
    return ir, w, out


@pytest.mark.parametrize("replication", [1, 2])
def test_entry_is_the_leading_elements_and_only_they_are_read_back(replication):
    data = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    ir, w, out = _program(data, replication)
    with popxl.Session(ir, "ipu_model") as sess:
        loaded = sess.run()[out]
        after = sess.get_tensor_data(w).copy()
    first = data.reshape(-1)[:4].reshape(2, 2)
    np.testing.assert_array_equal(loaded.reshape(-1, 2, 2)[0], first)
    want = data.copy().reshape(-1)
    want[:4] *= 2
    np.testing.assert_array_equal(after, want.reshape(2, 2, 2))


def test_a_variable_smaller_than_an_entry_or_of_another_dtype_is_refused():
    ir = popxl.Ir()
    with ir.main_graph:
        buf = popxl.remote_buffer((2, 2), popxl.float32)
        with pytest.raises(ValueError, match="does not match buffer"):
            popxl.remote_variable(np.ones(3, np.float32), buf, name="small")
        with pytest.raises(ValueError, match="does not match buffer"):
            popxl.remote_variable(np.ones((2, 2, 2), np.int32), buf, name="ints")
