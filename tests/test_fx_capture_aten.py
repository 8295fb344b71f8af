"""Every ATen entry of the fallback, against torch: each case is a function the table lacks
(marked torch.fx.wrap), so it decomposes into ATen ops that lower one by one; forward and
gradients (random cotangent) are compared with eager."""

import pytest
import torch
from torch import nn

from popxl_fx.capture import capture
from popxl_fx.fallback import decompose
from popxl_fx.lowering import lookup

from .fx_capture_util import eager_grads, run_module

CASES = {
    # unary: rsqrt, abs, tanh, relu, log, sqrt, neg, exp, sigmoid
    "unary": lambda x, y: (
        torch.rsqrt(x.abs() + 1)
        + torch.tanh(x)
        + torch.relu(y)
        + torch.log(x * x + 1)
        + torch.sqrt(y * y + 1)
        - torch.exp(-x.abs()) * torch.sigmoid(y)
    ),
    # comparisons and where: lt, gt, ge, le, eq
    "compare": lambda x, y: (
        torch.where(x < y, x, y)
        + torch.where(x >= 0, y, 2 * x)
        + torch.where((x <= 0.5) & (y > -0.5), x * y, 1.0)
        + (x == y) * 3.0
    ),
    # boolean logic and tensor constants: bitwise_not, bitwise_or, lift_fresh_copy
    "logic": lambda x, y: (
        torch.where(~(x > 0) | (y > 0), x, y) * torch.tensor([1.0, -2.0, 3.0, 0.5])
    ),
    # matrix products: mm, addmm, bmm
    "matmul": lambda x, y: (
        torch.addmm(y, x, y.t()) @ x + torch.bmm(x.unsqueeze(0), y.t().unsqueeze(0))[0] @ y
    ),
    # reshapes and reductions: view, permute, clone, sum, mean, clamp, pow, div, sub
    "views": lambda x, y: (
        (x.reshape(2, 8).permute(1, 0).contiguous() / 3).pow(3).sum(0, True).mean(-1, True)
        - torch.clamp(y, -0.5, 0.5).reshape(2, 8).t().reshape(4, 4)
    ),
    # sum/mean with dtype= (the input is cast first) and sum of bools (counted as integers)
    "reduce_dtype": lambda x, y: (
        (x > 0).sum(1, keepdim=True, dtype=torch.float32) * y
        + torch.mean(y.half(), 0, dtype=torch.float32)
        + (y > 0).sum() * x
    ),
}


def aten_case(x, y, name):
    return CASES[name](x, y)


torch.fx.wrap("aten_case")


class Case(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.name = name
        self.fc = nn.Linear(4, 4)

    def forward(self, x, y):
        return aten_case(self.fc(x), y, self.name)


class Smoother(nn.Module):
    """Stands for a standard torch.nn leaf without a lowering that updates its buffers."""

    __module__ = "torch.nn.modules.fake"

    def __init__(self):
        super().__init__()
        self.register_buffer("avg", torch.zeros(4))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.count.add_(1)
        self.avg.mul_(0.5).add_(x.mean(0) * 0.5)
        return x - self.avg


class WithSmoother(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.smooth = Smoother()

    def forward(self, x):
        return self.smooth(self.fc(x))


def test_buffer_updates_inside_a_decomposed_module_reach_its_buffers():
    torch.manual_seed(0)
    model, x = WithSmoother(), torch.randn(3, 4)
    ours = run_module(model, x)
    assert set(ours["variables"]) >= {"smooth.avg", "smooth.count"}
    ref = model(x)  # eager updates the torch buffers the same way
    torch.testing.assert_close(ours["out"][0], ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        ours["variables"]["smooth.avg"], model.smooth.avg, rtol=1e-6, atol=1e-6
    )
    assert int(ours["variables"]["smooth.count"]) == int(model.smooth.count) == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_aten_entries_match_eager_forward_and_gradients(name):
    torch.manual_seed(0)
    model = Case(name)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    gm = capture(model, [x, y]).gm
    node = next(n for n in gm.graph.nodes if n.target is aten_case)
    targets = decompose(node, model).aten_targets()
    assert targets and all(lookup(t) is not None for t in targets), targets
    out = model(x, y)
    dy = torch.randn_like(out)
    ours, ref = run_module(model, x, y, dy=dy), eager_grads(model, [x, y], dy)
    # same kernels, but decompositions may regroup a sum or a pow: 2e-6 of float32 rounding
    torch.testing.assert_close(ours["out"][0], ref["out"], rtol=2e-6, atol=2e-6)
    for key, grad in ref["grads"].items():
        torch.testing.assert_close(ours["grads"][key], grad, rtol=2e-6, atol=2e-6, msg=key)
