"""`Options.enableSyntheticData(True)`: the executor runs on inputs it makes, not the host's."""

from __future__ import annotations

import copy

import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        out = self.fc(x)
        return out if labels is None else (out, self.loss(out, labels))


def test_inference_ignores_the_host_inputs_and_matches_eager_on_the_synthetic_ones():
    torch.manual_seed(0)
    model = _Net().eval()
    ipu = poptorch.inferenceModel(model, poptorch.Options().enableSyntheticData(True).randomSeed(7))
    first = ipu(torch.ones(4, 6))
    second = ipu(torch.full((4, 6), 3.0))
    drawn = torch.randn((4, 6), generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, second)
    assert torch.equal(first, model(drawn))


def test_training_uses_normal_floats_and_zero_labels():
    torch.manual_seed(0)
    model = _Net()
    eager = copy.deepcopy(model)
    opts = poptorch.Options().enableSyntheticData(True)
    ipu = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    _, loss = ipu(torch.zeros(4, 6), torch.full((4,), 2))
    drawn = torch.randn((4, 6), generator=torch.Generator().manual_seed(0))
    _, eager_loss = eager(drawn, torch.zeros(4, dtype=torch.long))
    assert torch.equal(loss, eager_loss.detach())
