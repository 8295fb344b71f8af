"""Nll's label checks and eager-kernel gradient (popxl_core/ops/_nll_labels.py).

The backward kernel skips re-running the forward for its total weight when no label can be
ignored; it must equal eager autograd's gradient to the bit (rtol=atol=0) in every case, with
and without that shortcut. The one-kernel range check must catch what the full check catches.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from popxl_core.errors import OpDataError
from popxl_core.ops._nll_labels import (
    aten_nll_backward,
    aten_nll_forward,
    check_labels,
    valid_labels,
)


def _eager_grad(logp, labels, g, reduction, ignore_index):
    x = logp.detach().requires_grad_()
    with torch.enable_grad():
        loss = F.nll_loss(
            x,
            labels.long(),
            reduction=reduction,
            ignore_index=-100 if ignore_index is None else ignore_index,
        )
        return torch.autograd.grad(loss, x, g.expand_as(loss))[0]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, -100, 2])
def test_backward_equals_eager_bitwise(reduction, ignore_index):
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(7, 5, generator=gen).log_softmax(-1)
    labels = torch.tensor([0, 2, 4, 1, 2, 3, 2], dtype=torch.int32)  # 2: ignored when it is
    g = torch.tensor(1.7) if reduction != "none" else torch.randn(7, generator=gen)
    got = aten_nll_backward(logp, labels, g, reduction, ignore_index)
    want = _eager_grad(logp, labels, g, reduction, ignore_index)
    assert got.numpy().tobytes() == want.numpy().tobytes()


def test_ignored_out_of_range_labels_take_the_full_path():
    logp = torch.randn(4, 3).log_softmax(-1)
    labels = torch.tensor([0, -100, 2, -100], dtype=torch.int32)
    g = torch.tensor(1.0)
    got = aten_nll_backward(logp, labels, g, "mean", -100)  # mean over the 2 labels that count
    assert got.numpy().tobytes() == _eager_grad(logp, labels, g, "mean", -100).numpy().tobytes()


@pytest.mark.parametrize("ignore_index", [None, -100])
def test_out_of_range_labels_are_found(ignore_index):
    lab = torch.tensor([0, 3, 1, 7, 2])
    with pytest.raises(OpDataError, match=r"label 7 at index \(3,\) is out of range for 4 "):
        check_labels(lab, valid_labels(lab, ignore_index), 4)
    with pytest.raises(OpDataError, match=r"label -1 at index \(0,\)"):
        check_labels(torch.tensor([-1, 0]), None, 4, ignore_index)
    check_labels(torch.tensor([0, 3, 1]), None, 4, ignore_index)  # in range: no error
    check_labels(torch.tensor([], dtype=torch.long), None, 4, ignore_index)


def test_the_ignore_index_is_not_out_of_range():
    lab = torch.tensor([[0, -100], [5, 1]])
    with pytest.raises(OpDataError, match=r"label -100 at index \(0, 1\)"):
        check_labels(lab, None, 4, 5)  # 5 is ignored, -100 is not
    check_labels(torch.tensor([[0, -100], [3, 1]]), None, 4, -100)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [None, -100, 2])
def test_forward_is_eager_s_and_finds_out_of_range_labels(reduction, ignore_index):
    """With an ignore_index, aten's own kernel checks the labels (no separate range check):
    the same loss bits as eager, and the same `OpDataError` as `check_labels` gives."""
    logp = torch.randn(6, 4, generator=torch.Generator().manual_seed(3)).log_softmax(-1)
    labels = torch.tensor([0, 3, -100, 2, 1, 2])
    if ignore_index != -100:
        labels[2] = 1
    (loss, _), *_ = aten_nll_forward(logp, labels, reduction, ignore_index)
    want = F.nll_loss(
        logp,
        labels,
        reduction=reduction,
        ignore_index=-100 if ignore_index is None else ignore_index,
    )
    assert loss.numpy().tobytes() == want.numpy().tobytes()
    bad = labels.clone()
    bad[4] = 4 if ignore_index != 4 else 5
    with pytest.raises(OpDataError, match=r"label 4 at index \(4,\) is out of range for 4 "):
        aten_nll_forward(logp, bad, reduction, ignore_index)
