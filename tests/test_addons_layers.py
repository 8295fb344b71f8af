"""addons.layers against the equivalent torch modules: outputs and gradients, float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import addons
import popxl_core as popxl
from addons.layers import Conv2D, Embedding, GroupNorm, LayerNorm, Linear, WeightsDict
from addons.ops import host_store

RTOL, ATOL = 1e-5, 1e-6


def _randn(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random parameters everywhere (torch inits norms to ones/zeros, which hides bugs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return module


def _run(layer, x_data, torch_layer, mapping, grads=(), build_kwargs=None, seed=0):
    """Build ``layer`` with create_graph + init + bind + call (and its autodiff grad graph),
    load the torch parameters and run. Returns the output and the named gradients."""
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(x_data, name="x")
        facts, graph = layer.create_graph(x, **(build_kwargs or {}))
        names = {t: k for k, t in graph.args.to_dict().items()}
        names[graph.graph.inputs[0]] = "x"
        by_name = {k: t for t, k in names.items()}
        dgraph = (
            addons.autodiff(graph, grads_required=[by_name[g] for g in grads]) if grads else None
        )
        variables = facts.init()
        info = graph.bind(variables).call_with_info(x)
        y = info.outputs[0]
        streams = {"y": host_store(y)}
        if dgraph is not None:
            dy_data = _randn(*y.shape, seed=seed + 100)
            dy = popxl.variable(dy_data, name="dy")
            outs = dgraph.call(dy, args=dgraph.grad_graph_info.inputs_dict(info))
            for conn, g in zip(dgraph.grad_graph_info.expected_outputs, outs):
                streams[names[conn.fwd_tensor]] = host_store(g)
    session = popxl.Session(ir, "ipu_hw")
    weights = mapping(variables, torch_layer)
    assert isinstance(weights, WeightsDict)
    session.write_variables_data(weights)
    with session:
        out = session.run()
    result = {k: out[s] for k, s in streams.items()}
    return result, (dy_data if dgraph is not None else None)


def _torch_grads(torch_layer, x_data, dy, params):
    x = torch.from_numpy(x_data).requires_grad_()
    y = torch_layer(x)
    wrt = [x] + [getattr(torch_layer, p) for p in params]
    grads = torch.autograd.grad(y, wrt, torch.from_numpy(dy))
    return y.detach().numpy(), [g.numpy() for g in grads]


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias):
    x = _randn(4, 6, seed=1)
    tl = _randomise(torch.nn.Linear(6, 3, bias=bias), seed=2)
    grads = ["x", "weight", "bias"] if bias else ["x", "weight"]
    out, dy = _run(Linear(3, bias=bias), x, tl, Linear.torch_mapping, grads)
    ref_y, ref_grads = _torch_grads(tl, x, dy, grads[1:])
    _close(out["y"], ref_y)
    _close(out["x"], ref_grads[0])
    _close(out["weight"], ref_grads[1].T)  # popxl weight is (in, out)
    if bias:
        _close(out["bias"], ref_grads[2])


def test_linear_three_d_input_and_default_init():
    np.random.seed(0)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, graph = Linear(5).create_graph(popxl.TensorSpec((2, 3, 4), popxl.float32))
        variables = facts.init()
    assert sorted(facts.keys_flat()) == ["bias", "weight"]
    w, b = variables.weight._data, variables.bias._data
    assert w.shape == (4, 5) and b.shape == (5,) and not b.any()
    assert 0.005 < w.std() < 0.05  # N(0, 0.02)
    assert graph.graph.outputs[0].shape == (2, 3, 5)


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
def test_layer_norm_matches_torch(shape):
    x = _randn(*shape, seed=3)
    tl = _randomise(torch.nn.LayerNorm(8, eps=1e-5), seed=4)
    grads = ["x", "weight", "bias"]
    out, dy = _run(LayerNorm(), x, tl, LayerNorm.torch_mapping, grads)
    ref_y, ref_grads = _torch_grads(tl, x, dy, grads[1:])
    assert out["y"].shape == shape
    for name, ref in zip(["y", *grads], [ref_y, *ref_grads]):
        np.testing.assert_allclose(out[name], ref, rtol=RTOL, atol=1e-5, err_msg=name)


def test_layer_norm_eps_is_a_build_argument():
    x = _randn(4, 6, seed=5) * 1e-3  # variance ~1e-6: eps matters
    tl = _randomise(torch.nn.LayerNorm(6, eps=1e-3), seed=6)
    out, _ = _run(LayerNorm(), x, tl, LayerNorm.torch_mapping, build_kwargs={"eps": 1e-3})
    _close(out["y"], tl(torch.from_numpy(x)).detach().numpy())


def test_group_norm_matches_torch():
    x = _randn(2, 6, 3, 4, seed=7)
    tl = _randomise(torch.nn.GroupNorm(3, 6, eps=1e-5), seed=8)
    grads = ["x", "weight", "bias"]
    out, dy = _run(GroupNorm(3), x, tl, GroupNorm.torch_mapping, grads)
    ref_y, ref_grads = _torch_grads(tl, x, dy, grads[1:])
    for name, ref in zip(["y", *grads], [ref_y, *ref_grads]):
        np.testing.assert_allclose(out[name], ref, rtol=RTOL, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("axis", [0, 1])
def test_embedding_matches_torch(axis):
    idx = np.array([[3, 0, 9], [3, 3, 1]], np.int32)  # repeats accumulate in the grad
    tl = _randomise(torch.nn.Embedding(10, 4), seed=9)
    layer = Embedding(popxl.float32, 10, 4, axis=axis)
    out, dy = _run(
        layer, idx, tl, lambda v, m: Embedding.torch_mapping(v, m, axis=axis), ["weight"]
    )
    ref = tl(torch.from_numpy(idx).long())
    (dw,) = torch.autograd.grad(
        ref, [tl.weight], torch.from_numpy(dy if axis == 0 else np.moveaxis(dy, 0, -1))
    )
    # popxl.addons rounds the table up to 16 rows; the padding rows get no gradient
    dw = np.pad(dw.numpy(), ((0, 6), (0, 0)))
    if axis == 0:
        _close(out["y"], ref.detach().numpy())
        _close(out["weight"], dw)
    else:  # gather on axis 1 of the (hidden, vocab) table: hidden first
        _close(out["y"], np.moveaxis(ref.detach().numpy(), -1, 0))
        _close(out["weight"], dw.T)


def test_embedding_rejects_float_indices():
    ir = popxl.Ir()
    with ir.main_graph, pytest.raises(TypeError, match="integers"):
        Embedding(popxl.float32, 10, 4).create_graph(popxl.TensorSpec((3,), popxl.float32))


@pytest.mark.parametrize(
    "cfg",
    [
        dict(kernel=3, stride=1, pad=0, dil=1, groups=1, bias=True),
        dict(kernel=(3, 2), stride=2, pad=1, dil=1, groups=2, bias=False),
        dict(kernel=3, stride=1, pad=2, dil=2, groups=1, bias=True),
    ],
)
def test_conv2d_matches_torch(cfg):
    x = _randn(2, 4, 7, 6, seed=10)
    tl = _randomise(
        torch.nn.Conv2d(
            4, 6, cfg["kernel"], cfg["stride"], cfg["pad"], cfg["dil"], cfg["groups"], cfg["bias"]
        ),
        seed=11,
    )
    pad = cfg["pad"]
    layer = Conv2D(
        6,
        cfg["kernel"],
        strides=(cfg["stride"],) * 2,
        paddings=(pad,) * 4,
        dilations=(cfg["dil"],) * 2,
        groups=cfg["groups"],
        bias=cfg["bias"],
    )
    grads = ["x", "weight", "bias"] if cfg["bias"] else ["x", "weight"]
    out, dy = _run(layer, x, tl, Conv2D.torch_mapping, grads)
    ref_y, ref_grads = _torch_grads(tl, x, dy, grads[1:])
    for name, ref in zip(["y", *grads], [ref_y, *ref_grads]):
        np.testing.assert_allclose(out[name], ref, rtol=RTOL, atol=1e-5, err_msg=name)


def test_layers_nest_as_submodules():
    class Block(addons.Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(6)
            self.ln = LayerNorm()

        def build(self, x):
            return self.ln(self.fc(x))

    x = _randn(3, 5, seed=12)
    fc = _randomise(torch.nn.Linear(5, 6), seed=13)
    ln = _randomise(torch.nn.LayerNorm(6), seed=14)

    def mapping(v, _):
        return WeightsDict({**Linear.torch_mapping(v.fc, fc), **LayerNorm.torch_mapping(v.ln, ln)})

    out, _ = _run(Block(), x, None, mapping)
    _close(out["y"], ln(fc(torch.from_numpy(x))).detach().numpy())


def test_weights_dict_checks_shape_and_dtype():
    ir = popxl.Ir()
    with ir.main_graph:
        v = popxl.variable(np.zeros((2, 3), np.float32), name="v")
    d = WeightsDict()
    with pytest.raises(ValueError, match="shape"):
        d[v] = np.zeros((3, 2), np.float32)
    with pytest.raises(TypeError, match="dtype"):
        d[v] = np.zeros((2, 3), np.float16)
    d[v] = np.ones((2, 3), np.float32)
    assert list(d) == [v]


def test_torch_mapping_casts_to_the_requested_dtype():
    tl = torch.nn.Linear(3, 2)
    ir = popxl.Ir()
    with ir.main_graph:
        facts, _ = Linear(2).create_graph(popxl.TensorSpec((1, 3), popxl.float16))
        variables = facts.init()
    weights = Linear.torch_mapping(variables, tl, popxl.float16)
    assert weights[variables.weight].dtype == np.float16
    np.testing.assert_array_equal(
        weights[variables.weight], tl.weight.detach().numpy().T.astype(np.float16)
    )
