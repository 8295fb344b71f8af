"""In-place updates through views and of the caller's inputs (popxl_fx.view_writes,
popxl_fx.inplace): eager torch's shared memory, reproduced. Every number is compared with
eager PyTorch bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx


def _slice_mul(x):
    x[:, 1:3].mul_(0.5)  # a view of a view: slice(slice(x))
    return x * 1.0


def _step_fill(x):
    x[0:3:2] = 7.0
    return x


def _select_add(x):
    x[1][2] += 4.0  # getitem, iadd, setitem into a view
    return x


def _transposed(x):
    x.t()[0].fill_(1.5)
    return x + 0.0


def _reshaped(x):
    x.view(-1)[5] = -2.0
    return x.sum(0)


def _chained(x):
    x += 1.0
    x *= 3.0
    x -= 0.25
    return x


def _narrowed(x):
    x.narrow(1, 1, 2).unsqueeze(0).add_(10.0)
    return x


def _permuted(x):
    x.unsqueeze(0).permute(2, 0, 1)[1].sub_(3.0)
    return x


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


_FNS = [_slice_mul, _step_fill, _select_add, _transposed, _reshaped, _chained, _narrowed, _permuted]


@pytest.mark.parametrize("fn", _FNS, ids=lambda f: f.__name__)
def test_updates_of_views_of_an_input_reach_it_and_the_caller_like_eager(fn):
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    ours, theirs = x.clone(), x.clone()
    out = popxl_fx.inference_model(Fn(fn))(ours)
    assert torch.equal(out, Fn(fn)(theirs))
    assert torch.equal(ours, theirs)  # the caller's tensor is updated as eager updates it


class ViewOfComputed(nn.Module):
    """A view of a computed tensor updated, the tensor used afterwards (PopTorch's
    index-put tests: ``t = lin(x).reshape(...); t[idx] = v``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 12)

    def forward(self, x, idx, v):
        h = self.lin(x)
        t = h.reshape(3, 4)
        t[idx, 1:] = v
        row = h[:4]
        row.mul_(2.0)
        return h * 1.0, t


def test_updates_of_views_of_computed_tensors_train_like_eager():
    torch.manual_seed(0)
    model = ViewOfComputed()
    x, idx, v = torch.randn(12), torch.tensor([2, 0]), torch.randn(2, 3)
    out = popxl_fx.inference_model(model)(x, idx, v)
    for a, b in zip(out, model(x, idx, v)):
        assert torch.equal(a, b.detach())


class BufferCount(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3, dtype=torch.float16))

    def forward(self, x):
        out = x + self.count
        self.count += 1  # eager: self.count = self.count.__iadd__(1), the same tensor
        return out


def test_augmented_assignment_of_a_buffer_updates_it_each_call():
    model = BufferCount()
    run = popxl_fx.inference_model(model)
    x = torch.ones(3, dtype=torch.float16)
    for step in range(3):
        assert torch.equal(run(x), x + step)
    assert torch.equal(model.count, torch.full((3,), 3.0, dtype=torch.float16))


class ReturnsNothing(nn.Module):
    def forward(self, x, y):
        x.masked_fill_(x > 0.5, 1.0)
        y.zero_()


def test_a_forward_returning_none_updates_its_inputs():
    x, y = torch.tensor([0.25, 0.75]), torch.ones(2)
    assert popxl_fx.inference_model(ReturnsNothing())(x, y) is None
    assert torch.equal(x, torch.tensor([0.25, 1.0])) and torch.equal(y, torch.zeros(2))


class SliceAtConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.start = torch.tensor([1])

    def forward(self, x):
        return x[self.start : self.start + 2, 0 : self.start + 2 : 2] * 2.0


def test_slice_bounds_held_as_tensors_are_read_as_eager_reads_them():
    x = torch.randn(4, 6)
    assert torch.equal(popxl_fx.inference_model(SliceAtConstant())(x), SliceAtConstant()(x))


def test_a_module_given_its_forward_on_the_instance_is_traced_through():
    model = nn.Module()
    model.forward = lambda x: torch.relu(x)[1:] * 3.0
    x = torch.randn(5)
    assert torch.equal(popxl_fx.inference_model(model)(x), model(x))
