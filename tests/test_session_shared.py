"""`Session.share_variable_storage` (issue 17): a variable's device value is a given torch
tensor, updated in place by runs and read as written between them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl


def _counter_session():
    ir = popxl.Ir()
    with ir.main_graph:
        w = popxl.variable(np.zeros(3, np.float32), name="w")
        popxl.ops.var_updates.accumulate_(w, popxl.constant(np.ones(3, np.float32)))
    session = popxl.Session(ir, "ipu_hw")
    return session, w


def test_share_variable_storage_runs_on_the_tensor_itself():
    session, w = _counter_session()
    t = torch.full((3,), 5.0)
    with session:
        session.share_variable_storage({w: t})
        session.run({})
        assert t.tolist() == [6.0, 6.0, 6.0]  # updated in place, no copy back
        t[0] = 100.0  # a write between runs is what the next run reads
        session.run({})
        assert t.tolist() == [101.0, 7.0, 7.0]
        assert session.get_tensor_data(w).tolist() == [101.0, 7.0, 7.0]


@pytest.mark.parametrize(
    "tensor, message",
    [
        (torch.zeros(3, dtype=torch.float64), r"'w' has dtype torch.float64, the variable float32"),
        (torch.zeros(4), r"'w' has 4 elements, the variable 3"),
        (torch.zeros(6)[::2], r"'w' is not a contiguous CPU tensor"),
    ],
)
def test_share_variable_storage_refuses_what_it_cannot_share(tensor, message):
    session, w = _counter_session()
    with session, pytest.raises(ValueError, match=message):
        session.share_variable_storage({w: tensor})
