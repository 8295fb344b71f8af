"""popxl_fx.poptorch's type rule: the IPU has no 64-bit types, as PopTorch has it.

An int64 / float64 input is computed on as int32 / float32, and an int64 / float64 output
comes back as int32 / float32. The reference is eager torch on the narrowed inputs, with its
64-bit outputs narrowed (tolerance 0). popxl_fx's own default keeps 64-bit inputs (eager's
numbers).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import popxl_fx
import popxl_fx.poptorch as poptorch
from popxl_fx.poptorch.dtypes import ipu_outputs


class Compare(nn.Module):
    def forward(self, x, y):
        return x == y, x + y


class Counts(nn.Module):
    def forward(self, x, y):
        return torch.sum(x == y), (x * 2).double(), torch.arange(3) + x.long()


def test_float64_input_computes_in_float32():
    x = torch.tensor([1.0, -1.0, 2.0, 550.4], dtype=torch.float32)
    y = torch.tensor([2.4, 2.0, 2.0, 550.4], dtype=torch.float64)
    equal, total = poptorch.inferenceModel(Compare())(x, y)
    assert torch.equal(equal, x == y.float())  # 550.4 in float32 on both sides: equal
    assert not torch.equal(equal, x == y)  # eager compares in float64
    assert total.dtype == torch.float32 and torch.equal(total, x + y.float())


def test_64bit_outputs_come_back_in_32_bits():
    x, y = torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3])
    out = poptorch.inferenceModel(Counts())(x, y)
    want = ipu_outputs(Counts()(x.int(), y.int()))
    assert [o.dtype for o in out] == [torch.int32, torch.float32, torch.int32]
    for got, ref in zip(out, want):
        assert torch.equal(got, ref)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x, labels):
        out = self.fc(x)
        return out, nn.functional.cross_entropy(out, labels)


def test_training_with_int64_labels_matches_eager():
    """The program holds the labels in int32; the trace still gives nll_loss int64 ones."""
    torch.manual_seed(0)
    model = Classifier()
    eager = copy.deepcopy(model)
    x, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 3, 1, 0])
    _, loss = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), 0.1))(
        x, labels
    )
    _, eager_loss = eager(x, labels)
    eager_loss.backward()
    torch.optim.SGD(eager.parameters(), 0.1).step()
    assert torch.equal(loss, eager_loss.detach())
    assert torch.equal(model.fc.weight, eager.fc.weight)


@pytest.mark.parametrize("narrow", [False, True])
def test_fx_option(narrow):
    x = torch.tensor([550.4], dtype=torch.float32)
    y = torch.tensor([550.4], dtype=torch.float64)
    infer = popxl_fx.inference_model(Compare(), popxl_fx.Options(narrow_64bit=narrow))
    equal, total = infer(x, y)
    assert torch.equal(equal, x == (y.float() if narrow else y))
    assert total.dtype == (torch.float32 if narrow else torch.float64)
