"""PopTorch's executors on torch.nn layers where PopTorch's behaviour is not plain popxl_fx's,
compared with eager torch at tolerance 0."""

from __future__ import annotations

import pytest
import torch
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
