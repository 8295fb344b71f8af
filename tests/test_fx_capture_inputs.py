"""training_model and compile trace the model on the user's own first inputs (as
inference_model does), not on made-up ones: shape propagation then sees the real values
(valid indices, the branches real data takes)."""

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.module as fx_module


@pytest.fixture
def traced(monkeypatch):
    """Every example input tuple popxl_fx's capture is called with."""
    calls = []
    real = fx_module.capture

    def recording(model, examples, *binding):
        calls.append(tuple(examples))
        return real(model, examples, *binding)

    monkeypatch.setattr(fx_module, "capture", recording)
    return calls


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_training_model_traces_the_real_inputs(traced):
    x, y = torch.randn(5, 4) * 7 + 3, torch.tensor([1, 0, 1, 1, 0])
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = popxl_fx.training_model(model, opt, nn.CrossEntropyLoss(), popxl_fx.Options("cpu"))
    trainer(x, y)
    assert len(traced) == 1
    assert torch.equal(traced[0][0], x) and torch.equal(traced[0][1], y)


def test_compile_traces_the_real_inputs_forward_and_backward(traced):
    x = torch.randn(5, 4) * 7 + 3
    model = popxl_fx.compile(_net(), popxl_fx.Options("cpu"))
    model(x).sum().backward()
    assert len(traced) == 2  # the forward program and the backward program
    assert all(torch.equal(examples[0], x) for examples in traced)
