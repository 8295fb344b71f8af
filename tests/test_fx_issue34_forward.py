"""What forward does besides its tensor work, and the ways into a trainer (issue 34): a
``print`` of text in forward is warned about with the user's line (it prints at capture only),
and a trainer without a loss_fn given a target names the missing loss_fn instead of forward's
bare argument error."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from popxl_fx import Options, check, inference_model, training_model

CPU = Options(device="cpu")


def _line(text: str) -> str:
    with open(__file__) as f:
        lines = [i for i, line in enumerate(f, 1) if text in line and "_line(" not in line]
    assert len(lines) == 1, (text, lines)
    return f"{__file__}:{lines[0]}"


class PrintsText(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        print("forward on a batch of", x.shape[0])  # text-print-line
        return self.fc(x).sum()


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


def test_print_of_text_is_reported_with_the_users_line():
    issues = [i for i in check(PrintsText(), X).issues if i.kind == "print in forward"]
    assert [i.source for i in issues] == [_line("# text-print-line")]


def test_print_of_text_warns_once_and_trains_like_eager(capsys):
    model, reference = PrintsText(), PrintsText()
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), options=CPU)
    with pytest.warns(UserWarning, match="print in forward") as record:
        first = trainer(X)
    assert _line("# text-print-line") in str(record[0].message)
    assert "forward on a batch of" in capsys.readouterr().out  # it printed, at capture
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, and nothing printed on the step
        second = trainer(X)
    assert capsys.readouterr().out == ""
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for loss in (first, second):
        opt.zero_grad()
        ref = reference(X)
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())


def test_a_target_without_a_loss_fn_names_the_missing_loss_fn():
    model = nn.Sequential(nn.Linear(4, 2))
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.1), options=CPU)
    with pytest.raises(TypeError, match=r"no loss_fn.*Sequential has no loss.*loss_fn=") as err:
        trainer(X, torch.randn(5, 2))
    assert "positional arguments but" not in str(err.value)


class LazyHooks(nn.Module):
    """HF's output capturing in small: the first call installs a forward hook (here one that
    doubles the layer's output) and sets a flag, so that later calls do not install it again."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        if not getattr(self, "_hooks_installed", False):
            self.fc.register_forward_hook(lambda module, args, out: out * 2)
            self._hooks_installed = True
        h = self.fc(x)
        return (h * h).sum()


def test_a_flag_set_once_is_not_per_step_state():
    assert check(LazyHooks(), X).ok


def test_lazily_installed_hooks_train_like_eager():
    model, reference = LazyHooks(), LazyHooks()
    trainer = training_model(model, torch.optim.SGD(model.parameters(), lr=0.01), options=CPU)
    opt = torch.optim.SGD(reference.parameters(), lr=0.01)
    for _ in range(2):
        loss = trainer(X)
        opt.zero_grad()
        ref = reference(X)
        ref.backward()
        opt.step()
        assert torch.equal(loss, ref.detach())
    assert torch.equal(model.fc.weight, reference.fc.weight)
    # the hook was installed once, as eager's first call installed it
    assert len(model.fc._forward_hooks) == len(reference.fc._forward_hooks) == 1
    assert model._hooks_installed is True


def test_hooks_on_a_leaf_module_run_as_in_eager():
    """A torch.nn module with a lowering is one node of the graph; with forward hooks (HF's
    output capturing registers them on any module) it is traced through, so its hooks run."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    model[0].register_forward_pre_hook(lambda module, args: (args[0] * 3,))
    model[0].register_forward_hook(lambda module, args, out: out - 1)
    assert torch.equal(inference_model(model, CPU)(X), model(X))
