"""Custom ``torch.autograd.Function`` s keep their own backward (found with BLOOM, whose GeLU
in training is one with a hand-written backward): the call is one node running ``Fn.apply``,
and the gradient is autograd's through it, ``Fn.backward``. Bit for bit with eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from popxl_fx import Options, check, training_model

from .fx_cases import randn
from .fx_harness import check_lowering

CPU = Options(device="cpu")


class GradReverse(torch.autograd.Function):
    """Identity forward, the gradient negated and scaled (domain-adversarial training)."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.scale * g, None


class TanhGelu(torch.autograd.Function):
    """BLOOM's GeLU: tanh-gelu with a hand-written derivative."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        d = 0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t)
        return d * g


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(GradReverse.apply(TanhGelu.apply(self.a(x)), 0.5))


class One(nn.Module):
    def __init__(self, function: type, *extra) -> None:
        super().__init__()
        self.function, self.extra = function, extra

    def forward(self, x):
        return self.function.apply(x, *self.extra)  # looked up at the call, as users write it


@pytest.mark.parametrize("module", [One(TanhGelu), One(GradReverse, 2.0)], ids=["gelu", "rev"])
def test_lowering_keeps_the_functions_backward(module):
    check_lowering(module, randn(3, 5), rtol=0, atol=0)


def test_trains_like_eager():
    assert check(Net(), randn(2, 4)).ok
    model, reference = Net(), Net()
    loss_fn = lambda out, y: ((out - y) ** 2).mean()
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, CPU)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = randn(6, 4, seed=1), randn(6, 3, seed=2)
    for _ in range(2):
        loss = trainer(x, y)
        opt.zero_grad()
        ref = loss_fn(reference(x), y)
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)
