"""Grouped and replica-sharded variables as Graphcore's test_grouped_initialization reads
them: `ReplicaGrouping._to_variable_settings(...).groups(n)`, an RTS variable retrieved with
``retrieval_mode='all_replicas'`` (every replica's whole value, not its shard), and a
one-replica-per-group RTS variable in a buffer of its flat size."""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops


def test_variable_settings_groups():
    ir = popxl.Ir(replication=4)
    orth = ir.replica_grouping(stride=2, group_size=2)
    assert orth._to_variable_settings("all_replicas").groups(4) == [[0, 2], [1, 3]]
    vs = ir.replica_grouping(stride=1, group_size=2)._to_variable_settings()
    assert vs.groups(4) == [[0, 1], [2, 3]] and vs.getGroupCount(8) == 4
    assert vs.numReplicasReturningVariable(4) == 2
    with pytest.raises(ValueError, match="retrieval_mode"):
        orth._to_variable_settings("some")


def _sharded_plus_replica(ir, data, rg, buffer_shape=None):
    """A replica-sharded variable whose shards each replica adds 1 to."""
    with ir.main_graph, popxl.in_sequence():  # the store after the update
        if buffer_shape is None:
            v, shard = popxl.replica_sharded_variable(
                data, popxl.float32, "W", replica_grouping=rg, retrieval_mode="all_replicas"
            )
        else:
            buf = popxl.RemoteBuffer(buffer_shape, popxl.float32, 1)
            v = popxl.remote_replica_sharded_variable(
                data, buf, 0, popxl.float32, "W", replica_grouping=rg
            )
            shard = ops.remote_load(buf, 0)
        ops.var_updates.accumulate_(shard, popxl.constant(1.0))
        if buffer_shape is not None:
            ops.remote_store(buf, 0, shard)
    return v


def test_rts_all_replicas_gives_whole_values():
    ir = popxl.Ir(replication=2)
    rg = ir.replica_grouping(stride=1, group_size=2)
    data = np.arange(20, dtype=np.float32).reshape(4, 5)
    v = _sharded_plus_replica(ir, data, rg)
    with popxl.Session(ir, "ipu_model") as sess:
        before = sess.get_tensor_data(v).copy()
        sess.run()
    np.testing.assert_array_equal(before, [data, data])
    np.testing.assert_array_equal(sess.get_tensor_data(v), [data + 1, data + 1])


def test_one_shard_rts_variable_in_a_flat_buffer():
    ir = popxl.Ir(replication=2)
    rg = ir.replica_grouping(stride=1, group_size=1)  # two groups of one: shards of one
    data = np.arange(40, dtype=np.float32).reshape(2, 4, 5)
    v = _sharded_plus_replica(ir, data, rg, buffer_shape=(20,))
    with popxl.Session(ir, "ipu_model") as sess:
        sess.run()
    np.testing.assert_array_equal(sess.get_tensor_data(v), data + 1)
