"""PopTorch's executors on torch.nn layers where PopTorch's behaviour is not plain popxl_fx's,
compared with eager torch at tolerance 0."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch


class _FrozenPath(nn.Module):
    """An eval-mode dropout in a training model: the loss reaches no trainable parameter
    (``unused`` only gives the optimizer something to hold)."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5).eval()
        self.unused = nn.Parameter(torch.ones(3))
        self.loss = nn.L1Loss()

    def forward(self, x, target):
        out = self.drop(x) * 2.0
        return out, self.loss(out, target)


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)


def test_a_training_model_whose_loss_reaches_no_trainable_parameter_runs_as_poptorch():
    model = _FrozenPath()
    x, target = _data()
    want_out, want_loss = model(x, target)
    step = poptorch.trainingModel(model)
    for _ in range(2):
        out, loss = step(x, target)
        assert torch.equal(out, want_out) and torch.equal(loss, want_loss)
    assert torch.equal(model.unused, torch.ones(3))  # nothing to update


class _FrozenLoss(_FrozenPath):
    def forward(self, x, target):
        return super().forward(x, target)[1]


def test_popxl_fx_itself_still_refuses_a_loss_with_nothing_to_train():
    model = _FrozenLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = popxl_fx.training_model(model, opt, options=popxl_fx.Options(device="cpu"))
    with pytest.raises(RuntimeError, match="nothing to train"):
        trainer(*_data())


class _Interpolate(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x):
        return F.interpolate(x * 2.0, scale_factor=2, mode=self.mode)


@pytest.mark.parametrize(
    "model, shape",
    [
        (nn.Upsample(scale_factor=2, mode="linear"), (1, 2, 3)),
        (nn.Upsample(scale_factor=2, mode="trilinear"), (1, 2, 3, 4, 5)),
        (_Interpolate("trilinear"), (1, 2, 3, 4, 5)),
    ],
    ids=["Upsample-linear", "Upsample-trilinear", "interpolate-trilinear"],
)
def test_upsampling_poptorch_refuses_raises_its_error(model, shape):
    x = torch.randn(shape)
    with pytest.raises(poptorch.Error, match="only 'nearest' is supported"):
        poptorch.inferenceModel(model)(x)
    # popxl_fx itself computes it, as eager
    out = popxl_fx.inference_model(model, popxl_fx.Options(device="cpu"))(x)
    assert torch.equal(out, model(x))


@pytest.mark.parametrize("mode, shape", [("nearest", (1, 2, 3)), ("bilinear", (1, 2, 3, 4))])
def test_upsampling_poptorch_runs_matches_eager(mode, shape):
    model, x = _Interpolate(mode), torch.randn(shape)
    assert torch.equal(poptorch.inferenceModel(model)(x), model(x))
