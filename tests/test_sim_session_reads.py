"""Reading replica-sharded variables one by one between runs (session_weights.py
`_store_shards`): the on-chip shards are stored into their entries once between runs, and every
read gives the device's values, as `weights_to_host` does; a shard whose storage a framework
holds is stored on every read."""

from __future__ import annotations

import numpy as np
import torch

import popxl_core as popxl
from popxl_core import ops
from popxl_core.sim.remote_state import RemoteState


def _program(replicas: int, n: int = 3):
    """``n`` replica-sharded variables, each shard incremented by 1 per run."""
    ir = popxl.Ir(replicas)
    pairs = []
    with ir.main_graph, popxl.in_sequence():
        for k in range(n):
            data = np.arange(4, dtype=np.float32) + 10 * k
            w, shard = popxl.replica_sharded_variable(data, name=f"w{k}")
            ops.var_updates.accumulate_(shard, popxl.constant(np.ones(shard.shape, np.float32)))
            pairs.append((w, shard))
    return ir, pairs


def _counting(monkeypatch) -> list:
    """Calls of `RemoteState.store_shards` (the real one runs)."""
    calls: list = []
    real = RemoteState.store_shards

    def store_shards(self, device):
        calls.append(1)
        real(self, device)

    monkeypatch.setattr(RemoteState, "store_shards", store_shards)
    return calls


def test_reading_each_sharded_variable_stores_the_shards_once_per_run(monkeypatch):
    calls = _counting(monkeypatch)
    ir, pairs = _program(2)
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in (1, 2):
            sess.run()
            got = [sess.get_tensor_data(w).copy() for w, _ in pairs]
            want = [np.arange(4, dtype=np.float32) + 10 * k + step for k in range(len(pairs))]
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
            assert len(calls) == step  # not once per variable read
        sess.weights_to_host()
        assert len(calls) == 3  # weights_to_host stores them all, as before


def test_a_shard_held_by_a_framework_is_stored_on_every_read():
    """One replica: a shard's device tensor handed out and written between two reads of
    different variables, with no run between them: the second read sees the write."""
    ir, pairs = _program(1, n=2)
    (w0, _), (w1, s1) = pairs
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.run()
        np.testing.assert_array_equal(sess.get_tensor_data(w0), np.arange(4) + 1.0)
        held = sess.device_tensor(s1)
        with torch.no_grad():
            held.fill_(7.0)
        np.testing.assert_array_equal(sess.get_tensor_data(w1), np.full(4, 7.0))
