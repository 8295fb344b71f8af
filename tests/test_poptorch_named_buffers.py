"""popxl_fx.poptorch: ``Options.updatableNamedBuffers`` must name buffers of the model;
PopTorch refuses to compile otherwise."""

from __future__ import annotations

import pytest
import torch

import popxl_fx.poptorch as poptorch


class _Buffered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        return x * self.scale


def _model(names):
    options = poptorch.Options()
    options.updatableNamedBuffers(names)
    return poptorch.inferenceModel(_Buffered(), options=options)


def test_an_unknown_buffer_name_refuses_to_compile():
    with pytest.raises(poptorch.poptorch_core.Error, match="no buffer named 'missing'"):
        _model(["missing"])(torch.ones(3))


def test_a_buffer_of_the_model_compiles():
    x = torch.arange(3.0)
    assert torch.equal(_model(["scale"])(x), _Buffered()(x))
