"""popxl_fx.poptorch's conv, norm and half-precision behaviours, each against eager torch or
PopTorch's documented rule (its tests' expectations)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Convs(nn.Module):
    def __init__(self, nested: bool = False, convs: bool = True) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 2, 3), nn.Conv2d(1, 2, 3)
        self.nested, self.convs = nested, convs

    def forward(self, x):
        with poptorch.MultiConv().partialsTypes(torch.float):
            if self.nested:
                with poptorch.MultiConv():
                    return self.a(x)
            if not self.convs:
                return x * 2
            return self.a(x) - self.b(torch.abs(x))


def test_multiconv_computes_the_convolutions():
    torch.manual_seed(0)
    model, x = _Convs(), torch.randn(2, 1, 8, 8)
    assert torch.equal(poptorch.inferenceModel(model)(x), model(x))


@pytest.mark.parametrize(
    ("nested", "convs", "match"),
    [(True, True, "Nested poptorch.MultiConv"), (False, False, "Unexpected end_multi_conv")],
)
def test_multiconv_misuse_raises_poptorchs_errors(nested, convs, match):
    model = _Convs(nested, convs)
    with pytest.raises(poptorch.Error, match=match):
        poptorch.inferenceModel(model)(torch.ones(2, 1, 8, 8))
    model(torch.ones(2, 1, 8, 8))  # eager torch runs the scope as PopTorch's CPU ops do


def test_multiconv_setters_validate():
    mc = poptorch.MultiConv()
    with pytest.raises(ValueError, match="Invalid partials types"):
        mc.partialsTypes("half")
    with pytest.raises(AssertionError, match="Invalid plan type"):
        mc.planType("parallel")
    with pytest.raises(AssertionError, match="available memory proportion"):
        mc.availableMemoryProportions([])
    assert mc.availableMemoryProportions((0.5, 0.6)).planType(poptorch.MultiConvPlanType.Serial)


def test_distribution_argument_checks_are_off_while_tracing():
    """PopTorch turns torch.distributions' value checks off while it traces (they branch on
    tensor values); the sample's dtype is eager's."""

    class Sample(nn.Module):
        def forward(self, low):
            return torch.distributions.Uniform(low, torch.tensor([10.0])).sample((4, 3))

    low = torch.tensor([1.0], dtype=torch.float16)
    out = poptorch.inferenceModel(Sample())(low)
    assert out.dtype == Sample()(low).dtype and out.shape == (4, 3, 1)
    assert torch.distributions.Distribution._validate_args  # restored after the trace
