"""Replicated collectives on the simulator against numpy / torch references, every reduce op,
replica groups, and gradients with random per-replica cotangents.

Tolerances: integer and 'local' results are exact; float reductions are folded in replica
order like the reference, so they match exactly too (assert_array_equal) unless noted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl
from popxl_core import ops, transforms
from popxl_core.ops import collectives as coll

R = 4


@pytest.fixture(autouse=True, params=["lockstep", "threads"])
def replica_mode(request, monkeypatch):
    """Every test with the replicas in lock step (greenlets, the default) and in threads."""
    from popxl_core.sim import runtime

    monkeypatch.setattr(runtime, "LOCKSTEP", request.param == "lockstep")
    return request.param


GROUPINGS = [None, (1, 2), (2, 2), (1, 4), (1, 1)]


def _run(build, data: np.ndarray, groups=None):
    """Each replica holds ``data[r]``; ``build(x, ir)`` returns tensors stored to the host.
    Returns one array per stored tensor, shaped (R, *shape)."""
    ir = popxl.Ir(R)
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(data, name="x", replica_grouping=ir.replica_grouping(1, 1))
        outs = build(x, ir)
        streams = []
        for t in outs:
            s = popxl.d2h_stream(t.shape, t.dtype, f"out{len(streams)}")
            ops.host_store(s, t)
            streams.append(s)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run()
    return [res[s] for s in streams]


def _members(ir_groups, r):
    if ir_groups is None:
        return list(range(R))
    stride, size = ir_groups
    a = _assignment(stride, size)
    return [s for s in range(R) if a[s] == a[r]]


def _assignment(stride, size):
    ir = popxl.Ir(R)
    return ir.replica_grouping(stride, size).assignment


def _group(ir, g):
    return None if g is None else ir.replica_grouping(*g)


def _fold(op, vals):
    out = vals[0]
    for v in vals[1:]:
        out = {
            "add": np.add,
            "mul": np.multiply,
            "min": np.minimum,
            "max": np.maximum,
            "and": np.logical_and,
            "or": np.logical_or,
        }[op](out, v)
    return out


def _ref_reduce(op, vals):
    if op == "mean":
        return _fold("add", vals) / np.float32(len(vals))
    if op == "square_add":
        return _fold("add", [v * v for v in vals])
    if op == "local":
        return vals[0]
    return _fold(op, vals)


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("op", ["add", "mean", "mul", "min", "max", "square_add", "local"])
def test_all_reduce_every_op_and_group(op, grouping):
    data = np.random.default_rng(0).standard_normal((R, 2, 3)).astype(np.float32)
    (got,) = _run(lambda x, ir: [coll.replicated_all_reduce(x, op, _group(ir, grouping))], data)
    for r in range(R):
        vals = [data[m] for m in _members(grouping, r)] if op != "local" else [data[r]]
        np.testing.assert_array_equal(got[r], _ref_reduce(op, vals).astype(np.float32))


@pytest.mark.parametrize("op", ["and", "or", "logical_and"])
def test_all_reduce_logical(op):
    data = np.array([[True, False], [True, True], [True, False], [True, True]])
    (got,) = _run(lambda x, ir: [coll.replicated_all_reduce(x, op)], data)
    name = coll.to_collective_op(op)
    np.testing.assert_array_equal(got, np.stack([_fold(name, list(data))] * R))


def test_all_reduce_inplace_overwrites_and_returns_input():
    data = np.arange(R * 3, dtype=np.float32).reshape(R, 3)

    def build(x, ir):
        y = x * 1.0
        z = coll.replicated_all_reduce_(y, "add")
        assert z.id != y.id or z is y
        return [y, z]

    y, z = _run(build, data)
    np.testing.assert_array_equal(y, np.stack([data.sum(0)] * R))
    np.testing.assert_array_equal(z, y)


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_reduce_scatter_pads_to_ceil(grouping):
    data = np.random.default_rng(1).standard_normal((R, 5)).astype(np.float32)
    (got,) = _run(
        lambda x, ir: [coll.replicated_reduce_scatter(x, "add", _group(ir, grouping))], data
    )
    for r in range(R):
        members = _members(grouping, r)
        n = len(members)
        total = _fold("add", [data[m] for m in members])
        shard = -(-5 // n)
        padded = np.concatenate([total, np.zeros(shard * n - 5, np.float32)])
        pos = members.index(r)
        np.testing.assert_array_equal(got[r], padded[pos * shard : (pos + 1) * shard])


@pytest.mark.parametrize("mode", ["concat", "new_axis"])
@pytest.mark.parametrize("grouping", GROUPINGS)
def test_all_gather_modes(mode, grouping):
    data = np.random.default_rng(2).standard_normal((R, 2, 3)).astype(np.float32)
    (got,) = _run(
        lambda x, ir: [coll.replicated_all_gather(x, 1, _group(ir, grouping), mode)], data
    )
    for r in range(R):
        parts = [data[m] for m in _members(grouping, r)]
        want = np.stack(parts, 1) if mode == "new_axis" else np.concatenate(parts, 1)
        np.testing.assert_array_equal(got[r], want)


def test_sharded_slice_then_gather_restores_meta_shape():
    data = np.stack([np.arange(7, dtype=np.float32)] * R)

    def build(x, ir):
        shard = coll.replica_sharded_slice(x)
        assert shard.shape == (2,) and shard.meta_shape == (7,)
        return [shard, coll.replicated_all_gather(shard)]

    shard, full = _run(build, data)
    np.testing.assert_array_equal(shard.reshape(-1)[:7], data[0])
    np.testing.assert_array_equal(full, data)


def test_replicated_slice_keeps_rank():
    data = np.stack([np.arange(16, dtype=np.float32).reshape(2, 8)] * R)
    (got,) = _run(lambda x, ir: [coll.replicated_slice(x, 1)], data)
    for r in range(R):
        np.testing.assert_array_equal(got[r], data[0][:, 2 * r : 2 * r + 2])


def _grads(fwd, data, cot):
    """Forward ``fwd`` on every replica and its gradient for per-replica cotangent ``cot``."""
    ir = popxl.Ir(R)
    with ir.main_graph, popxl.in_sequence():
        x = popxl.variable(data, name="x", replica_grouping=ir.replica_grouping(1, 1))
        c = popxl.variable(cot, name="c", replica_grouping=ir.replica_grouping(1, 1))
        g = ir.create_graph(fwd, x.spec)
        bwd = transforms.autodiff(g)
        site = ops.call_with_info(g, x)
        (dx,) = ops.call(bwd.graph, c, inputs_dict=bwd.inputs_dict(site))
        s = popxl.d2h_stream(dx.shape, dx.dtype, "dx")
        ops.host_store(s, dx)
    with popxl.Session(ir, "ipu_hw") as sess:
        return sess.run()[s]


def _torch_grads(fn, data, cot):
    xs = [torch.tensor(d, requires_grad=True) for d in data]
    ys = fn(xs)
    torch.autograd.backward(ys, [torch.tensor(c) for c in cot])
    return np.stack([x.grad.numpy() for x in xs])


@pytest.mark.parametrize("op", ["add", "mean"])
def test_all_reduce_grad_matches_autograd(op):
    rng = np.random.default_rng(3)
    data = rng.standard_normal((R, 3)).astype(np.float32)
    cot = rng.standard_normal((R, 3)).astype(np.float32)
    got = _grads(lambda x: coll.replicated_all_reduce(x, op), data, cot)

    def ref(xs):
        total = sum(xs[1:], xs[0])
        return [total / R if op == "mean" else total] * R

    np.testing.assert_allclose(got, _torch_grads(ref, data, cot), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["add", "mean"])
def test_reduce_scatter_grad_matches_autograd(op):
    rng = np.random.default_rng(4)
    data = rng.standard_normal((R, 6)).astype(np.float32)  # 6 over 4 replicas: padded to 8
    cot = rng.standard_normal((R, 2)).astype(np.float32)
    got = _grads(lambda x: coll.replicated_reduce_scatter(x, op), data, cot)

    def ref(xs):
        total = sum(xs[1:], xs[0]) / (R if op == "mean" else 1)
        padded = torch.cat([total, total.new_zeros(2)])
        return [padded[2 * r : 2 * r + 2] for r in range(R)]

    np.testing.assert_allclose(got, _torch_grads(ref, data, cot), rtol=1e-6, atol=1e-6)


def test_all_gather_grad_is_the_replicas_own_slice():
    # PopXL: the cotangent is taken as the same on every replica, each keeps its own slice
    rng = np.random.default_rng(5)
    data = rng.standard_normal((R, 2)).astype(np.float32)
    cot = rng.standard_normal((R, 8)).astype(np.float32)
    got = _grads(lambda x: coll.replicated_all_gather(x), data, cot)
    np.testing.assert_array_equal(got, np.stack([cot[r, 2 * r : 2 * r + 2] for r in range(R)]))


def test_no_gradient_for_max():
    data = np.ones((R, 2), np.float32)
    with pytest.raises(NotImplementedError, match="'max' has no gradient"):
        _grads(lambda x: coll.replicated_all_reduce(x, "max"), data, data)


def test_errors_name_the_problem():
    ir = popxl.Ir(R)
    with ir.main_graph:
        x = popxl.variable(np.ones((3, 2), np.float32), name="x")
        with pytest.raises(ValueError, match="size 3, which the 4 replicas"):
            coll.replicated_slice(x, 0)
        with pytest.raises(ValueError, match="Unknown collective op 'sum_sq'"):
            coll.replicated_all_reduce(x, "sum_sq")
        with pytest.raises(ValueError, match="has no meta_shape"):
            coll.replicated_all_gather(x, output_shape="meta_shape")
        other = popxl.Ir(2).replica_grouping(1, 2)
        with pytest.raises(ValueError, match="made for 2 replicas"):
            coll.replicated_all_reduce(x, "add", other)
    with pytest.raises(ValueError, match="does not divide the replication factor 4"):
        ir.replica_grouping(3, 1)


def test_error_in_one_replica_does_not_hang():
    ir = popxl.Ir(R)
    with ir.main_graph, popxl.in_sequence():
        buf = popxl.remote_buffer((2,), popxl.float32, entries=2)
        idx = popxl.variable(
            np.arange(R, dtype=np.int32), name="i", replica_grouping=ir.replica_grouping(1, 1)
        )
        x = ops.remote_load(buf, idx)  # replicas 2 and 3 read past the 2 entries
        coll.replicated_all_reduce_(x, "add")
    with popxl.Session(ir, "ipu_hw") as sess:
        with pytest.raises(IndexError, match="Remote buffer 1 has 2 entries; offset 2"):
            sess.run()


def test_many_collectives_in_a_loop_with_in_place_writes_after_each():
    """A value written in place right after a collective must not reach a replica still
    reading it (threads: the exchange keeps a snapshot; lock step: every result is computed
    before any replica resumes)."""
    data = np.arange(R, dtype=np.float32).reshape(R, 1) + 1

    def build(x, ir):
        def body(t):
            s = coll.replicated_all_reduce(t, "add")
            t += s  # in place, right after the collective
            return t * np.float32(0.25)

        g = ir.create_graph(body, x.spec)
        return list(ops.repeat(g, 40, x))

    (got,) = _run(build, data)
    want = data.copy()
    for _ in range(40):
        want = (want + want.sum(0, dtype=np.float32)) * np.float32(0.25)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("else_collective", [False, True])
def test_replicas_taking_different_branches_raise_instead_of_hanging(else_collective):
    from popxl_core.sim.rendezvous import ReplicaMismatchError

    flags = np.array([True, False, True, True])
    data = np.ones((R, 2), np.float32)
    ir = popxl.Ir(R)
    with ir.main_graph:
        x = popxl.variable(data, name="x", replica_grouping=ir.replica_grouping(1, 1))
        c = popxl.variable(flags, name="c", replica_grouping=ir.replica_grouping(1, 1))
        then_g = ir.create_graph(lambda t: coll.replicated_all_reduce(t, "add"), x.spec)
        other = (
            (lambda t: coll.replicated_all_gather(t)[:2])
            if else_collective
            else (lambda t: t * 1.0)
        )
        else_g = ir.create_graph(other, x.spec)
        (y,) = ops.conditional(c, then_g, else_g, [x], [x])
        s = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(s, y)
    with popxl.Session(ir, "ipu_hw") as sess:
        match = "replica 1 at ReplicatedAllGather" if else_collective else "finished its program"
        with pytest.raises(ReplicaMismatchError, match=match):
            sess.run()
