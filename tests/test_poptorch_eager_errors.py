"""An error of the model's own code comes out of a PopTorch executor as eager torch raised
it (PopTorch runs the ops as torch does), and no dispatcher is left active."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class BadScatter(nn.Module):
    def forward(self, x, idx, src):
        return x.scatter(0, idx, src, "add")  # reduce must be a keyword: torch raises


def _eager_error(model, *xs) -> Exception:
    with pytest.raises(Exception) as eager:
        model(*xs)
    return eager.value


def test_an_error_of_the_model_is_raised_as_eager_raises_it():
    xs = torch.randn(3, 3), torch.zeros(3, 3, dtype=torch.long), torch.randn(3, 3)
    expected = _eager_error(BadScatter(), *xs)
    with pytest.raises(type(expected)) as ours:
        poptorch.inferenceModel(BadScatter())(*xs)
    assert str(ours.value) == str(expected)
    assert not getattr(ours.value, "__notes__", [])  # nothing but torch's message
    assert not poptorch.poptorch_core.isCompilingWithDispatcher()


class Split(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        parts = torch.split(self.lin(x), 20)  # one part: a 1-tuple
        return parts, poptorch.identity_loss(parts[0] ** 2, reduction="sum")


def test_a_one_part_split_comes_back_as_a_one_tuple():
    torch.manual_seed(0)
    model, x = Split(), torch.randn(20, 4)
    expected, _ = model(x)
    out, _ = poptorch.inferenceModel(model)(x)
    assert isinstance(out, tuple) and len(out) == 1 and torch.equal(out[0], expected[0].detach())


class Squeezed(nn.Module):
    def forward(self, x):
        y = x * 2.0
        y.squeeze_()  # an in-place update that changes the shape
        return y, torch.arange(3) + 1


def test_shapes_changed_in_place_and_64_bit_outputs_as_poptorch_returns_them(capfd):
    x = torch.randn(1, 3, 1, 2, requires_grad=True)
    y, counts = poptorch.inferenceModel(Squeezed())(x)
    assert torch.equal(y, (x * 2.0).squeeze().detach())
    assert counts.dtype == torch.int32 and torch.equal(
        counts, torch.arange(3, dtype=torch.int32) + 1
    )
    assert "Input tensor has requires_grad=True set" in capfd.readouterr().err


class Masked(nn.Module):
    def forward(self, x, mask):
        return x[mask] * 2.0  # its length depends on the mask's values


def test_a_data_dependent_shape_raises_what_poptorchs_fake_trace_raises():
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    with pytest.raises(DynamicOutputShapeException):
        poptorch.inferenceModel(Masked())(torch.randn(4), torch.tensor([True, False] * 2))


class LossOfInputsOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)  # not used by the loss

    def forward(self, x):
        x = x.repeat(5, 2, 2)
        return x, poptorch.identity_loss(x**2, reduction="sum")


def test_a_training_model_whose_loss_reaches_no_parameter_runs_as_poptorch_runs_it():
    model, x = LossOfInputsOnly(), torch.randn(10, 1, 1)
    before = model.lin.weight.detach().clone()
    out, loss = poptorch.trainingModel(model)(x)
    expected, expected_loss = model(x)
    assert torch.equal(out, expected) and torch.equal(loss, expected_loss)
    assert torch.equal(model.lin.weight, before)
