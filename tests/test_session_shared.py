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


def _replicated_counter(replicas: int, **variable_kwargs):
    """Each replica adds its replica-dependent input to ``w`` and stores ``w``."""
    ir = popxl.Ir()
    ir.replication_factor = replicas
    with ir.main_graph, popxl.in_sequence():  # w is stored after the update
        w = popxl.variable(np.zeros(3, np.float32), name="w", **variable_kwargs)
        x = popxl.h2d_stream((3,), popxl.float32, "x")
        popxl.ops.var_updates.accumulate_(w, popxl.ops.host_load(x, "x"))
        out = popxl.d2h_stream((3,), popxl.float32, "w_out")
        popxl.ops.host_store(out, w)
    return popxl.Session(ir, "ipu_hw"), w, x, out


def test_with_replicas_the_tensor_is_replica_0s_value_and_writes_reach_every_replica():
    """Replica 0's device value is the tensor (updated in place, no copy back); the others
    hold copies that take a write into it before the next run."""
    session, w, x, out = _replicated_counter(2)
    t = torch.full((3,), 5.0)
    feeds = {x: np.array([[1, 1, 1], [2, 2, 2]], np.float32)}  # the replicas diverge
    with session:
        session.share_variable_storage({w: t})
        got = session.run(feeds)[out]
        assert t.tolist() == [6.0, 6.0, 6.0] and got.tolist() == [[6.0] * 3, [7.0] * 3]
        t[0] = 100.0  # reaches replica 1 too: its copy becomes replica 0's value
        got = session.run(feeds)[out]
        assert got.tolist() == [[101.0, 7.0, 7.0], [102.0, 8.0, 8.0]]
        assert session.get_tensor_data(w).tolist() == [101.0, 7.0, 7.0]
        assert t.tolist() == [101.0, 7.0, 7.0]


def test_with_replicas_a_variable_read_per_replica_is_not_shared():
    session, w, _, _ = _replicated_counter(2, retrieval_mode="all_replicas")
    with session:
        assert not session.storage_shareable(w)
        with pytest.raises(ValueError, match=r"'w' is not one tensor read from replica 0"):
            session.share_variable_storage({w: torch.zeros(3)})
