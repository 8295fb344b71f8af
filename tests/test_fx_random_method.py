"""``x.random_(...)`` in a traced forward: with rng="torch" eager's draws bit for bit (same
seed), with rng="ipu" whole numbers in ``[from, to)`` with the uniform distribution's mean."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx


class Draws(nn.Module):
    def forward(self, x):
        y = x + 0
        y.random_(5, 100)  # in place: later uses of y see the draws
        return y * 1, (x + 0).random_(7), (x + 0).random_()


def _run(rng: str, x: torch.Tensor) -> tuple:
    infer = popxl_fx.inference_model(Draws(), popxl_fx.Options(device="cpu", rng=rng))
    infer(x)  # built first, so the seed is set right before the draws of the run
    torch.manual_seed(11)
    return infer(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_torch_rng_is_eager(dtype):
    x = torch.zeros(4, 30, dtype=dtype)
    out = _run("torch", x)
    torch.manual_seed(11)
    for got, want in zip(out, Draws()(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_ipu_rng_statistics(dtype):
    ranged, below_seven, _ = _run("ipu", torch.zeros(100, 150, dtype=dtype))
    assert ranged.dtype == dtype and int(ranged.min()) == 5 and int(ranged.max()) == 99
    if dtype.is_floating_point:
        assert torch.equal(ranged, ranged.floor())
    assert abs(float(ranged.double().mean()) - 52.0) < 1.0  # standard error about 0.22
    assert int(below_seven.min()) == 0 and int(below_seven.max()) == 6
