"""A float16 convolution's partials type (popxl_core.ops._conv_partials): with one (the op's
``partials_types`` or the session's ``convolutionOptions``), the conv and its three gradient
ops compute in float32 and round to float16 once; without one, under ``Ir.numerics="torch"``,
torch's own float16 kernels run (eager's bits).

The shapes are ones where torch's float16 kernels and the float32 ones rounded once differ in
a few elements (a float32 sum in another order lands across a float16 rounding boundary), so
each bitwise comparison tells the two paths apart. Against a float64 reference, the float
path is within half a float16 ulp of the exact value plus the float32 summation bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import popxl_core as popxl
import popxl_fx
import popxl_fx.poptorch as poptorch
from popxl_core import ops, transforms

A = torch.ops.aten
# (x shape, w shape): dw differs in the first, dx in the second (torch 2.x CPU kernels)
SHAPES = [((1, 3, 12, 12), (4, 3, 3, 3)), ((4, 5, 20, 20), (8, 5, 5, 5))]


def _data(xs, ws):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=g).half() for s in (xs, ws, ws[:1]))
    n, co = xs[0], ws[0]
    dy = torch.randn((n, co, xs[2] - ws[2] + 1, xs[3] - ws[3] + 1), generator=g).half()
    return x, w, b, dy


def _forward(x, w, b):
    return A.convolution(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)


def _eager(x, w, b, dy):
    """torch's kernels on the given dtypes: y, dx, dw, db."""
    y = _forward(x, w, b)
    grads = A.convolution_backward(
        dy, x, w, [w.shape[0]], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, (True,) * 3
    )
    return (y, *grads)


def _simulated(x, w, b, dy, partials=None, session_partials=None):
    """y, dx, dw, db of ops.conv and its autodiff on the simulator (numerics "torch")."""

    def build(x, w, b):
        return ops.conv(x, w, partials_types=partials, bias=b)

    return _run(build, (x, w, b), dy, session_partials)


def _run(build, inputs, dy, session_partials=None):
    """``build``'s output and its gradients wrt ``inputs`` for the cotangent ``dy``."""
    ir = popxl.Ir()
    ir.numerics = "torch"
    if session_partials is not None:
        ir._pb_ir.getSessionOptions().convolutionOptions["partialsType"] = session_partials
    with ir.main_graph:
        vs = [popxl.variable(t.numpy(), popxl.float16) for t in inputs]
        graph = ir.create_graph(build, *vs)
        bwd = transforms.autodiff(graph)
        site = ops.call_with_info(graph, *vs)
        cot = popxl.constant(dy.numpy(), popxl.float16)
        grads = ops.call(bwd.graph, cot, inputs_dict=bwd.inputs_dict(site))
        streams = []
        for i, t in enumerate([site.outputs[0], *grads]):
            streams.append(popxl.d2h_stream(t.shape, t.dtype, f"o{i}"))
            ops.host_store(streams[-1], t)
    with popxl.Session(ir, "ipu_hw") as session:
        out = session.run()
    return [torch.from_numpy(np.asarray(out[s])) for s in streams]


@pytest.mark.parametrize("xs, ws", SHAPES)
def test_float_partials_compute_in_float32_and_round_once(xs, ws):
    data = _data(xs, ws)
    got = _simulated(*data, partials=["float"])
    want = [t.half() for t in _eager(*(t.float() for t in data))]
    assert all(torch.equal(g, e) for g, e in zip(got, want))
    # the shapes are chosen so that torch's float16 kernels give other bits somewhere
    assert not all(torch.equal(g, h) for g, h in zip(got, _eager(*data)))


@pytest.mark.parametrize("xs, ws", SHAPES)
def test_without_partials_torch_numerics_keep_eagers_float16_kernels(xs, ws):
    data = _data(xs, ws)
    got = _simulated(*data)
    assert all(torch.equal(g, e) for g, e in zip(got, _eager(*data)))


def test_session_convolution_options_set_the_partials():
    data = _data(*SHAPES[1])
    want = [t.half() for t in _eager(*(t.float() for t in data))]
    for got in (_simulated(*data, session_partials="float"), _simulated(*data, partials="half")):
        assert all(torch.equal(g, e) for g, e in zip(got, want))


