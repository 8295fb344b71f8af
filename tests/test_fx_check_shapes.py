"""`popxl_fx.check_shapes`: `check` runs the traced graph on other data only where a shape can
depend on the data; where it skips the run, the run would have found nothing."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from popxl_fx.capture import capture
from popxl_fx.check import check
from popxl_fx.check_shapes import shapes_static

from .fx_zoo import ZOO

check_module = importlib.import_module("popxl_fx.check")  # the package exports check()

STATIC = ["gpt", "seed_mlp", "small_cnn"]  # every op in the tables


def _reruns(monkeypatch) -> list:
    """The runs of a traced graph on other data, from now on."""
    runs: list = []
    run = check_module._ShapeRecorder.run

    def counted(self, *args):
        runs.append(self)
        return run(self, *args)

    monkeypatch.setattr(check_module._ShapeRecorder, "run", counted)
    return runs


@pytest.mark.parametrize("name", STATIC)
def test_a_static_model_is_checked_without_a_run_on_other_data(name, monkeypatch):
    case = ZOO[name]()
    runs = _reruns(monkeypatch)
    assert check(case.model, *case.inputs).ok
    assert runs == []


@pytest.mark.parametrize("name", STATIC)
def test_where_the_run_is_skipped_it_finds_nothing(name, monkeypatch):
    case = ZOO[name]()
    captured = capture(case.model, case.inputs)
    assert shapes_static(captured.gm, case.model)
    runs = _reruns(monkeypatch)
    monkeypatch.setattr(check_module, "shapes_static", lambda gm, model: False)
    found = check_module._rerun_with_other_data(captured.gm, case.model, case.inputs)
    assert (len(runs), found) == (1, None)


class Repeated(nn.Module):
    def forward(self, x, counts):
        return x.repeat_interleave(counts, dim=0) * 2


class SlicedByData(nn.Module):
    def forward(self, x, idx):
        return x[: idx.sum()] * 2  # slice-line


class IndexedByTensor(nn.Module):
    def forward(self, x, idx):
        return x[idx] + 1


class SizedByGraph(nn.Module):
    def forward(self, x):
        return x.view(x.sum().long(), -1)


class Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.relu(self.fc(x)).transpose(0, 1).reshape(-1)[:3]


def test_a_shape_that_changes_with_the_data_is_still_found(monkeypatch):
    runs = _reruns(monkeypatch)
    report = check(SlicedByData(), torch.randn(5, 2), torch.tensor([1, 2]))
    assert len(runs) == 1
    [issue] = report.issues
    assert issue.kind == "shape changes with the data"
    assert issue.what == "getitem() has shape (4, 2) on other data, (3, 2) on the example"
    assert issue.source == f"{__file__}:{_line('slice-line')}"


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line(" not in line)


@pytest.mark.parametrize(
    "model, inputs, static",
    [
        (Pooled(), (torch.randn(2, 4),), True),
        (Repeated(), (torch.randn(3, 2), torch.tensor([1, 3, 2])), False),
        (IndexedByTensor(), (torch.randn(3, 2), torch.tensor([2, 0])), False),
        (SlicedByData(), (torch.randn(5, 2), torch.tensor([1, 2])), False),
        (SizedByGraph(), (torch.ones(2, 3),), False),
    ],
    ids=["listed-ops", "unlisted-op", "tensor-index", "data-slice", "size-from-graph"],
)
def test_only_listed_ops_with_constant_sizes_and_indices_count_as_static(model, inputs, static):
    captured = capture(model, inputs)
    assert shapes_static(captured.gm, model) is static
