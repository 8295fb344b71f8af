"""Math ops as PopTorch programs use them (PopTorch's math_ops_test): each through
`popxl_fx.poptorch.inferenceModel` (and `trainingModel` where it has a gradient), compared
with eager torch at tolerance 0."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class Trained(nn.Module):
    """A linear layer before the op, so that a training step has a weight to update."""

    def __init__(self, fn, n: int) -> None:
        super().__init__()
        self.fn = fn
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        y = self.fn(self.lin(x))
        return y, poptorch.identity_loss(y**2, reduction="sum")


def _infer(fn, *xs):
    out = poptorch.inferenceModel(Fn(fn))(*xs)
    want = fn(*xs)
    for got, exp in zip(_leaves(out), _leaves(want)):
        assert got.dtype == exp.dtype and torch.equal(got, exp), (got, exp)


def _leaves(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _train(fn, n: int = 6):
    torch.manual_seed(0)
    model = Trained(fn, n)
    eager = copy.deepcopy(model)
    x = torch.randn(2, n)
    ipu = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    out, loss = ipu(x)
    opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    want, want_loss = eager(x)
    want_loss.backward()
    opt.step()
    assert torch.equal(out, want.detach()) and torch.equal(loss, want_loss.detach())
    assert torch.equal(model.lin.weight, eager.lin.weight)


X = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(3))
INTS = torch.randint(-100, 100, (50,), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize(
    "fn",
    [
        torch.erfc,
        torch.median,
        lambda x: torch.median(x, 1),
        lambda x: torch.median(x, -1, keepdim=True),
        lambda x: x.clamp(min=0.5, max=-0.5),  # min > max: max everywhere
        lambda x: torch.amax(x).unsqueeze(axis=-1),  # numpy's keyword for dim
        lambda x: x.sum(axis=1, keepdims=True),
    ],
)
def test_math_inference(fn):
    _infer(fn, X)


@pytest.mark.parametrize("args", [dict(min=-4.5, max=5.5), dict(min=-4.5), dict(max=5)])
def test_clamp_of_integers_with_float_bounds_is_float(args):
    _infer(lambda x: torch.clamp(x, **args), INTS)


@pytest.mark.parametrize(
    "fn",
    [
        torch.erfc,
        lambda x: torch.median(x, 1).values,
        lambda x: torch.clamp_min_(x, 0.1),
        lambda x: torch.clamp_max_(x, torch.tensor(0.1)),
        lambda x: x.clamp_min_(0.1) * 2,
        lambda x: x.clamp(0.4, 0.1),
    ],
)
def test_math_training(fn):
    _train(fn)


def test_inplace_torch_function_updates_its_tensor():
    """torch.clamp_min_(x, v) changes x: a later use of x sees the clamped values."""
    _infer(lambda x: (torch.clamp_min_(x * 1, 0.2), (x * 1).clamp_max_(0.1) + x), X)

    def fn(x):
        y = x * 1
        torch.clamp_min_(y, 0.2)
        return y + 1

    _infer(fn, X)


def test_bincount_has_minlength_bins():
    x = torch.randint(0, 8, (7,), generator=torch.Generator().manual_seed(5))
    weights = torch.linspace(0, 1, 7)
    _infer(lambda v: torch.bincount(v, minlength=8), x)
    _infer(lambda v, w: torch.bincount(v, w, minlength=8), x, weights)
    # PopTorch's bins are exactly minlength: larger values are dropped
    out = poptorch.inferenceModel(Fn(lambda v: torch.bincount(v, minlength=4)))(x)
    assert torch.equal(out, torch.bincount(x[x < 4], minlength=4))


def test_bincount_without_minlength_raises_poptorchs_error():
    x = torch.randint(0, 8, (7,))
    with pytest.raises(poptorch.Error, match="Bincount `minlength` must be specified"):
        poptorch.inferenceModel(Fn(torch.bincount))(x)
