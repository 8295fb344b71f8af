"""A host load whose value nothing reads (an optimizer hyperparameter a program keeps off)
consumes its transfer without making a tensor (`Runtime.skip`): the run's transfer counts and
errors are those of a load, the results the same."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops

F32 = np.float32


def _program(nht: int = 1):
    ir = popxl.Ir()
    ir.num_host_transfers = nht
    with ir.main_graph:
        x_in = popxl.h2d_stream((3,), popxl.float32, "x")
        unread_in = popxl.h2d_stream((), popxl.float32, "unread")
        y_out = popxl.d2h_stream((3,), popxl.float32, "y")
        x = ops.host_load(x_in, "x")
        ops.host_load(unread_in, "unread")
        ops.host_store(y_out, ops.add(x, x))
    return ir, x_in, unread_in, y_out


def test_unread_load_is_skipped_and_the_run_is_unchanged():
    ir, x_in, unread_in, y_out = _program()
    session = popxl.Session(ir, "ipu_hw")
    source = session._program.main.source
    assert source.count("RT.skip(") == 1 and source.count("RT.load(") == 1
    x = np.array([1.0, -2.0, 0.5], F32)
    with session:
        out = session.run({x_in: x, unread_in: np.array(3.0, F32)})
    np.testing.assert_array_equal(out[y_out], 2 * x)  # exact: x + x


def test_unread_load_still_needs_its_input():
    ir, x_in, unread_in, _ = _program()
    session = popxl.Session(ir, "ipu_hw")
    with session, pytest.raises(Exception, match="unread"):
        session.run({x_in: np.zeros(3, F32)})
