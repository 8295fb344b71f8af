"""Lowerings added for PopTorch's tensor-op tests (popxl_fx.lowerings.windows, shape):
unfold, index_fill, gather with a shorter index, cat of mixed dtypes, and an in-place update
of a tensor forward makes from constants; each compared with eager PyTorch bit for bit,
forward and gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


_IDX = torch.tensor([0, 3])
_CASES = {
    "unfold": lambda x: x.unfold(1, 3, 2),
    "unfold_last": lambda x: x.unfold(-1, 2, 1),
    "index_fill_tensor": lambda x: x.clone().index_fill_(2, _IDX, torch.tensor(-1)),
    "index_fill_scalar": lambda x: torch.index_fill(x, 1, _IDX, 2.5),
    "gather_short": lambda x: torch.gather(x, 1, torch.tensor([[[0], [6]]]).expand(1, 2, 2)),
    "cat_mixed": lambda x: torch.cat([x, _IDX.reshape(1, 2, 1).expand(2, 2, 5)], 1),
}


@pytest.mark.parametrize("name", list(_CASES))
def test_forward_and_gradient_match_eager(name):
    torch.manual_seed(0)
    fn = _CASES[name]
    x = torch.randn(2, 7, 5)
    out = popxl_fx.inference_model(Fn(fn))(x)
    assert torch.equal(out, fn(x))
    compiled = popxl_fx.compile(Fn(fn))
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn(out.shape)
    (compiled(ours) * dy).sum().backward()
    (fn(theirs) * dy).sum().backward()
    assert torch.equal(ours.grad, theirs.grad)


class MadeThenUpdated(nn.Module):
    def forward(self, inp, idx):
        out = torch.zeros((idx.size(0), 6), dtype=inp.dtype)  # folded: a constant
        out.scatter_(1, idx.unsqueeze(1), 1.1)
        return out.mul_(inp)


def test_a_tensor_made_in_forward_and_updated_in_place_is_new_each_call():
    model = MadeThenUpdated()
    run = popxl_fx.inference_model(model)
    for seed in range(3):
        torch.manual_seed(seed)
        x, idx = torch.randn(6, 6), torch.randint(6, (6,))
        assert torch.equal(run(x, idx), model(x, idx))
