"""Modules with ``torch.nn.utils.parametrize`` (weight_norm and spectral_norm as
parametrizations, Wav2Vec2's positional convolution) and the legacy hook-based weight_norm:
traced through, the parametrization part of forward, the gradient reaching the original
parameters, the optimizer updating the originals; spectral_norm's power-iteration buffers
updated as eager updates them. 2 AdamW steps bit for bit with eager (tolerance 0)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations as P

from popxl_fx import Options, inference_model, training_model

CPU = Options(device="cpu")


class Net(nn.Module):
    def __init__(self, linear: nn.Module, conv: nn.Module) -> None:
        super().__init__()
        self.linear, self.conv = linear, conv

    def forward(self, x):  # x: (batch, length, 4)
        return self.conv(F.gelu(self.linear(x)).transpose(1, 2))


def _net(kind: str) -> Net:
    torch.manual_seed(0)
    linear, conv = nn.Linear(4, 6), nn.Conv1d(6, 3, 3, padding=1)
    if kind == "weight_norm":
        return Net(P.weight_norm(linear), P.weight_norm(conv, dim=2))  # dim 2: Wav2Vec2's
    if kind == "spectral_norm":
        return Net(P.spectral_norm(linear), P.spectral_norm(conv, n_power_iterations=2))
    if kind == "legacy_weight_norm":
        return Net(nn.utils.weight_norm(linear), nn.utils.weight_norm(conv, dim=2))
    raise ValueError(kind)


KINDS = ["weight_norm", "spectral_norm", "legacy_weight_norm"]
pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm. is deprecated:FutureWarning")
X = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(1))
Y = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(2))


def _loss(out, y):
    return ((out - y) ** 2).mean()


@pytest.mark.parametrize("kind", KINDS)
def test_two_adamw_steps_bit_for_bit(kind):
    model = _net(kind)
    eager = _net(kind)  # the same seed: the same weights (legacy weight_norm cannot deepcopy)
    trainer = training_model(model, torch.optim.AdamW(model.parameters(), lr=1e-2), _loss, CPU)
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    for _ in range(2):
        loss = trainer(X, Y)
        opt.zero_grad()
        ref = _loss(eager(X), Y)
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())
    state, ref_state = model.state_dict(), eager.state_dict()
    assert list(state) == list(ref_state)
    for name, value in state.items():  # originals and spectral_norm's _u/_v buffers
        assert torch.equal(value, ref_state[name]), name


@pytest.mark.parametrize("kind", KINDS)
def test_inference_bit_for_bit(kind):
    model = _net(kind).eval()
    assert torch.equal(inference_model(model, CPU)(X), model(X))
