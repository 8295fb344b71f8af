"""Issue 17, as a user would slip: Python in ``forward`` that a static program cannot repeat
(print of a tensor, Python state, numpy), and the vague cases of the ways in (float class
labels, a missing or extra target, ``loss.backward()`` on a trainer's loss, an Options where
loss_fn goes, autocast, bfloat16, nothing to train, ``compile`` of a class). Each one is
reported by `check` with the user's file:line and raised (warned, for print) by the entry
points; where the use is legal the numbers are eager's, exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popxl_fx
from popxl_fx import Options, UnsupportedError, check, compile, inference_model, training_model

CPU = Options(device="cpu")


def _line(text: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


def _issue(report, kind):
    found = [i for i in report.issues if i.kind == kind]
    assert found, str(report)
    return found[0]


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
Y = torch.tensor([0, 2, 1, 1, 0])


# Python in forward ------------------------------------------------------------------------
class Printing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        print("hidden:", h)  # print-line
        return h


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # count-line
        return self.fc(x)


class Remembering(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.history = []

    def forward(self, x):
        h = self.fc(x)
        self.history.append(h)  # append-line
        return h


class WithNumpy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        scale = np.tanh(x.detach().numpy()).mean()  # numpy-method-line
        return self.fc(x) * float(scale)


class NumpyFunction(nn.Module):
    def forward(self, x):
        return torch.as_tensor(np.exp(x)) + x  # np-function-line


def test_print_of_a_tensor_is_reported_and_warned_and_trains_like_eager(capsys):
    issue = _issue(check(Printing(), X), "print of a tensor")
    assert issue.source == _line("# print-line")
    model = Printing()
    reference = Printing()
    reference.load_state_dict(model.state_dict())
    trainer = training_model(model, sgd(model), F.cross_entropy, CPU)
    with pytest.warns(UserWarning, match="print of a tensor"):
        loss = trainer(X, Y)
    eager = F.cross_entropy(reference(X), Y)
    assert torch.equal(loss, eager.detach())  # the print changes nothing else


def test_python_counter_in_forward_is_reported_and_raised():
    issue = _issue(check(Counting(), X), "Python state in forward")
    assert issue.source == _line("# count-line") and "Counting.calls" in issue.what
    model = Counting()
    with pytest.raises(UnsupportedError, match=r"Python state in forward.*Counting\.calls"):
        training_model(model, sgd(model), F.cross_entropy, CPU)(X, Y)
    assert model.calls == 0  # the capture left the model as it was


def test_list_appended_in_forward_is_reported_and_raised():
    issue = _issue(check(Remembering(), X), "Python state in forward")
    assert issue.source == _line("# append-line") and "history (list.append)" in issue.what
    model = Remembering()
    with pytest.raises(UnsupportedError, match=r"Remembering\.history"):
        inference_model(model, CPU)(X)
    assert model.history == []


@pytest.mark.parametrize(
    "cls, marker", [(WithNumpy, "numpy-method-line"), (NumpyFunction, "np-function-line")]
)
def test_numpy_in_forward_is_reported_and_raised(cls, marker):
    issue = _issue(check(cls(), X), "numpy on a tensor")
    assert issue.source == _line("# " + marker)
    with pytest.raises(UnsupportedError, match="numpy on a tensor"):
        inference_model(cls(), CPU)(X)


# the ways in ------------------------------------------------------------------------------
def test_float_class_labels_for_cross_entropy_say_int64_or_probabilities():
    model = mlp()
    trainer = training_model(model, sgd(model), F.cross_entropy, CPU)
    with pytest.raises(ValueError, match=r"int64 class indices.*\(5,\).*probabilities.*\(5, 3\)"):
        trainer(X, Y.float())


def test_missing_and_extra_target():
    model = mlp()
    trainer = training_model(model, sgd(model), F.cross_entropy, CPU)
    with pytest.raises(TypeError, match=r"got 1 tensor.*then the target"):
        trainer(X)
    with pytest.raises(TypeError, match=r"got 3 tensors.*at most 1 input.*pass one target"):
        trainer(X, Y, Y)


def test_backward_on_a_trainer_loss_says_the_step_already_ran():
    model = mlp()
    loss = training_model(model, sgd(model), F.cross_entropy, CPU)(X, Y)
    with pytest.raises(RuntimeError, match=r"already ran the backward.*drop loss.backward"):
        loss.backward()
    assert repr(loss).startswith("tensor(") and isinstance(loss * 2, torch.Tensor)


def test_options_where_loss_fn_goes():
    model = mlp()
    with pytest.raises(TypeError, match=r"Options where loss_fn goes.*options=Options"):
        training_model(model, sgd(model), CPU)


def test_autocast_is_refused_by_every_way_in():
    model = mlp()
    trainer = training_model(model, sgd(model), F.cross_entropy, CPU)
    compiled = compile(mlp(), CPU)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="inside torch.autocast"):
            trainer(X, Y)
        with pytest.raises(RuntimeError, match="inside torch.autocast"):
            inference_model(mlp(), CPU)(X)
        with pytest.raises(RuntimeError, match="inside torch.autocast"):
            compiled(X)


def test_bfloat16_parameters_and_inputs_are_named():
    model = mlp().bfloat16()
    report = check(model, X.bfloat16())
    whats = [i.what for i in report.issues if i.kind == "unsupported dtype"]
    assert (
        "input 0 is torch.bfloat16" in whats and "parameter '0.weight' is torch.bfloat16" in whats
    )
    with pytest.raises(TypeError, match=r"parameter '0.weight' is torch.bfloat16.*float32"):
        training_model(model, sgd(model), F.cross_entropy, CPU)(X, Y)
    with pytest.raises(TypeError, match=r"input 0 is torch.bfloat16.*x.float\(\)"):
        inference_model(mlp(), CPU)(X.bfloat16())


def test_nothing_to_train_raises_like_eager_backward():
    model = mlp()
    model.requires_grad_(False)
    with pytest.raises(RuntimeError, match="does not require grad"):
        F.cross_entropy(model(X), Y).backward()  # eager
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    with pytest.raises(RuntimeError, match=r"no parameter of Sequential.*requires grad"):
        trainer(X, Y)


def test_compile_of_a_class_leaves_the_class_alone():
    Compiled = compile(nn.Linear, CPU)
    assert Compiled is not nn.Linear and issubclass(Compiled, nn.Linear)
    plain = nn.Linear(4, 3)
    assert "forward" not in vars(plain)  # a later plain instance is plain
    torch.manual_seed(0)
    sim = Compiled(4, 3)
    assert torch.equal(sim(X), F.linear(X, sim.weight, sim.bias))
    model = nn.Sequential(plain)  # trains as usual (it once failed: "input 0 is a _Proxy")
    loss = training_model(model, sgd(model), F.cross_entropy, CPU)(X, Y)
    assert torch.isfinite(loss)


def test_compile_decorator_gives_a_subclass():
    @popxl_fx.compile
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x)

    net = Net()
    assert type(net).__name__ == "Net" and torch.equal(net(X), net.fc(X))
    assert Net.__mro__[1].__init__ is not Net.__init__  # the user's class is the base
