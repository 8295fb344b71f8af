"""addons' tensor-parallel ops as op-table rows (``CrossEntropySharded``,
``LayerNormDistributed`` and their grad ops), on 4 replicas in two groups of 2 (adjacent
replicas, and every second replica), each group with its own data, against torch on the
whole (unsharded) tensors: forward and gradient for a random cotangent; compiled and
interpreted alike, bit for bit; the loss the same bits on every member of a group.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popxl_core as popxl
from addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from addons.ops.cross_entropy_sharded_wr_loss import cross_entropy_sharded_wr_loss as wr
from addons.ops.layer_norm_distributed import layer_norm_distributed
from popxl_core import ops, transforms
from popxl_core.sim import CompileOptions
from popxl_core.sim.cost import CostModel
from popxl_core.sim.machine import MK2

R, TP = 4, 2
GROUPINGS = {"adjacent": (1, TP), "strided": (2, TP)}


def _where(stride: int):
    """Per replica: (its group, its position in the group) under ``ir.replica_grouping(stride,
    TP)`` on R replicas."""
    if stride == 1:
        return [(r // TP, r % TP) for r in range(R)]
    return [(r % stride, r // stride) for r in range(R)]


def _program(fn, arrays: list, stride: int):
    """``fn(*inputs, group)`` and the gradient of its first input for the last array (the
    cotangent); every array per replica (leading axis R)."""
    ir = popxl.Ir(R)
    group = ir.replica_grouping(stride, TP)
    with ir.main_graph, popxl.in_sequence():
        streams = [popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype)) for a in arrays]
        graph = ir.create_graph(lambda *ts: fn(*ts, group=group), *[s.spec for s in streams[:-1]])
        bwd = transforms.autodiff(graph, grads_required=graph.inputs[:1])
        site = ops.call_with_info(graph, *[ops.host_load(s) for s in streams[:-1]])
        (dx,) = ops.call(bwd.graph, ops.host_load(streams[-1]), inputs_dict=bwd.inputs_dict(site))
        outs = [popxl.d2h_stream(t.shape, t.dtype) for t in (site.outputs[0], dx)]
        for s, t in zip(outs, (site.outputs[0], dx)):
            ops.host_store(s, t)
    return ir, streams, outs


def _run(fn, arrays: list, stride: int, interpret: bool = False):
    ir, streams, outs = _program(fn, arrays, stride)
    options = CompileOptions(interpret=interpret, check_specs=interpret)
    with popxl.Session(ir, "ipu_hw", compile_options=options) as sess:
        res = sess.run(dict(zip(streams, arrays)))
    return res[outs[0]], res[outs[1]]


def _per_replica(full: list, stride: int, axis) -> np.ndarray:
    """Replica r's array: its group's ``full[group]``, its shard along ``axis`` (None: whole)."""
    out = []
    for g, p in _where(stride):
        a = full[g]
        out.append(a if axis is None else np.split(a, TP, axis)[p])
    return np.stack(out)


def _torch(fn, x: np.ndarray, dy: np.ndarray):
    t = torch.tensor(x, requires_grad=True)
    y = fn(t)
    (dx,) = torch.autograd.grad(y, t, torch.tensor(dy))
    return y.detach().numpy(), dx.numpy()


def _ce_case(stride: int, reduction: str):
    rng = np.random.default_rng(stride)
    n, classes = 7, 10
    logits = [rng.uniform(-4, 4, (n, classes)).astype(np.float32) for _ in range(R // TP)]
    labels = [rng.integers(0, classes, n) for _ in range(R // TP)]
    per = classes // TP
    shifted = np.stack([labels[g] - p * per for g, p in _where(stride)]).astype(np.int32)
    dys = [rng.standard_normal(() if reduction != "none" else (n,)).astype(np.float32)] * 2
    arrays = [_per_replica(logits, stride, 1), shifted, _per_replica(dys, stride, None)]
    return logits, labels, dys, arrays


@pytest.mark.parametrize("reduction", ["none", "mean"])
@pytest.mark.parametrize("grouping", sorted(GROUPINGS))
def test_cross_entropy_sharded_against_torch_per_group(grouping, reduction):
    stride = GROUPINGS[grouping][0]
    logits, labels, dys, arrays = _ce_case(stride, reduction)

    def fn(x, idx, group):
        return cross_entropy_sharded_loss(x, idx, replica_grouping=group, reduction=reduction)

    y, dx = _run(fn, arrays, stride)
    for r, (g, p) in enumerate(_where(stride)):
        ref = lambda t, g=g: F.cross_entropy(t, torch.tensor(labels[g]), reduction=reduction)
        want_y, want_dx = _torch(ref, logits[g], dys[g])
        np.testing.assert_allclose(y[r], want_y, rtol=3e-7, atol=0)
        np.testing.assert_allclose(dx[r], np.split(want_dx, TP, 1)[p], rtol=1e-6, atol=1e-7)
    mates = [[r for r, w in enumerate(_where(stride)) if w[0] == g] for g in range(R // TP)]
    for a, b in mates:  # the loss is one all-reduced value: the same bits on both members
        assert y[a].tobytes() == y[b].tobytes()


@pytest.mark.parametrize("grouping", sorted(GROUPINGS))
def test_layer_norm_distributed_against_torch_per_group(grouping):
    stride = GROUPINGS[grouping][0]
    rng = np.random.default_rng(10 + stride)
    x = [rng.standard_normal((5, 12)).astype(np.float32) * 2 + 1 for _ in range(R // TP)]
    dy = [rng.standard_normal((5, 12)).astype(np.float32) for _ in range(R // TP)]
    w = rng.uniform(0.5, 1.5, 12).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    ws, bs = (_per_replica([v] * 2, stride, 0) for v in (w, b))

    def fn(t, wt, bt, group):
        return layer_norm_distributed(t, wt, bt, 1e-5, group)

    y, dx = _run(fn, [_per_replica(x, stride, 1), ws, bs, _per_replica(dy, stride, 1)], stride)
    for r, (g, p) in enumerate(_where(stride)):
        ref = lambda t: F.layer_norm(t, (12,), torch.tensor(w), torch.tensor(b), 1e-5)
        want_y, want_dx = _torch(ref, x[g], dy[g])
        np.testing.assert_allclose(y[r], np.split(want_y, TP, 1)[p], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dx[r], np.split(want_dx, TP, 1)[p], rtol=1e-5, atol=2e-6)


def _ln(t, w, b, group):
    return layer_norm_distributed(t, w, b, 1e-5, group)


def test_compiled_and_interpreted_give_the_same_bits():
    logits, labels, dys, arrays = _ce_case(2, "none")

    def ce(x, idx, group):
        return cross_entropy_sharded_loss(x, idx, replica_grouping=group, reduction="none")

    assert _same(_run(ce, arrays, 2), _run(ce, arrays, 2, interpret=True))
    rng = np.random.default_rng(5)
    ln_arrays = [rng.standard_normal(s).astype(np.float32) for s in ((R, 3, 6), (R, 6), (R, 6))]
    ln_arrays.append(rng.standard_normal((R, 3, 6)).astype(np.float32))
    assert _same(_run(_ln, ln_arrays, 1), _run(_ln, ln_arrays, 1, interpret=True))


def _same(a, b) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def _ce(x, idx, group):
    return cross_entropy_sharded_loss(x, idx, replica_grouping=group)


@pytest.mark.parametrize("name", ["CrossEntropySharded", "LayerNormDistributed"])
def test_each_is_one_op_of_the_table(name):
    """The graphs hold the ops themselves, not composites: one forward row and one gradient
    row, and no all-reduce or max beside them."""
    if name == "CrossEntropySharded":
        fn, arrays = _ce, _ce_case(1, "mean")[-1]
    else:
        fn, arrays = _ln, [np.zeros(s, np.float32) for s in ((R, 3, 6), (R, 6), (R, 6), (R, 3, 6))]
    ir, _, _ = _program(fn, arrays, 1)
    types = [op.type for g in _graphs(ir.main_graph) for op in g._ops]
    assert types.count(name) == 1 and types.count(f"{name}Grad") == 1
    assert not [t for t in types if "AllReduce" in t or t == "ReduceMax"], types


def _wr_program(shards: int, rows: int, widths: list):
    """``cross_entropy_sharded_wr_loss`` over ``shards`` IPUs of one replica and its gradient,
    the loss and each shard's gradient streamed out."""
    ir = popxl.Ir()
    rng = np.random.default_rng(7)
    with ir.main_graph:
        xs, ls = [], []
        labels = popxl.variable(rng.integers(0, sum(widths), rows).astype(np.uint32), popxl.uint32)
        for i, w in enumerate(widths):
            with popxl.ipu(i):
                xs.append(popxl.variable(rng.uniform(-3, 3, (rows, w)).astype(np.float32)) + 0)
                ls.append(labels.copy_to_ipu(i) if i else labels + 0)
        ipus = list(range(shards))
        graph = ir.create_graph(
            lambda *ts: wr(list(ts[:shards]), list(ts[shards:]), ipus), *xs, *ls
        )
        bwd = transforms.autodiff(graph, grads_required=graph.inputs[:shards])
        site = ops.call_with_info(graph, *xs, *ls)
        dloss = popxl.variable(rng.standard_normal(rows).astype(np.float32))
        ops.call(bwd.graph, dloss, inputs_dict=bwd.inputs_dict(site))
    return ir, graph, bwd.graph


