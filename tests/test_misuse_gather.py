"""A gather with out-of-range run-time indices keeps PopXL's result (zeros) and warns once per
op, naming the op, the index and the valid range (issue 17): the simulator can say what the
IPU cannot."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_core.ops.gather import GatherIndexWarning
from popxl_core.sim import CompileOptions


def _gather_session(reference: bool, zero_oor: bool = False):
    ir = popxl.Ir()
    with ir.main_graph:
        table = popxl.variable(np.arange(12, dtype=np.float32).reshape(4, 3), name="table")
        idx = popxl.h2d_stream((3,), popxl.int32, "idx")
        out = popxl.d2h_stream((3, 3), popxl.float32, "rows")
        ops.host_store(out, ops.gather(table, ops.host_load(idx), zero_OOR=zero_oor))
    return (
        popxl.Session(ir, "ipu_hw", compile_options=CompileOptions(interpret=reference)),
        idx,
        out,
    )


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
def test_out_of_range_gather_gives_zeros_and_warns_once_per_op(reference):
    session, idx, out = _gather_session(reference)
    with session, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = session.run({idx: np.array([0, 7, 2], np.int32)})[out]
        session.run({idx: np.array([9, 1, 2], np.int32)})
        session.run({idx: np.array([0, 1, 2], np.int32)})
    expected = np.arange(12, dtype=np.float32).reshape(4, 3)[[0, 0, 2]]
    expected[1] = 0
    np.testing.assert_array_equal(first, expected)  # exact: a row copy and zeros
    ours = [w for w in caught if issubclass(w.category, GatherIndexWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    message = str(ours[0].message)
    assert "Gather op" in message and "index 7" in message and "[0, 4)" in message


def test_zero_oor_asked_for_does_not_warn():
    session, idx, out = _gather_session(False, zero_oor=True)
    with session, warnings.catch_warnings():
        warnings.simplefilter("error", GatherIndexWarning)
        rows = session.run({idx: np.array([0, 7, 2], np.int32)})[out]
    assert not rows[1].any()


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_out_of_range_on_any_axis_gives_zeros_there(axis):
    """torch's index_select checks the indices itself (IndexError on axis 0, RuntimeError
    off it): either way the out-of-range entries become zeros, the rest torch's rows."""
    from popxl_core.ops.gather import GATHER

    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    n = x.shape[axis]
    idx = torch.tensor([n - 1, n, -1, 0], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherIndexWarning)
        got = GATHER.kernel(x, idx, axis=axis, zero_OOR=True, available_memory_proportion=None)
    want = torch.index_select(x, axis, torch.tensor([n - 1, 0, 0, 0]))
    want.narrow(axis, 1, 2).zero_()
    assert torch.equal(got, want)
