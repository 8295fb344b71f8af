"""A tensor forward makes from constants (``torch.zeros(x.shape)``) and a traced call then
writes into (``out=`` or in place) reads as that write wherever forward uses it later, eager
arithmetic included (``buf * 2``): eager torch's numbers at tolerance 0 for two inputs, so a
value frozen at capture fails. Memory it shares untraced (a view taken before) is reported."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popxl_fx
from popxl_fx.capture import capture
from popxl_fx.capture_writes import STALE_READ
from popxl_fx.errors import UnsupportedError
from popxl_fx.testing import assert_matches_eager

_INPUTS = (torch.tensor([1.5, 2.25, -7.0, 0.5]), torch.tensor([-3.0, 0.75, 4.5, 10.0]))


class OutThenEager(nn.Module):
    def forward(self, x):
        buf = torch.zeros(x.shape, dtype=torch.int32)
        torch.cumsum(x, 0, out=buf)
        return buf * 2, 3 - buf, buf.neg()  # eager operators, reflected too, and a method


class OutThenTraced(nn.Module):
    def forward(self, x):
        buf = torch.empty(x.shape)
        torch.mul(x, 2.0, out=buf)
        return buf + x  # a traced call: the written node, not a new constant


class InPlaceThenEager(nn.Module):
    def forward(self, x):
        buf = torch.ones(x.shape)
        buf.add_(x)
        buf.mul_(3.0)  # an eager in-place update after the traced one: traced too
        return torch.cat([buf, buf * 2]), buf


class SetItemAfterWrite(nn.Module):
    def forward(self, x):
        x = x.view(2, 2)
        buf = torch.zeros(x.shape)
        buf.sub_(x)
        buf[1] = 5.0  # assigned after the write: the assignment's node from then on
        return buf * 1.5, buf.T  # an operator and a property


class PlainTakesWritten(nn.Module):
    def forward(self, x):
        other, more = torch.ones(x.shape), torch.full(x.shape, 2.0)
        buf = torch.zeros(x.shape)
        buf.add_(x)
        other.add_(buf)  # an untraced tensor updated with the written one: followed too
        more[1:3] = buf[0:2]  # and one assigned from it
        return other * 2, more - 1, torch.stack([buf.detach(), x]) + other


class TrainedThroughWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        buf = torch.zeros(x.shape)
        buf.add_(self.lin(x))  # the gradient reaches lin through the eager ``buf * buf``
        return (buf * buf).mean()


class DrawnThenEager(nn.Module):
    def forward(self, x):
        noise = torch.empty(x.shape)
        noise.uniform_(2.0, 3.0)
        return x + noise * 2  # ``noise * 2`` is eager: the draw must not be frozen


class ViewBeforeWrite(nn.Module):
    def forward(self, x):
        buf = torch.zeros(x.shape)
        head = buf[:2]  # a view of the tensor as made
        buf.add_(x)
        return head * 2, buf


def _same(got, want) -> None:
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g, w)


@pytest.mark.parametrize(
    "model", [OutThenEager, OutThenTraced, InPlaceThenEager, SetItemAfterWrite, PlainTakesWritten]
)
def test_written_tensor_reads_as_the_write(model):
    infer = popxl_fx.inference_model(model(), popxl_fx.Options(device="cpu"))
    for x in _INPUTS:
        _same(infer(x), model()(x))


def test_training_through_a_written_tensor_is_eagers():
    torch.manual_seed(0)
    errors = assert_matches_eager(
        TrainedThroughWrite(), torch.randn(3, 4), options=popxl_fx.Options(device="cpu"),
        rtol=0, atol=0,
    )  # fmt: skip
    assert errors["loss"] == 0.0 and errors["gradients"] == 0.0


def test_drawn_tensor_read_by_eager_code_draws_each_call():
    infer = popxl_fx.inference_model(DrawnThenEager(), popxl_fx.Options(device="cpu"))
    x = _INPUTS[0]
    first, second = infer(x), infer(x)
    assert not torch.equal(first, second)
    torch.manual_seed(3)
    got = infer(x)
    torch.manual_seed(3)
    _same(got, DrawnThenEager()(x))


def test_view_taken_before_the_write_is_reported():
    issues = capture(ViewBeforeWrite(), (_INPUTS[0],)).issues
    stale = [i for i in issues if i.kind == STALE_READ]
    assert len(stale) == 1 and "test_fx_capture_writes.py" in stale[0].source
    with pytest.raises(UnsupportedError, match=STALE_READ):
        popxl_fx.inference_model(ViewBeforeWrite(), popxl_fx.Options(device="cpu"))(_INPUTS[0])
