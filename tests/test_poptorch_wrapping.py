"""A training executor marks the user's model as PopTorch does (``model.destroy()``, no second
wrap until destroyed), and the executor's cycle-count and compilation-time queries."""

from __future__ import annotations

import copy
import datetime

import pytest
import torch
from torch import nn

import popxl_fx.poptorch as poptorch


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 1)

    def forward(self, x):
        return nn.functional.l1_loss(self.fc(x), x + 1)


def _steps(model: nn.Module, n: int) -> poptorch.PoplarExecutor:
    executor = poptorch.trainingModel(model, poptorch.Options().deviceIterations(n))
    executor(torch.ones([n]))
    return executor


def test_rewrapping_needs_destroy_and_keeps_training_going():
    torch.manual_seed(0)
    model, eager = _Model(), _Model()
    eager.load_state_dict(model.state_dict())
    _steps(model, 3)
    assert type(model).__name__ == "Poptorch_Model" and isinstance(model, _Model)
    with pytest.raises(RuntimeError, match="already been wrapped in 'poptorch.trainingModel'"):
        poptorch.trainingModel(model)
    model.destroy()
    assert type(model) is _Model
    executor = _steps(model, 2)
    executor.destroy()
    poptorch.trainingModel(executor)(torch.ones([1]))  # an executor wraps its model again
    sgd = torch.optim.SGD(eager.parameters(), lr=0.01)  # PopTorch's default optimizer
    for _ in range(6):
        sgd.zero_grad()
        eager(torch.ones([1])).backward()
        sgd.step()
    assert torch.equal(model.fc.bias, eager.fc.bias) and torch.equal(
        model.fc.weight, eager.fc.weight
    )


def test_cycle_count_and_compilation_time_errors_as_poptorch():
    add = poptorch.inferenceModel(nn.Identity())
    with pytest.raises(poptorch.Error, match="Cycle count logging is disabled"):
        add.cycleCount()
    with pytest.raises(poptorch.Error, match="compile the model before obtaining compilation"):
        add.compilationTime()
    add(torch.ones(2))
    assert isinstance(add.compilationTime(), datetime.timedelta)
    quiet = poptorch.inferenceModel(
        nn.Identity(), poptorch.Options().showCompilationProgressBar(False)
    )
    quiet(torch.ones(2))
    with pytest.raises(poptorch.Error, match="set showCompilationProgressBar option"):
        quiet.compilationTime()
    counting = poptorch.inferenceModel(nn.Identity(), poptorch.Options().logCycleCount(True))
    with pytest.raises(poptorch.Error, match="only supported on actual IPU hardware"):
        counting(torch.ones(2))


def test_a_marked_model_saves_as_its_own_class(tmp_path):
    model = _Model()
    executor = poptorch.trainingModel(model)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert type(loaded) is _Model and torch.equal(loaded.fc.weight, model.fc.weight)
    assert type(copy.copy(model)) is type(model)  # a shallow copy keeps the mark
    assert executor.model is model
