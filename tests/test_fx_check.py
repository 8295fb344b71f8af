"""popxl_fx.check on deliberately untraceable models: each problem reported with the user's
file:line and module path; a supported model reports nothing; the model is left unchanged."""

import itertools

import pytest
import torch
from torch import nn

from popxl_fx.check import check
from popxl_fx.errors import UnsupportedError


def _line(text: str) -> str:
    """This file's ``file:line`` of the (unique) line containing ``text``."""
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


class Item(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        scale = self.fc(x).abs().max().item()  # item-line
        return x * scale


class Branch(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # branch-line
            return x * 2
        return x - 1


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()  # fft-line


_CALLS = itertools.count(1)  # state outside the module: only a second trace can see it


class Counter(nn.Module):
    """Its output shape changes from one call to the next."""

    def forward(self, x):
        return x[:, : next(_CALLS)] * 2  # counter-line


class Masked(nn.Module):
    def forward(self, x):
        return x[x > 0].sum()  # mask-line


class Inner(nn.Module):
    def forward(self, x):
        rows = [x[i[0]] for i in (x[:, 0] > 0).nonzero()]  # list-line
        return torch.stack(rows).sum(0)


class ListOfRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()

    def forward(self, x):
        return self.inner(x)


def _issue(report, kind):
    found = [i for i in report.issues if i.kind == kind]
    assert found, f"no {kind!r} issue in:\n{report}"
    return found[0]


def test_item_is_reported_at_its_line():
    report = check(Item(), torch.randn(2, 4))
    issue = _issue(report, ".item()")
    assert issue.source == _line("# item-line") and "item" in issue.what


def test_data_dependent_branch_is_reported_at_the_if():
    issue = _issue(check(Branch(), torch.randn(2, 4)), "data-dependent control flow")
    assert issue.source == _line("# branch-line")


def test_unsupported_op_names_the_op_and_the_missing_aten_op():
    issue = _issue(check(Unsupported(), torch.randn(2, 8)), "unsupported op")
    assert issue.source == _line("# fft-line")
    assert "rfft" in issue.what and "aten._fft_r2c" in issue.hint


def test_shape_that_changes_between_calls():
    issue = _issue(check(Counter(), torch.randn(2, 4)), "shape changes between calls")
    assert issue.source == _line("# counter-line")


def test_shape_that_changes_with_the_data():
    report = check(Masked(), torch.randn(3, 4))
    assert _issue(report, "data-dependent shape").source == _line("# mask-line")


def test_list_of_data_dependent_length_names_line_and_module_path():
    report = check(ListOfRows(), torch.randn(5, 3))
    issue = _issue(report, "data-dependent length")
    assert issue.source == _line("# list-line") and issue.module_path == "inner"
    with pytest.raises(UnsupportedError, match="data-dependent length"):
        report.raise_if_any()


def test_supported_model_has_no_issues_and_is_left_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU()).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = check(model, torch.randn(3, 4))
    assert report.ok, str(report)
    report.raise_if_any()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
