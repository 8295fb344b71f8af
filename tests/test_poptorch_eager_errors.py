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
