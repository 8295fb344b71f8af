"""Call arguments handed over to graphs called once (popxl_core/sim/handoff.py): the called
graph frees each argument after its last reader. Only the time of each free changes: a
training step gives bit-identical losses and weights with and without it."""

from __future__ import annotations

import copy

import torch
from torch import nn

import popxl_fx
from popxl_core.sim import CompileOptions


def _trainer(model, compiler):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    options = popxl_fx.Options(device="cpu", compiler=compiler)
    return popxl_fx.training_model(model, opt, nn.CrossEntropyLoss(), options)


def test_backward_graph_takes_its_arguments_as_a_list_and_frees_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    plain = copy.deepcopy(model)
    handed = _trainer(model, CompileOptions())
    kept = _trainer(plain, CompileOptions(handoff=False))
    for _ in range(3):
        assert torch.equal(handed(x, y), kept(x, y))
    for a, b in zip(model.parameters(), plain.parameters()):
        assert torch.equal(a, b)
    sources = [g.source for g in handed.session._program.graphs.values()]
    assert sources and all("_H.clear()" in s for s in sources)  # forward and backward
    assert "_H = [" in handed.session._program.main.source
    assert not any("_H" in g.source for g in kept.session._program.graphs.values())
