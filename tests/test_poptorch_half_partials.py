"""popxl_fx.poptorch: half convolutions and matmuls accumulate in float32 and round once, as
the IPU's default float partials (PopTorch's ``Precision.setPartialsType``) do."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx.poptorch as poptorch


def _float_partials(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer on its half values, computed in float32 and rounded to half once."""
    return copy.deepcopy(layer).float()(x.float()).half()


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: nn.Conv1d(2, 3, 3, 2, 1, padding_mode="reflect"), (2, 2, 4)),
        (lambda: nn.Conv2d(3, 4, 3, padding=1), (2, 3, 8, 8)),
        (lambda: nn.Linear(64, 32), (8, 64)),
    ],
)
def test_half_layers_round_float32_partials_once(make, shape):
    torch.manual_seed(0)
    layer = make().half()
    ipu = poptorch.inferenceModel(layer)
    for _ in range(3):
        x = torch.rand(shape).half()
        out = ipu(x)
        assert out.dtype == torch.float16
        assert torch.equal(out, _float_partials(layer, x))


def test_half_partials_are_not_half_sums():
    """What float16 partials would give differs (a check that the comparison can fail)."""
    torch.manual_seed(1)
    x, w = torch.rand(1, 64, 16).half(), torch.rand(8, 64, 1).half()
    running = torch.zeros(1, 8, 16, dtype=torch.float16)
    for c in range(64):
        running = running + F.conv1d(x[:, c : c + 1], w[:, c : c + 1])
    layer = nn.Conv1d(64, 8, 1, bias=False).half()
    layer.weight.data = w
    assert not torch.equal(poptorch.inferenceModel(layer)(x), running)
