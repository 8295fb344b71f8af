"""A model's checks that only raise on bad data (``if labels.max() >= vocab: raise ...``,
``assert``), kept as run-time checks (issue 34): good data trains bit for bit with eager, bad
data raises the model's own error before anything is updated; a real data-dependent branch
is still refused with its line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_core as popxl
from popxl_core import ops
from popxl_fx import Options, UnsupportedError, check, inference_model, training_model

CPU = Options(device="cpu")
X = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
GOOD, BAD = torch.tensor([0, 1, 4]), torch.tensor([0, 7, 4])


def test_runtime_check_op():
    ir = popxl.Ir()
    with ir.main_graph:
        x = popxl.variable(np.array([1.0, 2.0, 3.0], np.float32), name="x")
        ops.runtime_check(ops.less(x, popxl.constant(np.float32(3.5))), "x < 3.5", tag="t1")
        ops.runtime_check(ops.less(x, popxl.constant(np.float32(2.5))), "x < 2.5", tag="t2")
    with popxl.Session(ir, "cpu") as session:
        with pytest.raises(ops.RuntimeCheckError, match=r"x < 2\.5") as err:
            session.run()
    assert err.value.tag == "t2"


class Guarded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 5)

    def forward(self, x, labels):
        if labels.max() >= self.fc.out_features:
            raise ValueError(f"Label values must be < 5, got {labels.max()}")
        assert (labels >= 0).all(), "labels must not be negative"
        return F.cross_entropy(self.fc(x), labels)


def _eager_step(model, opt, labels):
    opt.zero_grad()
    loss = model(X, labels)
    loss.backward()
    opt.step()
    return loss.detach()


def test_guards_are_no_issue():
    assert check(Guarded(), X, GOOD).ok


def test_good_data_trains_like_eager_and_bad_data_raises_the_models_error():
    model, reference = Guarded(), Guarded()
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), options=CPU)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    assert torch.equal(trainer(X, GOOD), _eager_step(reference, opt, GOOD))
    with pytest.raises(ValueError, match="Label values must be < 5, got 7") as err:
        trainer(X, BAD)
    assert "test_fx_guards.py" in err.value.__notes__[0]
    with pytest.raises(AssertionError, match="labels must not be negative"):
        trainer(X, torch.tensor([0, -1, 2]))
    assert torch.equal(model.fc.weight, reference.fc.weight)  # nothing was updated
    assert torch.equal(trainer(X, GOOD), _eager_step(reference, opt, GOOD))
    assert torch.equal(model.fc.weight, reference.fc.weight)


def test_inference_raises_the_models_error():
    model = Guarded().eval()
    run = inference_model(model, CPU)
    assert torch.equal(run(X, GOOD), model(X, GOOD))
    with pytest.raises(ValueError, match="Label values must be < 5, got 7"):
        run(X, BAD)


class HFStyle(nn.Module):
    """The shape HF writes its checks in: a Python test first, the tensor test last."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 5)

    def forward(self, x, labels=None):
        if labels is not None and labels.max() >= self.fc.out_features:
            raise ValueError(f"Label values must be <= vocab_size: {self.fc.out_features}")
        if labels.max() >= 100 or labels.min() < 0:  # either one raises
            raise ValueError("labels out of range")
        return F.cross_entropy(self.fc(x), labels)


@pytest.mark.parametrize(
    "labels, message",
    [(BAD, "must be <= vocab_size: 5"), (torch.tensor([0, -3, 1]), "labels out of range")],
)
def test_checks_with_and_or_raise_the_models_error(labels, message):
    model, reference = HFStyle(), HFStyle()
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), options=CPU)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    assert torch.equal(trainer(X, labels=GOOD), _eager_step(reference, opt, GOOD))
    with pytest.raises(ValueError, match=message):
        trainer(X, labels=labels)
    assert torch.equal(model.fc.weight, reference.fc.weight)


class Branching(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a branch that computes: refused
            x = x * 2
        return x


class BothOrNeither(nn.Module):
    def forward(self, x):
        if (x > 10).any() and (x < -10).any():  # one bool does not decide the test
            raise ValueError("both")
        return x + 1


@pytest.mark.parametrize("cls", [Branching, BothOrNeither])
def test_real_data_dependent_branches_are_still_refused(cls):
    assert [i.kind for i in check(cls(), X).issues] == ["data-dependent control flow"]
    with pytest.raises(UnsupportedError, match="data-dependent control flow"):
        inference_model(cls(), CPU)(X)