def test_cross_entropy_sharded_wr_places_its_outputs_and_costs_its_links():
    """The loss on the first IPU, each shard's gradient on its own; the report's IPU-Link
    bytes: the forward's two all-reduces across 4 shards (a ring: 2 x 3/4 of a value per
    sample each), the 3 partial losses sent to IPU 0, the loss gradient sent to the 3 others,
    and the 3 label copies."""
    rows, widths = 6, [3, 3, 2, 2]
    ir, fwd, bwd = _wr_program(4, rows, widths)
    (op,) = [op for op in fwd._ops if op.type == "CrossEntropyShardedWR"]
    (grad,) = [op for op in bwd._ops if op.type == "CrossEntropyShardedGradWR"]
    assert [t.ipu for t in op.outputs] == [0, 0, 1, 2, 3]
    assert [t.ipu for t in grad.outputs] == [0, 1, 2, 3]
    totals = popxl.Session(ir, "ipu_hw").report.totals()
    value = rows * 4  # one float32 per sample
    want = 2 * (2 * 3 * value // 4) + 3 * value + 3 * value + 3 * rows * 4
    assert totals["ipu_link_bytes"] == want


@pytest.mark.parametrize("name,values", [("CrossEntropySharded", 3), ("LayerNormDistributed", 2)])
def test_one_op_costs_its_compute_and_its_all_reduces(name, values):
    """The row's own cost (`CostModel.leaf_work`): its compute set (FLOPs, compute cycles) plus
    a ring all-reduce over the group for each exchange, ``values`` per row of 4 bytes, each
    2 x (TP-1)/TP of it over the IPU-Links, with its own sync."""
    if name == "CrossEntropySharded":
        fn, arrays = _ce, _ce_case(1, "mean")[-1]
    else:
        fn, arrays = _ln, [np.zeros(s, np.float32) for s in ((R, 3, 6), (R, 6), (R, 6), (R, 3, 6))]
    ir, _, _ = _program(fn, arrays, 1)
    (op,) = [op for g in _graphs(ir.main_graph) for op in g._ops if op.type == name]
    model = CostModel(MK2, num_ipus=R, replicas=R)
    work, alone = model.leaf_work(op), model._compute_work(op)
    rows = op.inputs[0].shape[0]
    assert work.link_bytes == values * 2 * (TP - 1) * rows * 4 // TP
    assert work.flops == alone.flops > 0 and alone.cycles.compute > 0
    assert work.cycles.compute == alone.cycles.compute and work.cycles.link > 0
    assert work.cycles.sync == alone.cycles.sync + values * model.sync


def _graphs(graph, seen=None) -> list:
    seen = [graph] if seen is None else seen
    for op in graph._ops:
        for g in op.called_graphs:
            if g not in seen:
                seen.append(g)
                _graphs(g, seen)
    return seen


def test_float16_computes_in_float32_and_rounds():
    """Float16 shards: the statistics in float32, the outputs rounded to float16, against
    torch in float32 on the float16 values (to float16's precision)."""
    rng = np.random.default_rng(3)
    x = [rng.standard_normal((4, 8)).astype(np.float16) for _ in range(R // TP)]
    dy = [rng.standard_normal((4, 8)).astype(np.float16) for _ in range(R // TP)]
    w, b = np.ones(8, np.float16), np.zeros(8, np.float16)
    ws, bs = (_per_replica([v] * 2, 1, 0) for v in (w, b))
    y, dx = _run(_ln, [_per_replica(x, 1, 1), ws, bs, _per_replica(dy, 1, 1)], 1)
    assert y.dtype == dx.dtype == np.float16
    for r, (g, p) in enumerate(_where(1)):
        ref = lambda t: F.layer_norm(t, (8,))
        want_y, want_dx = _torch(ref, x[g].astype(np.float32), dy[g].astype(np.float32))
        np.testing.assert_allclose(y[r], np.split(want_y, TP, 1)[p], rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(dx[r], np.split(want_dx, TP, 1)[p], rtol=1e-2, atol=1e-2)
