"""Buffers that forward updates with ``+=`` (eager updates them in place, and so does the
program, step after step), and PopTorch's errors for a buffer removed or reassigned."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(2))

    def forward(self, x):
        self.count += x.sum(0)
        self.count *= 0.5
        return self.count + 0


def test_augmented_assignment_updates_the_buffer_every_step():
    model, eager = _Counter(), _Counter()
    program = popxl_fx.inference_model(model)
    for step in range(3):
        x = torch.full((3, 2), float(step + 1))
        assert torch.equal(program(x), eager(x))
    assert torch.equal(model.count, eager.count)


class _Trained(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.register_buffer("seen", torch.zeros(2))

    def forward(self, x, target):
        out = self.fc(x)
        with torch.no_grad():
            self.seen += self.fc.bias
        return out, nn.functional.l1_loss(out, target)


def test_a_training_executor_updates_the_buffer_as_eager():
    torch.manual_seed(0)
    model = _Trained()
    eager = copy.deepcopy(model)
    executor = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    sgd = torch.optim.SGD(eager.parameters(), lr=0.1)
    x, target = torch.randn(4, 2), torch.zeros(4, 2)
    for _ in range(3):
        executor(x, target)
        sgd.zero_grad()
        eager(x, target)[1].backward()
        sgd.step()
    assert torch.equal(model.seen, eager.seen) and torch.equal(model.fc.bias, eager.fc.bias)


def test_a_number_augmented_in_forward_stays_a_number():
    class Scaled(nn.Module):
        def forward(self, x):
            n = x.shape[0]
            n += 1
            y = x * 2
            y -= 1  # a tensor that is not state: updated in place, as in eager
            return y * n

    x = torch.ones(2, 3)
    assert torch.equal(popxl_fx.inference_model(Scaled())(x), Scaled()(x))


def test_poptorch_errors_for_a_buffer_reassigned_or_removed():
    class Reassigns(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("y", torch.tensor([2.0]))

        def forward(self, x):
            self.y = x + 1
            return x

    class Removes(Reassigns):
        def forward(self, x):
            del self._buffers["y"]
            return x + 1

    with pytest.raises(poptorch.Error, match=r"Buffer y is reassigned .* self\.y\.copy_\(src\)"):
        poptorch.inferenceModel(Reassigns())(torch.tensor([5.0]))
    with pytest.raises(poptorch.Error, match="Buffer y is removed from the model"):
        poptorch.inferenceModel(Removes())(torch.tensor([5.0]))
