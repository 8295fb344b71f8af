"""Swin-style shifted-window attention, written as people write it, bit for bit with eager
(tolerance 0): inference, gradients and 2 AdamW steps.

Windows are cut with view/permute (strided views), shifted with ``torch.roll`` and masked; each
window's heads add a relative-position bias gathered from a table; the head pools the 7 x 7 =
49 tokens with ``mean(1)``, whose gradient eager divides by 49 (times 1/49 was 3.7e-9 off in
the input's gradient, issue 34).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx import Options
from popxl_fx.testing import assert_matches_eager


def _windows(x, ws: int):
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def _unwindow(x, ws: int, h: int, w: int):
    b = x.shape[0] // ((h // ws) * (w // ws))
    x = x.view(b, h // ws, w // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, -1)


def _relative_index(ws: int) -> torch.Tensor:
    coords = torch.stack(torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij"))
    rel = coords.flatten(1)[:, :, None] - coords.flatten(1)[:, None, :] + ws - 1
    return rel[0] * (2 * ws - 1) + rel[1]


def _shift_mask(res: int, ws: int, shift: int) -> torch.Tensor:
    region = torch.zeros(1, res, res, 1)
    bands = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    for i, rows in enumerate(bands):
        for j, cols in enumerate(bands):
            region[:, rows, cols] = 3 * i + j
    ids = _windows(region, ws).squeeze(-1)
    same = ids[:, None, :] == ids[:, :, None]
    return torch.zeros(same.shape).masked_fill(~same, -100.0)


class WindowBlock(nn.Module):
    def __init__(self, dim: int, res: int, ws: int, heads: int, shift: int) -> None:
        super().__init__()
        self.res, self.ws, self.heads, self.shift = res, ws, heads, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.table = nn.Parameter(0.02 * torch.randn((2 * ws - 1) ** 2, heads))
        self.register_buffer("index", _relative_index(ws).reshape(-1))
        self.register_buffer("mask", _shift_mask(res, ws, shift) if shift else None)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attention(self, x):
        n_win, n, c = x.shape
        qkv = self.qkv(x).reshape(n_win, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * (c // self.heads) ** -0.5, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        attn = attn + self.table[self.index].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        if self.mask is not None:
            m = self.mask.shape[0]
            attn = attn.view(n_win // m, m, self.heads, n, n) + self.mask[:, None]
            attn = attn.view(-1, self.heads, n, n)
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(n_win, n, c)
        return self.proj(out)

    def forward(self, x):
        b, _, c = x.shape
        h = self.norm1(x).view(b, self.res, self.res, c)
        if self.shift:
            h = torch.roll(h, (-self.shift, -self.shift), (1, 2))
        h = _unwindow(self.attention(_windows(h, self.ws)), self.ws, self.res, self.res)
        if self.shift:
            h = torch.roll(h, (self.shift, self.shift), (1, 2))
        x = x + h.reshape(b, -1, c)
        return x + self.mlp(self.norm2(x))


class TinySwin(nn.Module):
    def __init__(self, dim: int = 48, res: int = 14, ws: int = 7, heads: int = 3) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 2, 2)
        self.blocks = nn.Sequential(
            WindowBlock(dim, res, ws, heads, 0), WindowBlock(dim, res, ws, heads, ws // 2)
        )
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        return self.head(self.blocks(x).mean(1))


def _images() -> torch.Tensor:
    return torch.randn(2, 3, 28, 28, generator=torch.Generator().manual_seed(1))


def test_inference_bit_for_bit():
    torch.manual_seed(0)
    model = TinySwin().eval()
    with torch.no_grad():
        want = model(_images())
        got = popxl_fx.inference_model(model, Options(device="cpu"))(_images())
    assert torch.equal(got, want), (got - want).abs().max()


def test_gradients_bit_for_bit():
    torch.manual_seed(0)
    model = TinySwin()
    x, y = _images().requires_grad_(), _images().requires_grad_()
    sim = popxl_fx.compile(copy.deepcopy(model), Options(device="cpu"))
    cot = torch.randn(2, 10, generator=torch.Generator().manual_seed(5))
    (sim(x) * cot).sum().backward()
    (model(y) * cot).sum().backward()
    assert torch.equal(x.grad, y.grad), (x.grad - y.grad).abs().max()
    for (name, p), q in zip(sim.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), (name, (p.grad - q.grad).abs().max())


def test_two_adamw_steps_bit_for_bit():
    torch.manual_seed(0)
    errors = assert_matches_eager(
        TinySwin(), _images(), targets=torch.tensor([3, 7]), loss_fn=F.cross_entropy,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), steps=2, rtol=0.0, atol=0.0,
    )  # fmt: skip
    assert set(errors.values()) == {0.0}
