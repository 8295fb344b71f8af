"""Bad input to popxl_fx's ways in (issue 6, "Bad input"), beyond tests/test_fx_train_api.py:
the unsupported-op error raised by training_model with a loss_fn in full (op, fx node, the
user's module path and class, source line, what is missing); integer and other-precision
inputs to compile and inference_model; targets of the wrong shape for class losses; optimizer
options not reproduced in any param group; in-place updates of a parameter; and a failed
compile leaving the model, its plain tensor attributes, its mode, the optimizer and torch's RNG
as they were."""

import copy

import pytest
import torch
from torch import nn

from popxl_fx import Options, check, compile, inference_model, training_model
from popxl_fx.errors import UnsupportedError
from popxl_fx.optim import UnsupportedOptimizerError

CPU = Options(device="cpu")


def _line(text: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return torch.special.bessel_j0(self.fc(x))  # bessel-line


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x):
        return self.block(x)


def test_unsupported_op_error_names_op_node_module_line_and_why():
    model = Net()
    trainer = training_model(model, sgd(model), nn.MSELoss(), CPU)
    with pytest.raises(UnsupportedError) as info:
        trainer(torch.randn(5, 8), torch.randn(5, 4))
    (issue,) = info.value.issues
    assert issue.what == "torch.special.bessel_j0" and issue.kind == "unsupported op"
    assert issue.node == "special_bessel_j0" and issue.module_path == "block"  # the user's
    assert issue.source == _line("# bessel-line")
    assert "aten.special_bessel_j0" in issue.hint  # what its decomposition lacks
    text = str(info.value)
    for part in ("Net cannot", "torch.special.bessel_j0", "fx node", "module 'block'"):
        assert part in text


@pytest.mark.parametrize("way", ["compile", "inference_model"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_inputs_of_another_dtype_raise_naming_the_input(way, dtype):
    model = mlp()
    run = compile(model, CPU) if way == "compile" else inference_model(model, CPU)
    with pytest.raises(TypeError, match=rf"input 0 of Sequential has dtype {dtype}.*float32"):
        run(torch.ones(5, 8, dtype=dtype))


def test_float64_input_to_training_model_raises():
    model = mlp()
    trainer = training_model(model, sgd(model), nn.MSELoss(), CPU)
    with pytest.raises(TypeError, match=r"input 0 of Sequential has dtype torch.float64"):
        trainer(torch.ones(5, 8, dtype=torch.float64), torch.zeros(5, 4))


@pytest.mark.parametrize(
    "target, needs",
    [
        (torch.zeros(6, dtype=torch.long), r"\(5,\)"),  # class indices, wrong batch
        (torch.zeros(5, 1, dtype=torch.long), r"\(5,\)"),  # an extra dim
        (torch.zeros(5, 3), r"\(5, 4\)"),  # class probabilities, wrong number of classes
    ],
    ids=["indices_batch", "indices_extra_dim", "probabilities_classes"],
)
def test_class_loss_target_of_the_wrong_shape(target, needs):
    model = mlp()
    trainer = training_model(model, sgd(model), nn.CrossEntropyLoss(), CPU)
    with pytest.raises(ValueError, match=rf"target has shape .*needs a target of shape {needs}"):
        trainer(torch.randn(5, 8), target)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda m: torch.optim.Adam(m.parameters(), differentiable=True), "differentiable=True"),
        (
            lambda m: torch.optim.AdamW(
                [{"params": m[0].parameters()}, {"params": m[2].parameters(), "amsgrad": True}]
            ),
            "param group 1: amsgrad=True",
        ),
    ],
    ids=["differentiable", "amsgrad_in_second_group"],
)
def test_optimizer_options_not_reproduced_raise(make, match):
    model = mlp()
    with pytest.raises(UnsupportedOptimizerError, match=match):
        training_model(model, make(model), nn.MSELoss(), CPU)


class EditsParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4), requires_grad=False)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        self.scale.mul_(0.5)  # param-line
        return self.fc(x) * self.scale


def test_in_place_update_of_a_parameter_is_reported():
    (issue,) = check(EditsParameter(), torch.randn(2, 8)).issues
    assert issue.kind == "hidden state" and issue.source == _line("# param-line")
    assert "parameter 'scale'" in issue.what


class Counting(nn.Module):
    """Fails to compile: a plain tensor attribute updated in place (hidden state)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.bn = nn.BatchNorm1d(4)
        self.calls = torch.zeros(1)

    def forward(self, x):
        self.calls.add_(1.0)
        return self.bn(self.fc(x)) + self.calls


def _snapshot(model, opt):
    return (
        copy.deepcopy(model.state_dict()),
        model.calls.clone(),
        model.training,
        copy.deepcopy(opt.state_dict()),
        torch.get_rng_state(),
    )


@pytest.mark.parametrize("via", ["training_model", "compile"])
def test_failed_compile_leaves_model_optimizer_and_rng_untouched(via):
    model = Counting()
    opt = sgd(model)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    opt.zero_grad()
    nn.MSELoss()(model(x), y).backward()
    opt.step()  # momentum state to keep
    before = _snapshot(model, opt)
    with pytest.raises(UnsupportedError, match="plain tensor attribute 'calls'"):
        if via == "compile":
            compile(model, CPU)(x)
        else:
            training_model(model, opt, nn.MSELoss(), CPU)(x, y)
    after = _snapshot(model, opt)
    for name, value in before[0].items():
        assert torch.equal(after[0][name], value), name  # incl. BN running statistics
    assert torch.equal(after[1], before[1]) and after[2] == before[2]
    assert str(after[3]) == str(before[3])  # momentum buffers, param groups
    assert torch.equal(after[4], before[4])  # torch's RNG state
