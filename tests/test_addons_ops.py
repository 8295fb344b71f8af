"""addons.ops: cross entropy (with and without its fused gradient) and the host IO helpers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import addons
import popxl_core as popxl
from addons.ops import cross_entropy, cross_entropy_with_grad, host_load, host_store

N, C = 6, 5


def _logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, (N, C)).astype(np.float32)


def _labels(seed: int, ignore: int | None = None) -> np.ndarray:
    labels = np.random.default_rng(seed).integers(0, C, N).astype(np.int32)
    if ignore is not None:
        labels[[1, 4]] = ignore
    return labels


def _torch_ce(x, labels, reduction, ignore_index, cotangent):
    xt = torch.from_numpy(x).requires_grad_()
    loss = F.cross_entropy(
        xt,
        torch.from_numpy(labels).long(),
        reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index,
    )
    (dx,) = torch.autograd.grad(loss, xt, torch.as_tensor(cotangent).expand_as(loss))
    return loss.detach().numpy(), dx.numpy()


def _run(build):
    """Run ``build()`` (returning tensors) in a main graph; return their host values."""
    ir = popxl.Ir()
    with ir.main_graph:
        streams = [host_store(t) for t in build()]
    session = popxl.Session(ir, "ipu_hw")
    with session:
        out = session.run()
    return [out[s] for s in streams]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, 2])
def test_cross_entropy_with_grad_matches_torch(reduction, ignore_index):
    x, labels = _logits(0), _labels(1, ignore_index)
    scale = 4.0

    def build():
        xt = popxl.variable(x, name="x")
        lt = popxl.variable(labels, name="labels")
        return cross_entropy_with_grad(xt, lt, scale, ignore_index, reduction)

    loss, dx = _run(build)
    # dx is the gradient of loss_scaling * sum(loss) (or of the scaled mean): cotangent = scale
    ref_loss, ref_dx = _torch_ce(x, labels, reduction, ignore_index, scale)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)  # the loss is not scaled
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-6)


def test_cross_entropy_with_grad_takes_a_tensor_loss_scaling():
    x, labels = _logits(2), _labels(3)

    def build():
        scale = popxl.variable(np.float32(0.25), name="scale")
        return cross_entropy_with_grad(popxl.variable(x), popxl.variable(labels), scale)

    loss, dx = _run(build)
    ref_loss, ref_dx = _torch_ce(x, labels, "mean", None, 0.25)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction,ignore_index", [("mean", None), ("sum", 3), ("none", 0)])
def test_cross_entropy_and_its_autodiff_match_torch(reduction, ignore_index):
    x, labels = _logits(4), _labels(5, ignore_index)
    cot = np.random.default_rng(6).standard_normal(N if reduction == "none" else ())
    cot = cot.astype(np.float32)

    class Loss(addons.Module):
        def build(self, x, labels):
            return cross_entropy(x, labels, ignore_index=ignore_index, reduction=reduction)

    def build():
        xt, lt = popxl.variable(x, name="x"), popxl.variable(labels, name="labels")
        _, graph = Loss().create_graph(xt, lt)
        grad = addons.autodiff(graph, grads_required=[graph.graph.inputs[0]])
        info = graph.call_with_info(xt, lt)
        (dx,) = grad.call(
            popxl.variable(cot, name="dy"), args=grad.grad_graph_info.inputs_dict(info)
        )
        return info.outputs[0], dx

    loss, dx = _run(build)
    ref_loss, ref_dx = _torch_ce(x, labels, reduction, ignore_index, cot)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-5, atol=1e-6)


def test_cross_entropy_is_stable_for_large_logits():
    x = np.array([[200.0, 0.0, -200.0]], np.float32)
    labels = np.array([2], np.int32)
    (loss,) = _run(lambda: [cross_entropy(popxl.variable(x), popxl.variable(labels))])
    assert np.isfinite(loss) and abs(float(loss) - 400.0) < 1e-3


def test_host_load_and_store_round_trip_with_stream_names():
    data64 = np.arange(6, dtype=np.float64).reshape(2, 3)
    ir = popxl.Ir()
    with ir.main_graph:
        data, h2d, x = host_load(data64, name="x")
        idata, ih2d, i = host_load([1, 2, 3], popxl.int32, name="idx")
        d2h = host_store(x * 2)
        d2h_i = host_store(i)
        anon = host_load(np.zeros(2, np.float16))
    assert data.dtype == np.float32 and idata.dtype == np.int32  # 64-bit data is downcast
    assert h2d.tensor_id == "x_stream" and ih2d.tensor_id == "idx_stream"
    assert h2d.dtype is popxl.float32 and h2d.shape == (2, 3)
    assert d2h.tensor_id == "mul_out_stream"
    assert d2h_i.tensor_id == f"{i.name}_stream"
    assert anon[1].dtype is popxl.float16
    session = popxl.Session(ir, "ipu_hw")
    with session:
        out = session.run({h2d: data, ih2d: idata, anon[1]: anon[0]})
    np.testing.assert_array_equal(out[d2h], data64 * 2)
    np.testing.assert_array_equal(out[d2h_i], [1, 2, 3])


def test_host_store_names_the_stream_after_the_tensor():
    ir = popxl.Ir()
    with ir.main_graph:
        t = popxl.variable(np.zeros(3, np.float32), name="activations")
        s = host_store(t)
    assert s.tensor_id == "activations_stream"
    assert s.shape == (3,) and s.dtype is popxl.float32