def test_float_partials_are_within_half_an_ulp_of_exact():
    """|got - exact| <= half a float16 ulp (2**-11 relative, 2**-25 absolute below the normal
    range) plus the bound of a float32 sum of n terms (n * 2**-24 * sum |terms|)."""
    x, w, b, dy = _data(*SHAPES[1])
    got = _simulated(x, w, b, dy, partials=["float"])
    exact = _eager(*(t.double() for t in (x, w, b, dy)))
    magnitude = _eager(*(t.double().abs() for t in (x, w, b, dy)))
    terms = [w[0].numel(), w.shape[0] * 25, x.shape[0] * 16 * 16, x.shape[0] * 16 * 16]
    for g, e, m, n in zip(got, exact, magnitude, terms):
        bound = 2.0**-11 * e.abs() + 2.0**-25 + n * 2.0**-24 * m
        assert ((g.double() - e).abs() <= bound).all()


def test_popxl_fx_option_reaches_the_convs():
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(5, 8, 5).half()
    x = _data(*SHAPES[1])[0]
    with pytest.raises(ValueError, match="partials_type"):
        popxl_fx.Options(partials_type="double")
    out = popxl_fx.inference_model(layer, popxl_fx.Options(partials_type="float"))(x)
    w, b = layer.weight.detach(), layer.bias.detach()
    assert torch.equal(out, _forward(x.float(), w.float(), b.float()).half())


class _ConvLoss(torch.nn.Module):
    """A conv of a zero parameter whose loss is ``sum(conv(p, w) * dy)``: one SGD step with
    lr 1 leaves ``-dx`` in the parameter, exactly."""

    def __init__(self, xs, w, dy):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(xs))
        self.register_buffer("w", w)
        self.register_buffer("dy", dy)

    def forward(self, one):
        y = torch.nn.functional.conv2d(self.p * one, self.w)
        return poptorch.identity_loss(y * self.dy, reduction="sum")


@pytest.mark.parametrize("partials", [None, torch.float, torch.half])
def test_poptorch_partials_default_to_float(partials):
    """PopTorch's convolutions use float partials unless told otherwise (Poplar's default);
    half partials also sum in float32 here."""
    xs, ws = SHAPES[1]
    x, w, _, dy = _data(xs, ws)
    model = _ConvLoss(xs, w, dy).half()
    opts = poptorch.Options()
    if partials is not None:
        opts.Precision.setPartialsType(partials)
    step = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=1.0))
    step(torch.ones(1, dtype=torch.float16))
    dx = _eager(*(t.float() for t in (x, w, torch.zeros(ws[0]), dy)))[1]
    assert torch.equal(-model.p.detach(), dx.half())


def test_conv_transpose_takes_the_session_partials():
    """A transposed conv (its gradients are Conv and ConvWeightsGrad ops) too."""
    x, w, _, _ = _data((2, 16, 20, 20), (16, 8, 3, 3))
    dy = torch.randn((2, 8, 22, 22), generator=torch.Generator().manual_seed(1)).half()

    def eager(x, w, dy):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = torch.nn.functional.conv_transpose2d(x, w)
        return [y.detach(), *torch.autograd.grad(y, (x, w), dy)]

    got = _run(lambda x, w: ops.conv_transpose(x, w), (x, w), dy, session_partials="float")
    want = [t.half() for t in eager(x.float(), w.float(), dy.float())]
    assert all(torch.equal(g, e) for g, e in zip(got, want))
    assert not torch.equal(torch.nn.functional.conv_transpose2d(x, w), want[0])  # can fail


def test_float_partials_are_closer_to_exact_than_half_sums():
    """Against float64, the float path's error is smaller than that of sums kept in float16
    (what half partials would accumulate), over 256 channels of a 1x1 conv."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.rand(2, 256, 4, 4, generator=g).half(), torch.rand(8, 256, 1, 1, generator=g)
    w, b = w.half(), torch.zeros(8).half()
    dy = torch.zeros(2, 8, 4, 4).half()
    got = _simulated(x, w, b, dy, partials=["float"])[0].double()
    exact = _forward(x.double(), w.double(), None)
    running = torch.zeros(2, 8, 4, 4, dtype=torch.float16)
    for c in range(256):
        running = running + _forward(x[:, c : c + 1], w[:, c : c + 1], None)
    float_err, half_err = ((t - exact).abs().mean() for t in (got, running.double()))
    assert float_err <= 2.0**-11 * exact.abs().mean()  # within half an ulp on average
    assert float_err < half_err / 4


def test_ir_conv_partials_type_is_popxls_session_option():
    ir = popxl.Ir()
    ir.conv_partials_type = "float"
    assert ir._pb_ir.getSessionOptions().convolutionOptions["partialsType"] == "float"
    ir._pb_ir.getSessionOptions().convolutionOptions["partialsType"] = "half"
    assert ir.conv_partials_type == "half"
    with pytest.raises(ValueError, match="conv_partials_type"):
        ir.conv_partials_type = "fp32"
