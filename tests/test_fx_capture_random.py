"""Random draws on plain tensors in forward (``torch.distributions``' samplers, in-place
fills of ``torch.empty``) are nodes of the program: new draws every call, and with
rng="torch" eager's draws bit for bit after the same seed (never frozen at capture)."""

from __future__ import annotations

import torch
from torch import nn

import popxl_fx


class Samplers(nn.Module):
    def forward(self, x):
        noise = torch.empty(x.shape)
        noise.uniform_(2.0, 3.0)  # drawn in place, then read below
        return (
            x + torch.distributions.Bernoulli(0.5).sample(x.shape),
            x + torch.distributions.Exponential(0.5).sample(x.shape),
            x + noise,
            x + torch.bernoulli(torch.full(x.shape, 0.25)),
        )


def _model():
    return popxl_fx.inference_model(Samplers(), popxl_fx.Options(device="cpu"))


def test_each_call_draws_anew():
    infer, x = _model(), torch.zeros(64)
    first, second = infer(x), infer(x)
    for a, b in zip(first, second):
        assert not torch.equal(a, b)


def test_draws_are_eagers_after_the_same_seed():
    infer, x = _model(), torch.zeros(64)
    infer(x)
    torch.manual_seed(5)
    got = infer(x)
    torch.manual_seed(5)
    for g, want in zip(got, Samplers()(x)):
        assert torch.equal(g, want)
