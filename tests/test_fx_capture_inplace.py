"""In-place torch calls: later uses of the tensor see the update, as in eager; an in-place
update that eager would show through a view taken before it is reported."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx.check import check
from popxl_fx.errors import UnsupportedError

from .fx_capture_util import eager_grads, run_module


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.fc(x) * 2.0
        h.add_(1.0)
        h.mul_(3.0)
        g = h - 4.0
        F.relu(g, inplace=True)  # result unused: g itself is updated
        r = self.act(h)  # h is updated too
        return r + h + g


def test_inplace_updates_reach_later_uses_like_eager_with_gradients():
    torch.manual_seed(0)
    model, x = Chain(), torch.randn(4, 3)
    dy = torch.randn(4, 3)
    ours, ref = run_module(model, x, dy=dy), eager_grads(model, [x], dy)
    torch.testing.assert_close(ours["out"][0], ref["out"], rtol=0, atol=0)
    for name, grad in ref["grads"].items():
        torch.testing.assert_close(ours["grads"][name], grad, rtol=1e-6, atol=1e-6, msg=name)


class StaleView(nn.Module):
    def forward(self, x):
        h = x * 1.0
        row = h[0]
        h.mul_(2.0)
        return row + 1.0, h


def test_a_view_taken_before_an_update_reads_it_like_eager():
    x = torch.randn(2, 3)
    ours, theirs = run_module(StaleView(), x)["out"], StaleView()(x)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class SplitUpdate(nn.Module):
    def forward(self, x):
        h = x * 1.0
        first, _ = h.split(1)
        first.add_(1.0)  # view-line
        return h


def test_an_update_not_written_back_into_its_base_is_reported_at_its_line():
    # eager's h shows the update (split's parts share its memory); the program's would not
    report = check(SplitUpdate(), torch.randn(2, 3))
    (issue,) = [i for i in report.issues if i.kind == "in-place update of a view"]
    with open(__file__) as f:
        line = next(
            i for i, text in enumerate(f, 1) if "# view-line" in text and "next(" not in text
        )
    assert issue.source == f"{__file__}:{line}"
    with pytest.raises(UnsupportedError, match="in-place update of a view"):
        run_module(SplitUpdate(), torch.randn(2, 3))


class Untabled(nn.Module):
    def forward(self, x):
        h = x * 1.5
        h.tanh_()  # no table entry: decomposed, and h is updated
        return h * 2.0 + h


def test_inplace_method_without_entry_decomposes_and_updates_its_tensor():
    from popxl_fx.lowering import LOWERINGS

    assert "tanh_" not in LOWERINGS
    torch.manual_seed(0)
    model, x = Untabled(), torch.randn(4, 3)
    dy = torch.randn(4, 3)
    ours, ref = run_module(model, x, dy=dy), eager_grads(model, [x], dy)
    torch.testing.assert_close(ours["out"][0], ref["out"], rtol=0, atol=0)
    torch.testing.assert_close(ours["grads"]["x0"], ref["grads"]["x0"], rtol=1e-6, atol=1e-6)
