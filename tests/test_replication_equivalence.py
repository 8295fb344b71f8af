"""Transformed programs against the plain one on the simulator, same data and initial weights.

* Data parallel: R replicas on R slices of a batch, gradients all-reduced with 'mean', give
  the weights of one replica trained on the whole batch.
* Replicated tensor sharding: reduce-scatter of the gradients, an update of each replica's
  shard and an all-gather of the weights give the unsharded update.

Only the order of float32 sums differs (a replica's batch mean, then the mean over
replicas), so the weights agree to float32 round-off: rtol 1e-5 after 3 SGD steps (the
measured worst difference is printed with -s).
"""

from __future__ import annotations

import numpy as np
import pytest

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.ops import collectives as coll
from popxl_core.sim.machine import target
from popxl_core.sim.plan import OutOfMemoryError

BATCH, D_IN, D_HID, CLASSES, STEPS, LR = 8, 5, 7, 3, 3, 0.5


def _mlp(x, w1, w2):
    return ops.gelu(x @ w1) @ w2


def _data(seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((STEPS, BATCH, D_IN)).astype(np.float32)
    ys = rng.integers(0, CLASSES, (STEPS, BATCH)).astype(np.int32)
    w1 = rng.standard_normal((D_IN, D_HID)).astype(np.float32) * 0.5
    w2 = rng.standard_normal((D_HID, CLASSES)).astype(np.float32) * 0.5
    return xs, ys, w1, w2


def _grads(ir, x, y, w1, w2):
    """Gradients of the mean softmax cross-entropy over this replica's batch."""
    g = ir.create_graph(_mlp, x.spec, w1.spec, w2.spec)
    bwd = transforms.autodiff(g, grads_required=g.inputs[1:])
    site = ops.call_with_info(g, x, w1, w2)
    probs = ops.softmax(site.outputs[0], axis=-1)
    _, dlogits = ops.nll_loss_with_softmax_grad(probs, y)
    return ops.call(bwd.graph, dlogits, inputs_dict=bwd.inputs_dict(site))


def _streams(replicas):
    rows = BATCH // replicas
    return popxl.h2d_stream((rows, D_IN), popxl.float32, "x"), popxl.h2d_stream(
        (rows,), popxl.int32, "y"
    )


def _feed(sess, xs, ys, sx, sy, replicas, step):
    rows = BATCH // replicas
    x = xs[step].reshape(replicas, rows, D_IN) if replicas > 1 else xs[step]
    y = ys[step].reshape(replicas, rows) if replicas > 1 else ys[step]
    sess.run({sx: x, sy: y})


def _train_data_parallel(replicas, device="ipu_hw"):
    xs, ys, w1_0, w2_0 = _data()
    ir = popxl.Ir(replicas)
    with ir.main_graph, popxl.in_sequence():
        sx, sy = _streams(replicas)
        w1 = popxl.variable(w1_0, name="w1")
        w2 = popxl.variable(w2_0, name="w2")
        grads = _grads(ir, ops.host_load(sx), ops.host_load(sy), w1, w2)
        for w, g in zip((w1, w2), grads):
            if replicas > 1:
                g = coll.replicated_all_reduce_(g, "mean")
            ops.scaled_add_(w, g, b=-LR)
    with popxl.Session(ir, device) as sess:
        for step in range(STEPS):
            _feed(sess, xs, ys, sx, sy, replicas, step)
    return [sess.get_tensor_data(w).copy() for w in (w1, w2)]


def _train_sharded(replicas):
    """w1 is replica-sharded (35 elements: shards of ceil(35/R), zero-padded); w2 is not."""
    xs, ys, w1_0, w2_0 = _data()
    ir = popxl.Ir(replicas)
    with ir.main_graph, popxl.in_sequence():
        sx, sy = _streams(replicas)
        w1_var, w1_shard = popxl.replica_sharded_variable(w1_0, name="w1")
        w2 = popxl.variable(w2_0, name="w2")
        w1 = coll.replicated_all_gather(w1_shard)  # meta_shape: back to (D_IN, D_HID)
        g1, g2 = _grads(ir, ops.host_load(sx), ops.host_load(sy), w1, w2)
        g1_shard = coll.replicated_reduce_scatter(g1, "mean", None, True)
        ops.scaled_add_(w1_shard, g1_shard, b=-LR)
        ops.scaled_add_(w2, coll.replicated_all_reduce(g2, "mean"), b=-LR)
    with popxl.Session(ir, "ipu_hw") as sess:
        for step in range(STEPS):
            _feed(sess, xs, ys, sx, sy, replicas, step)
    return [sess.get_tensor_data(w).copy() for w in (w1_var, w2)]


def _assert_close(got, want, what):
    worst = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    print(f"{what}: worst |difference| {worst:.3g}")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    moved = max(float(np.max(np.abs(w - w0))) for w, w0 in zip(want, _data()[2:]))
    assert moved > 1e-2  # the comparison is about trained weights


@pytest.mark.parametrize("replicas", [2, 4])
def test_data_parallel_all_reduce_mean_equals_one_replica_on_the_whole_batch(replicas):
    _assert_close(_train_data_parallel(replicas), _train_data_parallel(1), f"R={replicas}")


@pytest.mark.parametrize("replicas", [2, 4])
def test_rts_reduce_scatter_update_all_gather_equals_unsharded_update(replicas):
    _assert_close(_train_sharded(replicas), _train_data_parallel(1), f"RTS R={replicas}")


@pytest.mark.parametrize("replicas", [2, 4])
def test_cpu_device_runs_replicas_like_ipu_hw(replicas):
    """Session(ir, "cpu") runs R replicas (only its memory model differs: no IPU limit)."""
    cpu, hw = _train_data_parallel(replicas, "cpu"), _train_data_parallel(replicas)
    for a, b in zip(cpu, hw):
        np.testing.assert_array_equal(a, b)


def _big_replicated_program():
    ir = popxl.Ir(replication=2)
    with ir.main_graph:
        w = popxl.variable(np.ones((300_000,), np.float32), name="w")  # 1.2 MB per replica
        coll.replicated_all_reduce_(w, "add")
    return ir


def test_cpu_device_does_not_limit_memory_with_replication():
    """One tile (624 KiB) cannot hold w: "cpu" plans it, reports it, runs it; "ipu_hw" stops."""
    sess = popxl.Session(_big_replicated_program(), target("cpu", tiles_per_ipu=1))
    assert sess.plan.out_of_memory
    with sess:
        sess.run({})
    np.testing.assert_array_equal(sess.get_tensor_data(sess.ir.main_graph.variables[0]), 2.0)
    with pytest.raises(OutOfMemoryError):
        popxl.Session(_big_replicated_program(), target("ipu_hw", tiles_per_ipu=1))
