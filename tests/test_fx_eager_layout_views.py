"""Activations and reductions of a strided view (a slice, a chunk, a transpose) bit for bit
with eager (tolerance 0), forward and backward.

ATen's vectorised elementwise loops run over the view's rows in memory order and compute the
elements past each row's last full vector with the scalar function, which for gelu, silu,
softplus, ... can round otherwise (gelu on a chunk: 1e-6 off; gradients up to 2e-5): the same
values give other bits in another layout. So an activation whose input is a strided view in
eager runs torch's kernel on eager's layout (GEGLU/SwiGLU's ``chunk``, Mamba's
``conv1d(x)[..., :seq_len]`` and gate). Reductions that lower to torch's own kernels (var,
norm, logsumexp) sum in the layout's order too: theirs also run on eager's layout.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx import Options
from popxl_fx.testing import assert_matches_eager

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "softplus": F.softplus,
    "GELU": nn.GELU(),
    "SiLU": nn.SiLU(),
}

VIEWS = {
    "slice": lambda h: h[..., :37],
    "chunk": lambda h: h.chunk(2, -1)[1],
    "transpose": lambda h: h.transpose(1, 2),
}


class OnView(nn.Module):
    def __init__(self, act, view) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 64)
        self.act, self.view = act, view

    def forward(self, x):
        return self.act(self.view(self.lin(x)))


def _x() -> torch.Tensor:
    return 3 * torch.randn(4, 24, 16, generator=torch.Generator().manual_seed(1))


def _grads(module: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    out = module(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)))
    return [out.detach(), x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activation_of_a_view(act, view):
    torch.manual_seed(0)
    module = OnView(ACTIVATIONS[act], VIEWS[view])
    eager = _grads(copy.deepcopy(module), _x())
    sim = _grads(popxl_fx.compile(copy.deepcopy(module), Options(device="cpu")), _x())
    for got, want in zip(sim, eager, strict=True):
        assert torch.equal(got, want), (got - want).abs().max()


REDUCTIONS = {
    "var": lambda t: t.var(-1),
    "norm": lambda t: t.norm(dim=-1),
    "logsumexp": lambda t: t.logsumexp(-1),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_of_a_transposed_view(name):
    """Their gradients were up to 4e-6 off on the simulator's contiguous copy."""
    torch.manual_seed(0)
    module = OnView(REDUCTIONS[name], VIEWS["transpose"])
    eager = _grads(copy.deepcopy(module), _x())
    sim = _grads(popxl_fx.compile(copy.deepcopy(module), Options(device="cpu")), _x())
    for got, want in zip(sim, eager, strict=True):
        assert torch.equal(got, want), (got - want).abs().max()


def test_activation_of_a_chunk_in_inference():
    torch.manual_seed(0)
    module = OnView(F.gelu, VIEWS["chunk"]).eval()
    with torch.no_grad():
        want = module(_x())
        got = popxl_fx.inference_model(module, Options(device="cpu"))(_x())
    assert torch.equal(got, want), (got - want).abs().max()


class GatedBlock(nn.Module):
    """GEGLU feed-forward, then Mamba's gate: silu of a causal conv's slice times silu(gate)."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(2 * d, d)
        self.in_proj = nn.Linear(d, 2 * d)
        self.conv = nn.Conv1d(d, d, 4, groups=d, padding=3)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        a, b = self.up(x).chunk(2, -1)
        x = x + self.down(a * F.gelu(b, approximate="tanh"))
        h, gate = self.in_proj(x).transpose(1, 2).chunk(2, dim=1)
        h = F.silu(self.conv(h)[..., : x.shape[1]]) * F.silu(gate)
        return self.head(h.transpose(1, 2)).mean(1)


def test_gated_block_trains_bit_for_bit():
    torch.manual_seed(0)
    x = torch.randn(4, 11, 24, generator=torch.Generator().manual_seed(2))
    errors = assert_matches_eager(
        GatedBlock(), x, targets=torch.tensor([0, 3, 1, 4]), loss_fn=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2), steps=2, rtol=0.0, atol=0.0,
    )  # fmt: skip
    assert set(errors.values()) == {0.0}
