"""Phase choices that cannot work raise when the program is built, naming the fix.

The phase-list errors of tests/test_fx_phased.py (a name that is no submodule, a phase inside
another) and memory="auto"'s contradictions (tests/test_fx_memory_auto.py) are not repeated:
here a container that forward never calls as a whole, a module called twice, a python value
crossing between phases, and a phase whose parameters and optimizer state alone exceed an IPU
(with the finer split and RTS named as the fixes).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx.phases import PhaseError


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.body(self.body(x)))


class _WithCount(nn.Module):
    def forward(self, x):
        return x, x.shape[0]


class _PassesInt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.count, self.head = _WithCount(), nn.Linear(8, 4)

    def forward(self, x):
        y, n = self.count(x)
        return self.head(y) / n


def _step(model, phases, device="cpu", opt=None, batch=4):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    options = popxl_fx.Options(device=device, phased_execution=phases)
    trainer = popxl_fx.training_model(model, opt, F.cross_entropy, options)
    width = next(model.parameters()).shape[1]
    return trainer(torch.randn(batch, width), torch.randint(0, 4, (batch,)))


@pytest.mark.parametrize(
    "model, phases, message",
    [
        (_Stack(), ("layers", "head"), r"'layers' is never called by forward as a whole"),
        (_Twice(), ("body", "head"), r"'body' is called twice by forward"),
        (_PassesInt(), ("count", "head"), r"only tensors can pass between phases"),
    ],
)
def test_phases_that_cannot_be_split_out_raise_with_the_fix(model, phases, message):
    with pytest.raises(PhaseError, match=message):
        _step(model, phases)


def test_a_phase_too_big_for_an_ipu_by_its_variables_alone_names_it_and_the_fixes():
    # two 6400 x 6400 layers in one phase: 328 MB of weights, 984 MB with Adam's two moments
    big = nn.Sequential(
        nn.utils.skip_init(nn.Linear, 6400, 6400), nn.utils.skip_init(nn.Linear, 6400, 6400)
    )
    with torch.no_grad():
        for p in big.parameters():
            p.zero_()
    model = nn.Sequential(big, nn.Linear(6400, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with pytest.raises(PhaseError) as err:
        _step(model, "children", device="ipu_hw", opt=opt, batch=2)
    text = str(err.value)
    assert "phase '0' holds 312.55 MiB of trainable parameters and 625.10 MiB of optimizer" in text
    assert "more than one IPU (897 MiB)" in text
    assert "phased_execution=['0.0', '0.1'] (its parts)" in text
    assert "replicated_tensor_sharding=True" in text
