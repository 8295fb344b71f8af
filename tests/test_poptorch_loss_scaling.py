"""``poptorch.optim``'s ``loss_scaling`` for every model, as PopTorch applies it: the loss is
multiplied by it before the backward and the gradients divided by it (in float32) in the
update. With a ``model.half()`` model the float16 backward is computed scaled, so gradients
that underflow to 0 in float16 survive; in float32 (and in float16 without underflow) a
power-of-two scale changes no bit, so the executor still matches the eager step exactly."""

import copy

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch

# each factor is float16's smallest normal number: the loss's gradient w.r.t. the linear
# layer's output is 2**-28, below float16's smallest subnormal (2**-24), so it is 0 unless
# the backward starts from the loss scale (1024 * 2**-28 = 2**-18, a float16 subnormal)
_TINY = 2.0**-14
_LR = 2.0**20  # large enough that the tiny true gradient moves the float16 weights


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1, bias=False)

    def forward(self, x):
        return poptorch.identity_loss(self.lin(x) * _TINY * _TINY, reduction="sum")


def _half_model_and_input():
    torch.manual_seed(0)
    model = _Tiny().half()
    with torch.no_grad():
        model.lin.weight.copy_(torch.tensor([[0.5, -0.75, 1.0, -1.25]]))
    x = torch.tensor([[1.0, 1.25, 1.5, 1.75]]).half()  # in [1, 2): 6 bits of the subnormal
    return model, x


def _train_once(loss_scaling: float, accumulation: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step on ``accumulation`` micro-batches of the same row (their mean gradient is
    the row's)."""
    model, x = _half_model_and_input()
    before = model.lin.weight.detach().clone()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(accumulation)
    opt = poptorch.optim.SGD(model.parameters(), lr=_LR, loss_scaling=loss_scaling)
    poptorch.trainingModel(model, opts, optimizer=opt)(x.repeat(accumulation, 1))
    return before, model.lin.weight.detach().clone()


@pytest.mark.parametrize("accumulation", [1, 2])
def test_half_model_gradients_underflow_without_loss_scaling(accumulation):
    before, after = _train_once(1.0, accumulation)
    assert torch.equal(after, before)  # float16 gradients of 0: nothing moves


@pytest.mark.parametrize("accumulation", [1, 2])
def test_loss_scaling_keeps_half_gradients_from_underflowing(accumulation):
    before, after = _train_once(1024.0, accumulation)
    assert after.dtype == torch.float16
    assert not torch.equal(after, before)
    # the rule in float64: w - lr * (S * g) / S with g = x * 2**-28 the true gradient
    _, x = _half_model_and_input()
    want = before.double() - _LR * x.double() * _TINY * _TINY
    # the scaled gradient is a float16 subnormal (spacing 2**-24: half of it, unscaled and
    # times lr, is lr * 2**-35) and the new weight is rounded once to float16 (half an ulp)
    tol = _LR * 2.0**-35 + want.abs() * 2.0**-11
    assert ((after.double() - want).abs() <= tol).all()


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x, y):
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, nn.functional.cross_entropy(out, y)


@pytest.mark.parametrize("make", [poptorch.optim.SGD, poptorch.optim.AdamW])
def test_float32_model_with_loss_scaling_is_the_eager_step_bit_for_bit(make):
    torch.manual_seed(0)
    model = _Mlp()
    eager = copy.deepcopy(model)
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    ipu = poptorch.trainingModel(
        model, optimizer=make(model.parameters(), lr=0.05, loss_scaling=1024.0)
    )
    eager_opt = make(eager.parameters(), lr=0.05, loss_scaling=1024.0)
    for _ in range(3):
        _, loss = ipu(x, y)
        eager_opt.zero_grad()
        _, want = eager(x, y)
        want.backward()
        eager_opt.step()
        assert torch.equal(loss, want.detach())
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.equal(p, q)


def test_the_step_records_the_loss_scale_for_a_float32_program():
    model, x = _half_model_and_input()
    opts = popxl_fx.Options(device="cpu", loss_scaling=1024.0)
    trainer = popxl_fx.training_model(
        model, torch.optim.SGD(model.parameters(), lr=0.1), None, opts
    )
    trainer(x)
    assert "loss scaled by 1024, gradients unscaled in float32" in str(trainer.explain())


def test_a_half_loss_scale_must_fit_float16():
    model, x = _half_model_and_input()
    opt = poptorch.optim.SGD(model.parameters(), lr=0.1, loss_scaling=2.0**17)
    with pytest.raises(ValueError, match="larger than float16 can hold"):
        poptorch.trainingModel(model, optimizer=opt)(x)


def _phased_params(**options) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opts = popxl_fx.Options(device="cpu", **options)
    trainer = popxl_fx.training_model(model, opt, nn.functional.cross_entropy, opts)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        trainer(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g))
    return [p.detach().clone() for p in model.parameters()]


def test_a_phased_step_seeds_the_loss_scale_it_divides_back():
    want = _phased_params()  # the plain program, unscaled
    got = _phased_params(phased_execution="children", loss_scaling=1024.0)
    assert all(torch.equal(p, q) for p, q in zip(got, want))
