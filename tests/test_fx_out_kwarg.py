"""torch's ``out=`` keyword in a traced forward: the value is the op's, in ``out``'s dtype,
and later uses of ``out`` see it; compared with eager torch (tolerance 0)."""

from __future__ import annotations

import torch
from torch import nn

import popxl_fx


class MatmulInto(nn.Module):
    def forward(self, x, y, out=None):
        result = torch.matmul(x, y, out=out)
        return result, (out if out is not None else result) + 1


class CumsumInto(nn.Module):
    def forward(self, x):
        buf = torch.zeros(x.shape, dtype=torch.int32)
        torch.cumsum(x, 0, out=buf)  # torch writes the float sums into int32, truncated
        return buf * 2


def _same(got, want) -> None:
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_matmul_out_input_and_its_later_use():
    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randn(6, 3)
    infer = popxl_fx.inference_model(MatmulInto(), popxl_fx.Options(device="cpu"))
    _same(infer(x, y, torch.empty(4, 3)), MatmulInto()(x, y, torch.empty(4, 3)))


def test_matmul_out_none():
    torch.manual_seed(1)
    x, y = torch.randn(5), torch.randn(5, 2)
    infer = popxl_fx.inference_model(MatmulInto(), popxl_fx.Options(device="cpu"))
    _same(infer(x, y), MatmulInto()(x, y))


def test_out_of_another_dtype():
    x = torch.tensor([1.5, 2.25, -7.0, 0.5])
    infer = popxl_fx.inference_model(CumsumInto(), popxl_fx.Options(device="cpu"))
    _same([infer(x)], [CumsumInto()(x)])
