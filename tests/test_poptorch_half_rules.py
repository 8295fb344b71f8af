"""PopTorch's half-precision rules seen through its API: a half distribution samples half."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Normal(nn.Module):
    """A scalar beside a traced tensor: torch.distributions gives it the tensor's dtype."""

    def forward(self, x):
        return (
            torch.distributions.Normal(x, 10.0).sample((4, 5)),
            torch.distributions.Normal(0.0, x.abs() + 1).sample((3,)),
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_distribution_scalar_takes_the_traced_tensors_dtype(dtype):
    x = torch.tensor([0.5], dtype=dtype)
    got = poptorch.inferenceModel(_Normal())(x)
    want = _Normal()(x)
    assert [t.dtype for t in got] == [t.dtype for t in want] == [dtype, dtype]
    assert [t.shape for t in got] == [t.shape for t in want]
