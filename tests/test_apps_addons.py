"""The popxl.addons pieces Graphcore's PopXL applications import, against torch.

The tensor-parallel ones run on 2 replicas in one group, each holding its shard (classes of
the logits, hidden units of the layer norm), and are compared with torch on the whole tensor:
forward and gradient, each replica's gradient the shard of torch's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import popxl_core as popxl
from addons.array_munging import shard, tensor_parallel_output
from addons.layers import Embedding
from addons.layers.linear_gq import LinearGQ
from addons.named_replica_grouping import fill_none_group, get_ild_replica_grouping
from addons.ops.cross_entropy_sharded_loss import cross_entropy_sharded_loss
from addons.ops.group_quantize_decompress import (
    group_quantize_compress_numpy,
    group_quantize_decompress_numpy,
)
from addons.ops.layer_norm_distributed import layer_norm_distributed
from popxl_core import ops, transforms

TP = 2


def _tp_program(fn, x: np.ndarray, others: list, dy: np.ndarray):
    """The Ir of `_run_tp`, its input streams (x and others, then dy) and output streams."""
    ir = popxl.Ir(TP)
    group = ir.replica_grouping(1, TP)
    with ir.main_graph, popxl.in_sequence():
        specs = [popxl.h2d_stream(a.shape[1:], popxl.dtype.as_dtype(a.dtype)) for a in (x, *others)]
        gs = popxl.h2d_stream(dy.shape[1:], popxl.float32, "dy")
        graph = ir.create_graph(lambda *ts: fn(*ts, group=group), *[s.spec for s in specs])
        bwd = transforms.autodiff(graph, grads_required=graph.inputs[:1])
        site = ops.call_with_info(graph, *[ops.host_load(s) for s in specs])
        (dx,) = ops.call(bwd.graph, ops.host_load(gs), inputs_dict=bwd.inputs_dict(site))
        outs = [popxl.d2h_stream(t.shape, t.dtype) for t in (site.outputs[0], dx)]
        ops.host_store(outs[0], site.outputs[0])
        ops.host_store(outs[1], dx)
    return ir, [*specs, gs], outs


def _run_tp(fn, x: np.ndarray, others: list, dy: np.ndarray):
    """y = fn(x, *others, group) and dx for cotangent dy on TP replicas, every array given
    per replica (leading axis TP); (y, dx) per replica."""
    ir, ins, outs = _tp_program(fn, x, others, dy)
    with popxl.Session(ir, "ipu_hw") as sess:
        res = sess.run(dict(zip(ins, (x, *others, dy))))
    return res[outs[0]], res[outs[1]]


def _torch(fn, x: np.ndarray, dy: np.ndarray, *args):
    t = torch.tensor(x, requires_grad=True)
    y = fn(t, *args)
    (dx,) = torch.autograd.grad(y, t, torch.tensor(dy))
    return y.detach().numpy(), dx.numpy()


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_sharded_loss_matches_torch(reduction):
    rng = np.random.default_rng(0)
    n, classes = 6, 8
    logits = rng.uniform(-3, 3, (n, classes)).astype(np.float32)
    labels = rng.integers(0, classes, n)
    dy = rng.standard_normal(() if reduction != "none" else (n,)).astype(np.float32)
    per = classes // TP
    shifted = np.stack([labels - r * per for r in range(TP)]).astype(np.int32)

    def fn(x, idx, group):
        return cross_entropy_sharded_loss(x, idx, replica_grouping=group, reduction=reduction)

    y, dx = _run_tp(fn, shard(logits, TP, 1), [shifted], np.stack([dy] * TP))
    want_y, want_dx = _torch(
        lambda t: F.cross_entropy(t, torch.tensor(labels), reduction=reduction), logits, dy
    )
    for r in range(TP):  # loss identical on the group; each replica its shard of the gradient
        np.testing.assert_allclose(y[r], want_y, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dx[r], want_dx[:, r * per : (r + 1) * per], atol=1e-6)


def test_cross_entropy_sharded_loss_ignore_index():
    rng = np.random.default_rng(1)
    logits = rng.uniform(-3, 3, (5, 4)).astype(np.float32)
    labels = np.array([0, 3, 1, 3, 2])
    shifted = np.stack([labels - r * 2 for r in range(TP)]).astype(np.int32)
    ignore = np.stack([np.int32(3 - r * 2) for r in range(TP)])  # label 3, shifted per shard

    def fn(x, idx, ign, group):
        return cross_entropy_sharded_loss(x, idx, ign, replica_grouping=group)

    y, dx = _run_tp(fn, shard(logits, TP, 1), [shifted, ignore], np.ones((TP,), np.float32))
    want_y, want_dx = _torch(
        lambda t: F.cross_entropy(t, torch.tensor(labels), ignore_index=3), logits, np.float32(1)
    )
    np.testing.assert_allclose(y, [want_y] * TP, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(list(dx), 1), want_dx, atol=1e-6)


def test_layer_norm_distributed_matches_torch():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    dy = rng.standard_normal((3, 8)).astype(np.float32)

    def fn(t, wt, bt, group):
        return layer_norm_distributed(t, wt, bt, 1e-5, group)

    sx, sw, sb, sdy = (shard(a, TP, -1) for a in (x, w, b, dy))
    y, dx = _run_tp(fn, sx, [sw, sb], sdy)
    want_y, want_dx = _torch(
        lambda t: F.layer_norm(t, (8,), torch.tensor(w), torch.tensor(b), 1e-5), x, dy
    )
    np.testing.assert_allclose(np.concatenate(list(y), 1), want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(list(dx), 1), want_dx, rtol=1e-5, atol=1e-5)


def test_embedding_shards_and_offsets():
    assert Embedding.get_vocab_shard_size(100, 4) == 32  # 25 rounded up to 16s
    assert Embedding.get_vocab_shard_size(10, 1) == 16
    np.testing.assert_array_equal(Embedding.get_offsets(100, 4), [0, 32, 64, 96])
    ir = popxl.Ir(TP)
    with ir.main_graph:
        layer = Embedding(popxl.float32, 40, 3, replica_grouping=ir.replica_grouping(TP, 1))
        facts, graph = layer.create_graph(popxl.TensorSpec((2,), popxl.int32))
    assert graph.args.weight.shape == (32, 3) and layer.n_shards == TP  # 20 rows -> 32


def test_tensor_parallel_output_drops_unwritten_transfers():
    data = np.arange(3 * 4 * 2).reshape(3, 4, 2)  # (transfers, replicas = dp 2 x tp 2, 2)
    out = tensor_parallel_output(data, 3, 2, 4, (2,), true_num_host_transfers=2)
    np.testing.assert_array_equal(out, data[:2].reshape(2, 2, 2, 2)[:, :, 0].reshape(4, 2))
    both = tensor_parallel_output(data, 3, 2, 4, (2,), tp_identical=False)
    assert both.shape == (6, 2, 2)


def test_ild_replica_grouping_and_fill_none_group(monkeypatch):
    monkeypatch.setenv("POPLAR_TARGET_OPTIONS", '{"ipuLinkDomainSize": 4}')
    ir = popxl.Ir(8)
    with ir.main_graph:
        whole = get_ild_replica_grouping()  # all 8 replicas: cut to one domain of 4
        assert (whole.stride, whole.group_size) == (1, 4)
        strided = get_ild_replica_grouping(ir.replica_grouping(2, 4))
        assert (strided.stride, strided.group_size) == (2, 2)
        small = ir.replica_grouping(1, 2)
        assert get_ild_replica_grouping(small) == small
    assert fill_none_group(None, small) is small and fill_none_group(whole, small) is whole


def test_linear_gq_matches_torch_with_the_decompressed_weight():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 16).half()
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float16)
    ir = popxl.Ir()
    with ir.main_graph:
        layer = LinearGQ(16, group_size=8)
        facts, graph = layer.create_graph(popxl.TensorSpec((2, 8), popxl.float16))
        variables = facts.init()
        (y,) = graph.bind(variables).call(popxl.constant(x, popxl.float16))
        ys = popxl.d2h_stream(y.shape, y.dtype, "y")
        ops.host_store(ys, y)
    weights = LinearGQ.torch_mapping(variables, lin, popxl.float16, group_size=8)
    with popxl.Session(ir, "ipu_hw") as sess:
        sess.write_variables_data(weights)
        out = sess.run()[ys]
    packed, scale, bias = group_quantize_compress_numpy(lin.weight.detach().T.numpy(), 8, -1)
    w = group_quantize_decompress_numpy(packed, scale, bias, -1)
    want = (torch.tensor(x) @ torch.tensor(w) + lin.bias.detach()).numpy()
    np.testing.assert_allclose(
        out.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2
    )
    # the 4-bit levels are within half a step of the weight
    step = np.repeat(scale.astype(np.float32), 8, axis=-1).reshape(w.shape)
    assert np.all(np.abs(w - lin.weight.detach().T.numpy()) <= step / 2 + 1e-3)


def _ln(t, w, b, group):
    return layer_norm_distributed(t, w, b, 1e-5, group)


def _ce(x, idx, group):
    return cross_entropy_sharded_loss(x, idx, replica_grouping=group, reduction="none")


@pytest.mark.parametrize("fn,all_reduces", [(_ln, 4), (_ce, 3)])
def test_tp_composites_cost_their_all_reduces(fn, all_reduces):
    # The composites' cost in the machine model is their ops' rows': each all-reduce of a
    # (rows,) or (rows, 1) float32 sends 2 x (TP-1)/TP of its bytes over the IPU-Links. The
    # layer norm's two all-reduces have all-reduces as gradients; the loss's gradient passes
    # its two identical-gradient all-reduces unchanged and its max is detached: 4 and 3.
    rows, h = 5, 8
    x = np.zeros((TP, rows, h // TP), np.float32)
    others = (
        [np.zeros((TP, h // TP), np.float32)] * 2 if fn is _ln else [np.zeros((TP, rows), np.int32)]
    )
    dy = np.zeros((TP, rows, h // TP) if fn is _ln else (TP, rows), np.float32)
    ir, _, _ = _tp_program(fn, x, others, dy)
    totals = popxl.Session(ir, "ipu_hw").report.totals()
    assert totals["ipu_link_bytes"] == all_reduces * 2 * (TP - 1) // TP * rows * 4
    assert totals["flops"] > 0
